"""``save_module_state`` / ``load_module_state`` (TLSF32B): in-place, two-pass, all or nothing."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tlckpt.codec import (
    CheckpointError,
    ConfigError,
    SchemaMismatchError,
    TruncatedError,
    read_float32_state,
    write_float32_state,
)
from tlckpt.codec.errors import ERROR_OF_CATEGORY
from tlckpt.runtime import load_module_state, save_module_state
from tlckpt.testing.bitwise import module_unchanged, same, snapshot_module
from tlckpt.testing.models import TiedNet


@pytest.fixture(params=[True, False], ids=["staged", "in-place"])
def staged(request: pytest.FixtureRequest) -> bool:
    """Both load modes: staged (the default) and in place (``staged=False``)."""
    return request.param


def _trained_net(seed: int = 0) -> TiedNet:
    torch.manual_seed(seed)
    model = TiedNet()
    model.train()
    for _ in range(2):  # BatchNorm running stats and num_batches_tracked move away from init
        model(torch.randint(0, 7, (6,)))
    return model


def test_round_trip_in_place(tmp_path: Path, staged: bool):
    source = _trained_net(0)
    save_module_state(source, tmp_path / "m.tlsf32")
    dest = _trained_net(5)
    tensors_before = {name: t for name, t in dest.state_dict(keep_vars=True).items()}
    pointers = {name: t.data_ptr() for name, t in tensors_before.items()}
    load_module_state(dest, tmp_path / "m.tlsf32", staged=staged)
    for (name, a), (_, b) in zip(source.state_dict().items(), dest.state_dict().items()):
        assert same(a, b), name
    after = dest.state_dict(keep_vars=True)
    for name, t in after.items():
        assert t is tensors_before[name] and t.data_ptr() == pointers[name]
    assert dest.head.weight is dest.emb.weight
    assert dest.norm.num_batches_tracked.dtype == torch.int64
    assert dest.norm.num_batches_tracked.item() == 2


def test_loads_bump_the_autograd_version(tmp_path: Path, staged: bool):
    source = _trained_net(0)
    save_module_state(source, tmp_path / "m")
    dest = _trained_net(1)
    version = dest.mix.weight._version
    load_module_state(dest, tmp_path / "m", staged=staged)
    assert dest.mix.weight._version > version


def test_inference_tensors_are_loaded(tmp_path: Path, staged: bool):
    """Tensors made under ``torch.inference_mode`` accept in-place writes only there."""
    src = {"w": torch.randn(3, 4), "count": torch.tensor(5)}
    save_module_state(src, tmp_path / "m")
    with torch.inference_mode():
        dest = {"w": torch.zeros(3, 4), "count": torch.tensor(0)}
    load_module_state(dest, tmp_path / "m", staged=staged)
    assert same(dest["w"], src["w"]) and dest["count"].item() == 5


def test_codec_reads_what_the_runtime_wrote(tmp_path: Path):
    model = _trained_net(0)
    save_module_state(model, tmp_path / "m")
    state = model.state_dict()
    arrays = read_float32_state(tmp_path / "m", [tuple(t.shape) for t in state.values()])
    for (name, t), array in zip(state.items(), arrays):
        expected = t.to(torch.float32).numpy()
        assert array.shape == expected.shape, name
        assert np.array_equal(array.view(np.uint32), expected.view(np.uint32)), name


def test_sequence_of_tensors_strided_and_scalar(tmp_path: Path, staged: bool):
    src = [torch.randn(3, 4), torch.randn(4, 3).t(), torch.tensor(2.5), torch.zeros(2, 0)]
    save_module_state(src, tmp_path / "s")
    dest = [torch.zeros(3, 4), torch.zeros(4, 3).t(), torch.tensor(0.0), torch.ones(2, 0)]
    assert not dest[1].is_contiguous()
    load_module_state(dest, tmp_path / "s", staged=staged)
    assert all(same(a, b) for a, b in zip(src, dest))


def test_nan_payloads_and_negative_zero_survive(tmp_path: Path, staged: bool):
    words = np.array([0x7FC00001, 0xFFFFFFFF, 0x80000000, 0x00000001, 0x7F800000], np.uint32)
    src = [torch.from_numpy(words.view(np.float32).copy())]
    save_module_state(src, tmp_path / "n")
    dest = [torch.zeros(5)]
    load_module_state(dest, tmp_path / "n", staged=staged)
    assert np.array_equal(dest[0].numpy().view(np.uint32), words)


def test_file_objects_at_an_offset(staged: bool):
    model = _trained_net(0)
    buffer = io.BytesIO()
    buffer.write(b"prefix")
    save_module_state(model, buffer)
    buffer.seek(6)
    dest = _trained_net(3)
    load_module_state(dest, buffer, staged=staged)
    assert all(same(a, b) for a, b in zip(model.state_dict().values(), dest.state_dict().values()))


def test_float64_model_is_refused_for_tlsf32b(tmp_path: Path):
    model = TiedNet(torch.float64)
    with pytest.raises(ConfigError, match="save_state_bits"):
        save_module_state(model, tmp_path / "m")
    assert not (tmp_path / "m").exists()
    save_module_state(TiedNet(), tmp_path / "m")
    snapshot = snapshot_module(model)
    with pytest.raises(ConfigError):
        load_module_state(model, tmp_path / "m")
    assert module_unchanged(model, snapshot)


def test_mixed_floating_dtypes_are_named(tmp_path: Path):
    tensors = {"a": torch.zeros(2), "b": torch.zeros(2, dtype=torch.float16)}
    with pytest.raises(ConfigError, match=r"'a' is float32.*'b' is float16"):
        save_module_state(tensors, tmp_path / "m")


def test_integer_buffer_must_be_exact_in_float32(tmp_path: Path):
    ok = {"w": torch.randn(3), "count": torch.tensor(2**24, dtype=torch.int64)}
    save_module_state(ok, tmp_path / "ok")
    bad = {"w": torch.randn(3), "count": torch.tensor(2**24 + 1, dtype=torch.int64)}
    with pytest.raises(ConfigError, match="'count'"):
        save_module_state(bad, tmp_path / "bad")
    assert not (tmp_path / "bad").exists()
    big = {"count": torch.tensor(2**63 - 1, dtype=torch.int64)}
    with pytest.raises(ConfigError, match="'count'"):
        save_module_state(big, tmp_path / "bad")


@pytest.mark.parametrize("value", [2.5, -0.5, float("nan"), float("inf"), 2.0**63, -(2.0**64)])
def test_inexact_file_value_for_integer_buffer_changes_nothing(
    tmp_path: Path, value: float, staged: bool
):
    # The float tensors come first: a one-pass load would have overwritten them already.
    write_float32_state(tmp_path / "f", [np.full(3, 7.0, np.float32), np.array(value, np.float32)])
    dest = {"w": torch.randn(3), "count": torch.tensor(4, dtype=torch.int64)}
    snapshot = snapshot_module(list(dest.values()))
    with pytest.raises(CheckpointError, match="'count'"):
        load_module_state(dest, tmp_path / "f", staged=staged)
    assert module_unchanged(list(dest.values()), snapshot)


def test_bool_and_uint8_buffers(tmp_path: Path, staged: bool):
    src = {"mask": torch.tensor([True, False]), "u": torch.tensor([0, 255], dtype=torch.uint8)}
    save_module_state(src, tmp_path / "b")
    dest = {"mask": torch.tensor([False, True]), "u": torch.tensor([1, 1], dtype=torch.uint8)}
    load_module_state(dest, tmp_path / "b", staged=staged)
    assert same(dest["mask"], src["mask"]) and same(dest["u"], src["u"])
    write_float32_state(
        tmp_path / "b2", [np.array([1.0, 2.0], np.float32), np.zeros(2, np.float32)]
    )
    with pytest.raises(CheckpointError, match="'mask'"):
        load_module_state(dest, tmp_path / "b2", staged=staged)


def test_non_tensor_state_entry_is_refused(tmp_path: Path):
    class WithExtra(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(2))

        def get_extra_state(self) -> Any:
            return {"note": "hi"}

        def set_extra_state(self, state: Any) -> None:
            pass

    with pytest.raises(CheckpointError, match="_extra_state"):
        save_module_state(WithExtra(), tmp_path / "x")


@pytest.mark.vectors("float32_state")
def test_valid_vectors_load(vector: dict, vectors_dir: Path, staged: bool):
    dest = [torch.full(tuple(s), -3.0) for s in vector["shapes"]]
    load_module_state(dest, vectors_dir / vector["file"], staged=staged)
    for t, payload in zip(dest, vector["payloads"]):
        assert t.numpy().tobytes() == bytes.fromhex(payload)


@pytest.mark.vectors("invalid", kind="float32_state")
def test_invalid_vectors_change_nothing(vector: dict, vectors_dir: Path, staged: bool):
    torch.manual_seed(0)
    dest = [torch.randn(tuple(s)) for s in vector["shapes"]]
    snapshot = snapshot_module(dest)
    with pytest.raises(ERROR_OF_CATEGORY[vector["category"]]):
        load_module_state(dest, vectors_dir / vector["file"], staged=staged)
    assert module_unchanged(dest, snapshot)


def test_mutated_files_change_nothing_or_load_what_the_codec_reads(record_property, staged: bool):
    """Every truncation and a byte flip at every position of a real saved file."""
    model = _trained_net(0)
    stream = io.BytesIO()
    save_module_state(model, stream)
    data = stream.getvalue()
    shapes = [tuple(t.shape) for t in model.state_dict().values()]
    dest = _trained_net(9)
    snapshot = snapshot_module(dest)
    mutants = [data[:n] for n in range(len(data))]
    mutants += [
        data[:i] + bytes([data[i] ^ mask]) + data[i + 1 :]
        for i in range(len(data))
        for mask in (0x01, 0x80)
    ]
    mutants += [data + b"\0", data + data]
    rejected = 0
    for mutant in mutants:
        try:
            load_module_state(dest, io.BytesIO(mutant), staged=staged)
        except CheckpointError:
            rejected += 1
            assert module_unchanged(dest, snapshot)
            continue
        # Accepted (a flipped payload bit): the model holds exactly what the codec reads.
        arrays = read_float32_state(io.BytesIO(mutant), shapes)
        for t, array in zip(dest.state_dict().values(), arrays):
            assert same(t.to(torch.float32), torch.from_numpy(array)) or (
                t.dtype == torch.int64 and t.item() == array.item()
            )
        load_module_state(dest, io.BytesIO(b"".join([_saved(snapshot)])))
        assert module_unchanged(dest, snapshot)
    assert rejected >= len(data) + 2  # every truncation and both extensions at least
    record_property("mutants", len(mutants))


def _saved(tensors: list[torch.Tensor]) -> bytes:
    stream = io.BytesIO()
    save_module_state(tensors, stream)
    return stream.getvalue()


def test_truncated_error_carries_offset(tmp_path: Path, staged: bool):
    save_module_state([torch.zeros(4)], tmp_path / "t")
    data = (tmp_path / "t").read_bytes()
    with pytest.raises(TruncatedError) as info:
        load_module_state([torch.zeros(4)], io.BytesIO(data[:-1]), staged=staged)
    assert info.value.offset is not None


def test_tied_copies_that_disagree_change_nothing(tmp_path: Path, staged: bool):
    model = _trained_net(0)
    arrays = [t.to(torch.float32).numpy().copy() for t in model.state_dict().values()]
    names = list(model.state_dict())
    arrays[names.index("head.weight")][0, 0] += 1.0
    write_float32_state(tmp_path / "f", arrays)
    dest = _trained_net(4)
    snapshot = snapshot_module(dest)
    with pytest.raises(SchemaMismatchError, match=r"'head\.weight'.*'emb\.weight'"):
        load_module_state(dest, tmp_path / "f", staged=staged)
    assert module_unchanged(dest, snapshot)


class _TiedPair(torch.nn.Module):
    def __init__(self, n: int):
        super().__init__()
        self.a = torch.nn.Parameter(torch.zeros(n))
        self.b = self.a  # tied: in the state twice, one tensor in memory


@pytest.mark.parametrize("differ", [None, 0, -1])
def test_large_tied_copies_compared_to_the_last_byte(tmp_path: Path, staged: bool, differ):
    """Tied payloads larger than the comparison's chunks: equal ones load, and a difference
    in the first or the last element is found."""
    n = (9 << 20) // 4 + 3  # over two 4 MiB chunks, and not a multiple of one
    values = np.arange(n, dtype=np.float32)
    copy = values.copy()
    if differ is not None:
        copy[differ] += 1.0
    write_float32_state(tmp_path / "f", [values, copy])
    dest = _TiedPair(n)
    if differ is None:
        load_module_state(dest, tmp_path / "f", staged=staged)
        assert np.array_equal(dest.a.detach().numpy(), values)
        return
    with pytest.raises(SchemaMismatchError, match=r"'b'.*'a'"):
        load_module_state(dest, tmp_path / "f", staged=staged)
    assert not dest.a.detach().numpy().any()
