"""save_tensors/load_tensors against safetensors.torch, save_state/load_state, and
open_checkpoint's lazy reads."""

from __future__ import annotations

import math
import os
from collections import OrderedDict, deque
from pathlib import Path

import pytest
import torch

import tlckpt
from tlckpt import CheckpointError, MalformedError, SchemaMismatchError, TruncatedError
from tlckpt.formats.safetensors import DTYPES

st = pytest.importorskip("safetensors.torch")

DTYPES_TORCH = [getattr(torch, d.torch) for d in DTYPES if d.torch and hasattr(torch, d.torch)]


def _bits(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _random(dtype: torch.dtype, shape: tuple, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    width = torch.empty(0, dtype=dtype).element_size()
    raw = torch.randint(0, 256, (math.prod(shape) * width,), dtype=torch.uint8, generator=g)
    if dtype == torch.bool:
        raw = raw % 2
    return raw.view(dtype).reshape(shape)


def _words(words: list[int], dtype: torch.dtype) -> torch.Tensor:
    return torch.tensor(words, dtype=torch.int32).to(torch.int16).view(dtype)


def _special_floats() -> dict[str, torch.Tensor]:
    nan_payload = torch.tensor([0x7FC00001, 0xFFA00000, 1, 0x80000001], dtype=torch.int64)
    return {
        "f32": nan_payload.to(torch.int32).view(torch.float32),  # NaN payloads, subnormals
        "f64": torch.tensor([5e-324, -0.0, float("nan"), float("-inf")], dtype=torch.float64),
        "bf16": _words([0x7FC1, 0x0001, 0x8000, 0xFF81], torch.bfloat16),
        "f16": _words([0x7E01, 0x0001, 0x83FF], torch.float16),
    }


@pytest.mark.parametrize("dtype", DTYPES_TORCH, ids=str)
def test_save_tensors_bytes_equal_save_file(tmp_path, dtype: torch.dtype) -> None:
    shapes = {"rank0": (), "empty": (0, 3), "rank4": (2, 1, 3, 2), 'q"\\é ✓': (4,)}
    if dtype == getattr(torch, "float4_e2m1fn_x2", None):
        shapes.pop("rank0")
    tensors = {name: _random(dtype, shape, i) for i, (name, shape) in enumerate(shapes.items())}
    ours, ref = tmp_path / "ours.safetensors", tmp_path / "ref.safetensors"
    tlckpt.save_tensors(tensors, ours, metadata={"format": "pt"})
    st.save_file(tensors, ref, metadata={"format": "pt"})
    assert ours.read_bytes() == ref.read_bytes()
    loaded = tlckpt.load_tensors(ref)
    assert list(loaded) == list(st.load_file(ref))
    for name, t in tensors.items():
        assert loaded[name].dtype == dtype and loaded[name].shape == t.shape
        assert _bits(loaded[name]) == _bits(t)


def test_reference_files_read_exactly_nan_payloads_and_subnormals(tmp_path) -> None:
    path = tmp_path / "special.safetensors"
    tensors = _special_floats()
    st.save_file(tensors, path)
    loaded = tlckpt.load_tensors(path)
    assert {k: _bits(v) for k, v in loaded.items()} == {k: _bits(v) for k, v in tensors.items()}
    assert tlckpt.read_metadata(path) == {}


def test_save_tensors_refuses_before_writing(tmp_path) -> None:
    path = tmp_path / "x.safetensors"
    path.write_bytes(b"old")
    for bad in (
        {"a": torch.zeros(2), "b": [1, 2]},
        {"a": torch.zeros(2, dtype=torch.complex128)},
        {"a": torch.zeros(2).to_sparse()},
    ):
        with pytest.raises(CheckpointError):
            tlckpt.save_tensors(bad, path)
    with pytest.raises(CheckpointError):
        tlckpt.save_tensors({"a": torch.zeros(2)}, path, metadata={"k": 3})
    assert path.read_bytes() == b"old"


# ---------------------------------------------------------------- state trees


def test_state_trees_round_trip_exactly(tmp_path) -> None:
    path = tmp_path / "state.safetensors"
    w = torch.randn(3, 4).to(torch.bfloat16)
    tree = {
        "model": {"w": w, "w_again": w, "steps": torch.tensor(7)},
        "opt": [{"momentum": torch.randn(3), "lr": 0.1}, None],
        "inf": float("-inf"),
        "nan": float("nan"),
        "big": 2**80,
        "betas": (0.9, 0.999),
        "by_int": {1: "a", (2, 3): "b"},
        "ordered": OrderedDict(b=1, a=2),
        "window": deque([1.5, torch.ones(2)], maxlen=4),
        "text": "ünï\n",
    }
    tlckpt.save_state(tree, path)
    back = tlckpt.load_state(path)
    assert list(back) == list(tree)
    assert back["model"]["w"] is back["model"]["w_again"]
    assert _bits(back["model"]["w"]) == _bits(w) and back["model"]["w"].dtype == torch.bfloat16
    assert torch.equal(back["opt"][0]["momentum"], tree["opt"][0]["momentum"])
    assert back["opt"][0]["lr"] == 0.1 and back["opt"][1] is None
    assert back["inf"] == float("-inf") and math.isnan(back["nan"]) and back["big"] == 2**80
    assert back["betas"] == (0.9, 0.999) and type(back["betas"]) is tuple
    assert back["by_int"] == {1: "a", (2, 3): "b"}
    assert type(back["ordered"]) is OrderedDict and list(back["ordered"]) == ["b", "a"]
    assert type(back["window"]) is deque and back["window"].maxlen == 4
    assert torch.equal(back["window"][1], torch.ones(2))
    # Any safetensors reader opens its tensors.
    plain = st.load_file(path)
    assert _bits(plain["model.w"]) == _bits(w)


def test_state_tree_values_refused_with_their_path_before_writing(tmp_path) -> None:
    path = tmp_path / "state.safetensors"
    path.write_bytes(b"old")
    with pytest.raises(CheckpointError, match=r"opt\[1\]\.fn"):
        tlckpt.save_state({"ok": torch.zeros(1), "opt": [1, {"fn": print}]}, path)
    with pytest.raises(CheckpointError):
        tlckpt.save_state({torch.zeros(1): 1}, path)
    with pytest.raises(CheckpointError, match="x"):
        tlckpt.save_state({"x": torch.zeros(1, dtype=torch.complex128)}, path)
    assert path.read_bytes() == b"old"


def test_a_plain_safetensors_file_loads_as_a_flat_tree(tmp_path) -> None:
    path = tmp_path / "plain.safetensors"
    st.save_file({"a": torch.arange(3)}, path)
    assert list(tlckpt.load_state(path)) == ["a"]


@pytest.mark.parametrize(
    "document",
    [
        "not json",
        '{"version": 2, "tensors": ["a"], "tree": {}}',
        '{"version": 1, "tensors": ["b"], "tree": {}}',
        '{"version": 1, "tensors": ["a", "a"], "tree": {}}',
        '{"version": 1, "tensors": ["a"], "tree": {"x": {"$tensor": ["file_tensor", 5]}}}',
        '{"version": 1, "tensors": ["a"], "tree": {"x": {"$tensor": ["file_tensor", -1]}}}',
        '{"version": 1, "tensors": ["a"], "tree": {"x": {"$pickle": "gASV"}}}',
        '{"version": 1, "tensors": ["a"], "tree": {"x": {"$tensor": ["float32", 1.0]}}}',
        '{"version": 1, "tensors": ["a"], "tree": {"$set": [{"$tensor": ["file_tensor", 0]}]}}',
        '{"version": 1, "tensors": ["a"], "tree": {"$dict": [[{"$tensor": ["file_tensor", 0]},'
        " 1]]}}",
        '{"version": 1, "version": 1, "tensors": ["a"], "tree": {}}',
        '{"version": 1, "tensors": ["a"], "tree": {}, "extra": 1}',
        '{"version": 1, "tensors": ["a"], "tree": ' + "[" * 3000 + "]" * 3000 + "}",
    ],
)
def test_hostile_state_documents_are_refused(tmp_path, document: str) -> None:
    path = tmp_path / "s.safetensors"
    st.save_file({"a": torch.zeros(2)}, path, metadata={"tlckpt.state": document})
    with pytest.raises(CheckpointError):
        tlckpt.load_state(path)


# ---------------------------------------------------------------- lazy reading


def _rchar() -> int:
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("rchar"))


@pytest.mark.skipif(not os.path.exists("/proc/self/io"), reason="needs /proc/self/io")
def test_open_checkpoint_reads_only_the_header_until_a_tensor_is_asked(tmp_path) -> None:
    path = tmp_path / "big.safetensors"
    tensors = {f"layer{i}": torch.full((1024, 1024), float(i)) for i in range(64)}  # 256 MiB
    tlckpt.save_tensors(tensors, path, metadata={"note": "x"})
    del tensors
    assert path.stat().st_size > 256 << 20
    before = _rchar()
    with tlckpt.open_checkpoint(path) as f:
        names = f.names()
        shapes = {n: f.shape(n) for n in names}
        dtypes = {n: f.dtype(n) for n in names}
        metadata = f.metadata
        header_only = _rchar() - before
        one = f.tensor("layer5")
        after_one = _rchar() - before
    assert header_only <= 1 << 20, header_only
    assert after_one - header_only <= (4 << 20) + (1 << 20)
    assert len(names) == 64 and shapes["layer3"] == (1024, 1024)
    assert dtypes["layer3"] == torch.float32 and metadata == {"note": "x"}
    assert torch.equal(one, torch.full((1024, 1024), 5.0))


def test_open_checkpoint_reads_every_family(tmp_path) -> None:
    model = torch.nn.Linear(3, 2)
    for name in ("m.tlsf32", "m.json", "m.safetensors"):
        tlckpt.save_module_state(model, tmp_path / name)
        with tlckpt.open_checkpoint(tmp_path / name) as f:
            assert f.family == {"m.tlsf32": "float32_state", "m.json": "state_bits"}.get(
                name, "safetensors"
            )
            names = f.names()
            first, second = ("weight", "bias") if "weight" in names else names
            assert f.shape(first) == (2, 3) and f.dtype(second) == torch.float32
            assert _bits(f.tensor(first)) == _bits(model.weight.detach())
            assert _bits(f.tensor(second)) == _bits(model.bias.detach())
            with pytest.raises(SchemaMismatchError):
                f.tensor("nope")


def test_open_checkpoint_refuses_other_families(tmp_path: Path) -> None:
    path = tmp_path / "junk.bin"
    path.write_bytes(b"\x00not a checkpoint")
    with pytest.raises(CheckpointError):
        tlckpt.open_checkpoint(path)
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{}")
    with pytest.raises(TruncatedError):
        tlckpt.open_checkpoint(bad)
    bad.write_bytes(b"\x07\x00\x00\x00\x00\x00\x00\x00" + b'{"a":1}')
    with pytest.raises(MalformedError):
        tlckpt.open_checkpoint(bad)
