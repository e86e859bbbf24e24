"""``save_state_bits`` / ``load_state_bits``: every dtype torch has a format for round-trips
bit for bit (NaN payloads, -0.0, subnormals); the encoding follows the model's dtype; a bad
file changes nothing."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch

from tlckpt.codec import CheckpointError, ConfigError, read_state_bits, write_state_bits
from tlckpt.codec.errors import ERROR_OF_CATEGORY
from tlckpt.runtime import load_state_bits, save_state_bits
from tlckpt.testing.bitwise import bits, module_unchanged, same, snapshot_module
from tlckpt.testing.models import TiedNet

WORD = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _every_word(dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """All 2^8 / 2^16 words of a narrow format; random words plus NaN payloads, infinities,
    zeros and subnormals for float32/float64. Complex: such words in both halves."""
    real = {torch.complex32: torch.float16, torch.complex64: torch.float32}.get(dtype)
    real = real or (torch.float64 if dtype == torch.complex128 else dtype)
    size = torch.empty((), dtype=real).element_size()
    if size <= 2:
        words = torch.arange(2 ** (8 * size), dtype=torch.int64)
        words = words.to(torch.uint8) if size == 1 else (words - 2**15).to(torch.int16)
    else:
        rng = np.random.default_rng(seed)
        special = {
            4: [0x7FC00000, 0x7FC00001, 0x7F800001, 0xFFFFFFFF, 0xFF800000, 0x80000000, 1, 0],
            8: [
                0x7FF8000000000001,
                0x7FF0000000000001,
                0xFFF8000000000000,
                1,
                0x8000000000000000,
                0x7FF0000000000000,
                0xFFFFFFFFFFFFFFFF,
                0,
            ],
        }[size]
        unsigned = np.dtype(f"<u{size}")
        random = rng.integers(0, 256, 4096 * size, dtype=np.uint8).view(unsigned)
        words = np.concatenate([np.array(special, dtype=unsigned), random])
        words = torch.from_numpy(words.view(f"<i{size}").copy())
    values = words.view(real)
    if dtype.is_complex:
        flipped = values.flip(0)
        return torch.view_as_complex(torch.stack([values, flipped], -1))
    return values


DTYPES = [
    torch.float64,
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
    torch.float8_e4m3fnuz,
    torch.float8_e5m2fnuz,
    torch.complex32,
    torch.complex64,
    torch.complex128,
]


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
@pytest.mark.parametrize("pretty", [True, False], ids=["pretty", "compact"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
def test_every_dtype_round_trips_bit_exact(tmp_path: Path, dtype: torch.dtype, pretty: bool):
    words = _every_word(dtype)
    n = words.numel() // 4 * 4
    src = {
        "matrix": words[:n].reshape(4, -1),
        "strided": words[: n // 2].reshape(-1, 2).t(),
        "scalar": words[3].clone(),
        "empty": words[:0].reshape(0, 5),
        "count": torch.tensor(3, dtype=torch.int64),  # exact in every format
    }
    save_state_bits(src, tmp_path / "s.json", pretty=pretty)
    dest = {name: torch.zeros_like(t) for name, t in src.items()}
    dest["strided"] = torch.zeros(n // 4, 2, dtype=dtype).t()
    load_state_bits(dest, tmp_path / "s.json")
    for name in src:
        assert same(dest[name], src[name]), name


def _raw(t: torch.Tensor) -> bytes:
    """The tensor's words as little-endian bytes (complex: re, im interleaved)."""
    return bits(t).contiguous().numpy().tobytes()


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
def test_codec_reads_the_storage_words(tmp_path: Path, dtype: torch.dtype):
    from tlckpt.runtime.binding.tensors import ENCODING_OF_DTYPE

    values = _every_word(dtype)[:64]
    save_state_bits([values], tmp_path / "w.json")
    [array] = read_state_bits(tmp_path / "w.json", [values.shape], ENCODING_OF_DTYPE[dtype])
    assert array.tobytes() == _raw(values)


def test_encoding_follows_the_model_dtype(tmp_path: Path):
    model = TiedNet(torch.float64)
    save_state_bits(model, tmp_path / "m.json", pretty=False)
    assert b'"torchlean_state_bits_v1"' in (tmp_path / "m.json").read_bytes()
    save_state_bits([torch.zeros(2, dtype=torch.bfloat16)], tmp_path / "b.json")
    assert b"torchlean_state_binary_8_7_127_ieee_v1" in (tmp_path / "b.json").read_bytes()
    with pytest.raises(CheckpointError, match="format"):
        load_state_bits([torch.zeros(2, dtype=torch.float16)], tmp_path / "b.json")


def test_model_round_trip_keeps_ties_and_int_buffers(tmp_path: Path):
    torch.manual_seed(0)
    source = TiedNet(torch.float16)
    source.norm.num_batches_tracked.fill_(2048)
    save_state_bits(source, tmp_path / "m.json")
    torch.manual_seed(1)
    dest = TiedNet(torch.float16)
    load_state_bits(dest, tmp_path / "m.json")
    for (name, a), b in zip(source.state_dict().items(), dest.state_dict().values()):
        assert same(a, b), name
    assert dest.head.weight is dest.emb.weight


