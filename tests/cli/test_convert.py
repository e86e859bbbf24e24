"""``tlckpt convert`` between every pair of formats, bit for bit: TLSF32B, exact-bits JSON,
``.pt`` and ``.safetensors`` chains that come back to the same bytes; special values, low
precision floats, and float64 or int64 values written to TLSF32B only when exact."""

from __future__ import annotations

import collections
import itertools
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from cli_support import (
    MANIFEST,
    VECTORS_DIR,
    one_line_rejection,
    refused,
    run,
    run_ok,
)
from safetensors import safe_open

import tlckpt
from tlckpt.cli.convert import ORDER_KEY
from tlckpt.testing.bitwise import same


def _words(path: Path) -> list[bytes]:
    """A state file's tensors as raw little-endian bytes with shapes (any of the formats)."""
    info = tlckpt.inspect(path)
    shapes = [t["shape"] for t in info["tensors"]]
    if info["family"] == "float32_state":
        arrays = tlckpt.read_float32_state(path, shapes)
    else:
        arrays = tlckpt.read_state_bits(path, shapes, info["format"])
    return [(a.shape, a.dtype.str, a.tobytes()) for a in arrays]


def test_convert_tlsf32_round_trips_byte_for_byte(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    for vector in MANIFEST["float32_state"]:
        src = VECTORS_DIR / vector["file"]
        chain = [
            src,
            tmp_path / "a.safetensors",
            tmp_path / "b.json",
            tmp_path / "c.tlsf32",
            tmp_path / "d.json",
            tmp_path / "e.safetensors",
            tmp_path / "f.tlsf32",
        ]
        for a, b in itertools.pairwise(chain):
            out = run_ok(capsys, "convert", a, b)
            assert out.count("\n") == 1 and "exact" in out
        assert (tmp_path / "c.tlsf32").read_bytes() == src.read_bytes()
        assert (tmp_path / "f.tlsf32").read_bytes() == src.read_bytes()
        assert _words(tmp_path / "d.json") == _words(tmp_path / "b.json")


@pytest.mark.parametrize(
    "vector", MANIFEST["state_bits"], ids=[e["file"] for e in MANIFEST["state_bits"]]
)
def test_convert_json_round_trips_bit_exact(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, vector: dict
) -> None:
    src = VECTORS_DIR / vector["file"]
    original = _words(src)
    targets = (
        [".pt"] if vector["encoding"] in ("complex128", "complex32") else [".safetensors", ".pt"]
    )
    for ext in targets:
        mid, back = tmp_path / f"mid{ext}", tmp_path / f"back{ext}.json"
        assert run(capsys, "convert", src, mid)[0] == 0
        run_ok(capsys, "convert", mid, back, "--compact")
        assert tlckpt.inspect(back)["format"] == vector["format"]
        assert _words(back) == original
    # TLSF32B holds float32: exact for narrower floats, refused (exit 1) where a value would round.
    code, _, err = run(capsys, "convert", src, tmp_path / "state.tlsf32")
    if code == 0:
        back = tmp_path / "again.json"
        assert (
            run(capsys, "convert", tmp_path / "state.tlsf32", back, "--dtype", vector["encoding"])[
                0
            ]
            == 0
        )
        assert _words(back) == original
    else:
        assert code == 1 and vector["encoding"] in ("float64", "complex64", "complex128")
        one_line_rejection(err, "ConfigError")
        assert not (tmp_path / "state.tlsf32").exists()


def _state_dict() -> collections.OrderedDict[str, torch.Tensor]:
    """Names out of sorted order, special values, an int64 buffer, a scalar, a zero-size."""
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(4, 3, generator=g)
    weight[0, 0] = float("nan")
    weight[0, 1] = -0.0
    weight[0, 2] = float("-inf")
    weight[1, 0] = 1e-45  # subnormal
    nan_payload = torch.tensor([0x7FC12345], dtype=torch.int32).view(torch.float32)
    return collections.OrderedDict(
        [
            ("z.weight", weight),
            ("a.bias", torch.cat([torch.randn(2, generator=g), nan_payload])),
            ("m.running_mean", torch.zeros(())),
            ("m.num_batches_tracked", torch.tensor(12345, dtype=torch.int64)),
            ("empty", torch.zeros(2, 0)),
        ]
    )


def test_convert_pt_to_each_format(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    state = _state_dict()
    torch.save(state, tmp_path / "model.pt")
    names = list(state)

    # .pt → .safetensors keeps names and order (in __metadata__), dtypes and every bit.
    assert run(capsys, "convert", tmp_path / "model.pt", tmp_path / "model.safetensors")[0] == 0
    with safe_open(tmp_path / "model.safetensors", framework="pt") as f:
        assert json.loads(f.metadata()[ORDER_KEY]) == names
    assert run(capsys, "convert", tmp_path / "model.safetensors", tmp_path / "back.pt")[0] == 0
    back = torch.load(tmp_path / "back.pt", weights_only=True)
    assert list(back) == names
    assert all(same(state[k], back[k]) for k in names)

    # .pt → .tlsf32 and → .json: positional, the int64 buffer as an exact float32.
    for ext in (".tlsf32", ".json"):
        code, out, _ = run(capsys, "convert", tmp_path / "model.pt", tmp_path / f"model{ext}")
        assert code == 0 and "names dropped" in out
        arrays = (
            tlckpt.read_float32_state(tmp_path / "model.tlsf32", [t.shape for t in state.values()])
            if ext == ".tlsf32"
            else tlckpt.read_state_bits(
                tmp_path / "model.json", [t.shape for t in state.values()], "float32"
            )
        )
        for t, a in zip(state.values(), arrays):
            expected = t.float() if t.dtype == torch.int64 else t
            assert same(expected, torch.from_numpy(a))

    # Back to named: positions as names, or the names of a reference file.
    assert run(capsys, "convert", tmp_path / "model.tlsf32", tmp_path / "pos.pt")[0] == 0
    assert list(torch.load(tmp_path / "pos.pt", weights_only=True)) == ["0", "1", "2", "3", "4"]
    code, out, _ = run(
        capsys,
        "convert",
        tmp_path / "model.json",
        tmp_path / "named.safetensors",
        "--names-from",
        tmp_path / "model.pt",
    )
    assert code == 0 and "names taken from" in out
    with safe_open(tmp_path / "named.safetensors", framework="pt") as f:
        assert json.loads(f.metadata()[ORDER_KEY]) == names
        assert f.get_tensor("m.num_batches_tracked").item() == 12345.0


def test_convert_bfloat16_and_float8_through_pt(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    words = torch.arange(256, dtype=torch.uint8)
    state = {
        "bf16": torch.arange(-(2**15), 2**15, 97, dtype=torch.int32)
        .to(torch.int16)
        .view(torch.bfloat16),
        "e4m3": words.view(torch.float8_e4m3fn),
    }
    torch.save(state, tmp_path / "low.pt")
    for name, t in state.items():
        torch.save({name: t}, tmp_path / f"{name}.pt")
        assert run(capsys, "convert", tmp_path / f"{name}.pt", tmp_path / f"{name}.json")[0] == 0
        assert (
            run(capsys, "convert", tmp_path / f"{name}.json", tmp_path / f"{name}.safetensors")[0]
            == 0
        )
        assert (
            run(capsys, "convert", tmp_path / f"{name}.safetensors", tmp_path / f"{name}.back.pt")[
                0
            ]
            == 0
        )
        back = torch.load(tmp_path / f"{name}.back.pt", weights_only=True)["0"]
        assert same(t, back)
    # Mixed floating dtypes need --dtype for one JSON file; float8 NaN words are no bfloat16.
    code, _, err = run(capsys, "convert", tmp_path / "low.pt", tmp_path / "low.json")
    assert code == 1 and "--dtype" in err
    one_line_rejection(err, "ConfigError")


@pytest.mark.parametrize(
    ("values", "ok"),
    [([0.5, -0.0, 3.0, float("inf"), 2.0**-149], True), ([0.1], False), ([2.0**-150], False)],
)
def test_convert_float64_into_tlsf32_only_when_exact(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, values: list[float], ok: bool
) -> None:
    torch.save({"w": torch.tensor(values, dtype=torch.float64)}, tmp_path / "f64.pt")
    (tmp_path / "out.tlsf32").write_bytes(b"old")
    code, _, err = run(capsys, "convert", tmp_path / "f64.pt", tmp_path / "out.tlsf32")
    if ok:
        assert code == 0
        [got] = tlckpt.read_float32_state(tmp_path / "out.tlsf32", [(len(values),)])
        assert got.tobytes() == np.array(values, dtype=np.float32).tobytes()  # -0.0 kept
    else:
        assert code == 1
        one_line_rejection(err, "ConfigError")
        assert "'w'" in err and "cannot hold exactly" in err
        assert (tmp_path / "out.tlsf32").read_bytes() == b"old"  # untouched


def test_convert_int64_out_of_float32_range_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    torch.save({"n": torch.tensor([2**24 + 1])}, tmp_path / "n.pt")
    refused(capsys, "ConfigError", "convert", tmp_path / "n.pt", tmp_path / "n.tlsf32")


def test_convert_to_overrides_the_extension(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, _, _ = run(
        capsys,
        "convert",
        VECTORS_DIR / "state_basic.tlsf32",
        tmp_path / "state.bin",
        "--to",
        "json",
    )
    assert code == 0
    assert tlckpt.inspect(tmp_path / "state.bin")["format"] == "torchlean_state_float32_bits_v1"


def test_numpy_is_enough_for_tlsf32_and_json(tmp_path: Path) -> None:
    """TLSF32B ↔ float32 JSON conversion does not touch torch (the codec's promise)."""
    from tlckpt.cli.convert import read_state, write_state

    state = read_state(VECTORS_DIR / "state_basic.tlsf32", "tlsf32")
    assert all(isinstance(t.array, np.ndarray) for t in state.tensors)
    assert write_state(state, tmp_path / "s.json", "json") == "float32"