def test_integer_buffer_not_exact_in_the_file_type(tmp_path: Path):
    model = TiedNet(torch.float16)
    model.norm.num_batches_tracked.fill_(2049)  # float16 has 11 significant bits
    with pytest.raises(ConfigError, match="num_batches_tracked"):
        save_state_bits(model, tmp_path / "m.json")
    assert not (tmp_path / "m.json").exists()


def test_inexact_file_value_for_integer_buffer_changes_nothing(tmp_path: Path):
    half = np.array([1.5], np.float16)
    write_state_bits(tmp_path / "f.json", [np.ones(2, np.float16), half.reshape(())], "float16")
    dest = {"w": torch.zeros(2, dtype=torch.float16), "n": torch.tensor(7)}
    snapshot = snapshot_module(list(dest.values()))
    with pytest.raises(CheckpointError, match="'n'"):
        load_state_bits(dest, tmp_path / "f.json")
    assert module_unchanged(list(dest.values()), snapshot)


def test_tied_copies_that_disagree_change_nothing(tmp_path: Path):
    torch.manual_seed(0)
    model = TiedNet(torch.float64)
    arrays = [t.numpy().copy() for t in model.state_dict().values()]
    arrays[list(model.state_dict()).index("head.weight")][0, 0] = 0.5
    arrays = [a.astype(np.float64) for a in arrays]
    write_state_bits(tmp_path / "t.json", arrays, "float64")
    snapshot = snapshot_module(model)
    with pytest.raises(CheckpointError, match="tied"):
        load_state_bits(model, tmp_path / "t.json")
    assert module_unchanged(model, snapshot)


def test_mixed_and_unsupported_dtypes(tmp_path: Path):
    with pytest.raises(ConfigError, match="mixes floating dtypes"):
        save_state_bits([torch.zeros(1), torch.zeros(1, dtype=torch.float64)], tmp_path / "x")
    with pytest.raises(ConfigError, match="no exact-bits format"):
        save_state_bits([torch.zeros(1).to(torch.float8_e8m0fnu)], tmp_path / "x")


def test_state_without_floating_tensors_uses_float64(tmp_path: Path):
    src = [torch.tensor([2**53, -7], dtype=torch.int64)]
    save_state_bits(src, tmp_path / "i.json")
    dest = [torch.zeros(2, dtype=torch.int64)]
    load_state_bits(dest, tmp_path / "i.json")
    assert same(dest[0], src[0])


def test_file_objects():
    stream = io.BytesIO()
    values = _every_word(torch.bfloat16)
    save_state_bits([values], stream)
    stream.seek(0)
    dest = [torch.zeros_like(values)]
    load_state_bits(dest, stream)
    assert same(dest[0], values)


_TORCH_OF_ENCODING = {
    "float64": torch.float64,
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float8_e4m3fn": torch.float8_e4m3fn,
    "float8_e5m2": torch.float8_e5m2,
    "float8_e4m3fnuz": torch.float8_e4m3fnuz,
    "float8_e5m2fnuz": torch.float8_e5m2fnuz,
    "complex32": torch.complex32,
    "complex64": torch.complex64,
    "complex128": torch.complex128,
}


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
@pytest.mark.vectors("state_bits")
def test_valid_vectors_load(vector: dict, vectors_dir: Path):
    dtype = _TORCH_OF_ENCODING[vector["encoding"]]
    dest = [torch.zeros(tuple(s), dtype=dtype) for s in vector["shapes"]]
    load_state_bits(dest, vectors_dir / vector["file"])
    for t, words in zip(dest, vector["words"]):
        width = t.element_size() // 2 if dtype.is_complex else t.element_size()
        expected = np.array(words, dtype=f"<u{width}").tobytes()  # pairs flatten to re, im
        assert _raw(t) == expected


@pytest.mark.vectors("invalid", kind="state_bits")
def test_invalid_vectors_change_nothing(vector: dict, vectors_dir: Path):
    dtype = _TORCH_OF_ENCODING[vector["encoding"]]
    torch.manual_seed(0)
    dest = [torch.randn(tuple(s)).to(dtype) for s in vector["shapes"]]
    snapshot = snapshot_module(dest)
    with pytest.raises(ERROR_OF_CATEGORY[vector["category"]]):
        load_state_bits(dest, vectors_dir / vector["file"])
    assert module_unchanged(dest, snapshot)


def test_mutated_json_changes_nothing(record_property):
    torch.manual_seed(0)
    model = TiedNet(torch.bfloat16)
    stream = io.BytesIO()
    save_state_bits(model, stream, pretty=False)
    data = stream.getvalue()
    dest = TiedNet(torch.bfloat16)
    snapshot = snapshot_module(dest)
    mutants = [data[:n] for n in range(0, len(data), 3)]
    mutants += [data[:i] + b"x" + data[i + 1 :] for i in range(0, len(data), 2)]
    mutants += [data.replace(b"[", b"{", 1), data.replace(b"]", b"]]", 1)]
    for mutant in mutants:
        try:
            load_state_bits(dest, io.BytesIO(mutant))
        except CheckpointError:
            assert module_unchanged(dest, snapshot)
        else:  # pragma: no cover - an 'x' inside a tag's string can still be valid JSON
            pytest.fail("a mutated file loaded")
    record_property("mutants", len(mutants))
