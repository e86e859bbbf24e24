"""Exact-bits JSON model state (FORMAT.md §5): vectors, round trips and caller input (the
reading rules and hostile input are in ``test_state_bits_rules.py``)."""

from __future__ import annotations

import io
import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from state_bits_support import doc, read_bytes

from tlckpt.codec.errors import (
    ERROR_OF_CATEGORY,
    CheckpointError,
    MalformedError,
)
from tlckpt.codec.model_state import state_bits_writer as state_bits_module
from tlckpt.codec.model_state.state_bits import inspect_state_bits, read_state_bits
from tlckpt.codec.model_state.state_bits_writer import write_state_bits
from tlckpt.formats.state_bits import ENCODINGS, BinaryFormat, encoding_by_name
from tlckpt.testing.vectors import vectors_dir

VECTORS = vectors_dir()


# --------------------------------------------------------------------------- helpers


def words_of(array: np.ndarray, encoding: str) -> list[Any]:
    """Storage words of an API array, as the manifest spells them (pairs for complex)."""
    fmt = encoding_by_name(encoding)
    words = np.ascontiguousarray(array).view(np.dtype(fmt.word_dtype)).reshape(-1)
    if fmt.pair:
        return words.reshape(-1, 2).tolist()
    return words.tolist()


def array_from_words(words: list[Any], shape: list[int], encoding: str) -> np.ndarray:
    """The array the API takes for these storage words."""
    fmt = encoding_by_name(encoding)
    flat = np.array(words, dtype=np.dtype(fmt.word_dtype)).reshape(-1)
    if fmt.pair and fmt.native_dtype is None:
        return flat.reshape((*shape, 2))
    return flat.view(np.dtype(fmt.array_dtype)).reshape(shape)


def json_words(document: dict[str, Any]) -> list[list[Any]]:
    return [entry["values"] for entry in document["state"]]


# --------------------------------------------------------------------------- vectors


@pytest.mark.vectors("state_bits")
def test_vector_reads_exact_words(vector: dict[str, Any]) -> None:
    path = VECTORS / vector["file"]
    arrays = read_state_bits(path, vector["shapes"], vector["encoding"])
    fmt = encoding_by_name(vector["encoding"])
    assert fmt.tag == vector["format"]
    assert len(arrays) == len(vector["shapes"])
    for array, shape, words in zip(arrays, vector["shapes"], vector["words"], strict=True):
        assert array.dtype == np.dtype(fmt.array_dtype)
        pairs = fmt.pair and fmt.native_dtype is None
        assert array.shape == ((*shape, 2) if pairs else tuple(shape))
        assert words_of(array, vector["encoding"]) == words
    # The full tag names the same encoding.
    again = read_state_bits(path, vector["shapes"], vector["format"])
    assert [words_of(a, vector["encoding"]) for a in again] == vector["words"]


@pytest.mark.vectors("state_bits")
@pytest.mark.parametrize("pretty", [True, False])
def test_vector_write_round_trip(vector: dict[str, Any], pretty: bool, tmp_path: Path) -> None:
    encoding = vector["encoding"]
    arrays = [
        array_from_words(w, s, encoding)
        for w, s in zip(vector["words"], vector["shapes"], strict=True)
    ]
    path = tmp_path / vector["file"]
    write_state_bits(path, arrays, encoding, pretty=pretty)
    document = json.loads(path.read_bytes())  # any standard reader accepts what we write
    assert document["format"] == vector["format"]
    assert [entry["shape"] for entry in document["state"]] == vector["shapes"]
    assert json_words(document) == vector["words"]
    back = read_state_bits(path, vector["shapes"], encoding)
    assert [words_of(a, encoding) for a in back] == vector["words"]


@pytest.mark.vectors("state_bits")
def test_vector_inspect(vector: dict[str, Any]) -> None:
    path = VECTORS / vector["file"]
    info = inspect_state_bits(path)
    assert info["family"] == "state_bits"
    assert info["format"] == vector["format"]
    assert info["encoding"] == vector["encoding"]
    assert info["bytes"] == path.stat().st_size
    assert [t["shape"] for t in info["tensors"]] == vector["shapes"]
    assert [t["elements"] for t in info["tensors"]] == [math.prod(s) for s in vector["shapes"]]


@pytest.mark.vectors("invalid", kind="state_bits")
def test_invalid_vector(vector: dict[str, Any]) -> None:
    error = ERROR_OF_CATEGORY[vector["category"]]
    with pytest.raises(error) as info:
        read_state_bits(VECTORS / vector["file"], vector["shapes"], vector["encoding"])
    assert type(info.value) is error, vector["note"]
    assert str(VECTORS / vector["file"]) in str(info.value)  # the message names the file


# --------------------------------------------------------------------------- round trips


def special_words(fmt: BinaryFormat) -> list[int]:
    """±0, subnormal edges, smallest normal, infinities, NaNs with payloads, extremes."""
    e, f, width = fmt.exponent_bits, fmt.fraction_bits, fmt.width
    top = ((1 << e) - 1) << f
    fraction = (1 << f) - 1
    base = {0, 1, fraction, 1 << f, top, top | 1, top | fraction, (top - (1 << f)) | fraction}
    if f:
        base |= {top | (1 << (f - 1)), top | (1 << (f - 1)) | 1}  # quiet NaN, with payload
    sign = 1 << (width - 1)
    return sorted({w | s for w in base for s in (0, sign)})


@st.composite
def tensors(draw: st.DrawFn, encoding: str) -> tuple[list[int], np.ndarray]:
    fmt = encoding_by_name(encoding)
    inner = fmt.inner if fmt.pair else fmt
    shape = draw(st.lists(st.integers(0, 3), max_size=3))
    count = math.prod(shape) * (2 if fmt.pair else 1)
    word = st.one_of(st.sampled_from(special_words(inner)), st.integers(0, (1 << fmt.width) - 1))
    words = draw(st.lists(word, min_size=count, max_size=count))
    nested = [words[k : k + 2] for k in range(0, count, 2)] if fmt.pair else words
    return shape, array_from_words(nested, shape, encoding)


@pytest.mark.parametrize("encoding", sorted(ENCODINGS))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_round_trip(encoding: str, data: st.DataObject) -> None:
    drawn = data.draw(st.lists(tensors(encoding), max_size=3))
    pretty = data.draw(st.booleans())
    by_tag = data.draw(st.booleans())
    shapes = [shape for shape, _ in drawn]
    arrays = [array for _, array in drawn]
    expected = [words_of(a, encoding) for a in arrays]

    out = io.BytesIO()
    write_state_bits(
        out, arrays, encoding_by_name(encoding).tag if by_tag else encoding, pretty=pretty
    )
    text = out.getvalue()
    document = json.loads(text)
    assert json_words(document) == expected
    assert [entry["shape"] for entry in document["state"]] == shapes

    back = read_state_bits(io.BytesIO(text), shapes, encoding)
    assert [words_of(a, encoding) for a in back] == expected
    for original, restored in zip(arrays, back, strict=True):
        assert restored.dtype == original.dtype and restored.shape == original.shape
    assert [t["shape"] for t in inspect_state_bits(io.BytesIO(text))["tensors"]] == shapes


def test_native_special_values_bit_exact() -> None:
    bits = np.array(
        [0x7FC00001, 0xFFC12345, 0x7F800001, 0x80000000, 0x00000001, 0x007FFFFF, 0xFF800000],
        dtype=np.uint32,
    )
    out = io.BytesIO()
    write_state_bits(out, [bits.view(np.float32)], "float32")
    [back] = read_bytes(out.getvalue(), [[7]])
    assert back.view(np.uint32).tolist() == bits.tolist()


def test_layouts_byte_orders_and_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(state_bits_module, "_CHUNK", 3)  # many chunks per tensor
    base = np.arange(24, dtype=np.float32).reshape(4, 6) * np.float32(-1.25)
    arrays = [base[:, ::2], base.astype(">f4"), base.T, np.float32(7.5)]
    out = io.BytesIO()
    write_state_bits(out, arrays, "float32")
    back = read_bytes(out.getvalue(), [[4, 3], [4, 6], [6, 4], []])
    for original, restored in zip(arrays, back, strict=True):
        assert np.array_equal(np.asarray(original, dtype="<f4"), restored)

    pairs = np.arange(7, dtype=np.complex64) * np.complex64(1 - 2j)
    out = io.BytesIO()
    grid = np.stack([pairs, pairs * 2]).T  # (7, 2), neither axis contiguous
    write_state_bits(
        out, [pairs, pairs.astype(">c8"), pairs[::2], grid, pairs[3]], "complex64", pretty=False
    )
    back = read_bytes(out.getvalue(), [[7], [7], [4], [7, 2], []], "complex64")
    for original, restored in zip([pairs, pairs, pairs[::2], grid, pairs[3]], back, strict=True):
        assert np.array_equal(original, restored)
    words = np.arange(10, dtype=np.uint16).reshape(5, 2)
    out = io.BytesIO()
    write_state_bits(out, [words], "complex32")
    assert json.loads(out.getvalue())["state"][0]["values"] == words.tolist()


def test_configured_format_by_tag(tmp_path: Path) -> None:
    tag = "torchlean_state_binary_3_2_3_finite_v1"  # 6-bit words in uint8
    words = np.array([0, 1, 63, 32], dtype=np.uint8)
    write_state_bits(tmp_path / "a.json", [words], tag)
    [back] = read_state_bits(tmp_path / "a.json", [(4,)], tag)
    assert back.dtype == np.uint8 and back.tolist() == words.tolist()
    info = inspect_state_bits(str(tmp_path / "a.json"))
    assert info["encoding"] is None and info["format"] == tag
    (tmp_path / "b.json").write_bytes(doc({"shape": [1], "values": [64]}, tag=tag))
    with pytest.raises(MalformedError, match="too wide"):
        read_state_bits(tmp_path / "b.json", [(1,)], tag)
    with pytest.raises(MalformedError, match="too wide"):
        inspect_state_bits(tmp_path / "b.json")


def test_reads_from_file_object_position() -> None:
    data = doc({"shape": [2], "values": [1, 2]})
    stream = io.BytesIO(b"junk" + data)
    stream.seek(4)
    [back] = read_state_bits(stream, [(2,)], "float32")
    assert back.view(np.uint32).tolist() == [1, 2]


# --------------------------------------------------------------------------- caller errors


@pytest.mark.parametrize(
    ("arrays", "encoding", "match"),
    [
        ([np.zeros(2, np.float64)], "float32", "dtype"),
        ([np.zeros(2, np.uint32)], "float32", "dtype"),
        ([np.zeros(2, np.float32), np.zeros(2, np.int32)], "float32", r"arrays\[1\]"),
        ([np.zeros(2, np.float32)], "bfloat16", "dtype"),
        ([np.zeros(2, np.int16)], "bfloat16", "dtype"),
        ([np.zeros(2, np.uint16)], "float8_e4m3fn", "dtype"),
        ([np.zeros(2, np.complex128)], "complex64", "dtype"),
        ([np.zeros(3, np.uint16)], "complex32", "trailing axis"),
        ([np.zeros((), np.uint16)], "complex32", "trailing axis"),
        ([np.array([1, 64], np.uint8)], "torchlean_state_binary_3_2_3_finite_v1", "64"),
        ([[1.0, 2.0]], "float32", "numpy array"),
        (np.zeros((2, 2), np.float32), "float32", "sequence"),
        (None, "float32", "sequence"),
        ({"w": np.zeros(2, np.float32)}, "float32", "numpy array"),
        ([np.zeros(2, np.float32)], "float33", "unknown"),
        ([np.zeros(2, np.float32)], 32, "unknown"),
    ],
)
def test_caller_errors_before_any_write(
    arrays: Any, encoding: Any, match: str, tmp_path: Path
) -> None:
    fresh = tmp_path / "fresh.json"
    with pytest.raises(CheckpointError, match=match):
        write_state_bits(fresh, arrays, encoding)
    assert not fresh.exists()

    kept = tmp_path / "kept.json"
    kept.write_bytes(b"old contents")
    with pytest.raises(CheckpointError, match=match):
        write_state_bits(kept, arrays, encoding)
    assert kept.read_bytes() == b"old contents"

    stream = io.BytesIO()
    with pytest.raises(CheckpointError):
        write_state_bits(stream, arrays, encoding)
    assert stream.getvalue() == b""
    assert sorted(os.listdir(tmp_path)) == ["kept.json"]  # no temporary left behind


@pytest.mark.parametrize("shapes", [[[-1]], [[1.5]], [[True]], [5], [["2"]]])
def test_bad_expected_shapes(shapes: Any) -> None:
    with pytest.raises(CheckpointError, match="shape"):
        read_bytes(doc(), shapes)


def test_a_counted_generator_is_written_one_array_at_a_time(tmp_path):
    arrays = [np.arange(6, dtype=np.float32).reshape(2, 3), np.float32(-0.0).reshape(())]
    write_state_bits(tmp_path / "list.json", arrays, "float32")
    asked = []

    def produce():
        for i, a in enumerate(arrays):
            asked.append(i)
            yield a

    write_state_bits(tmp_path / "gen.json", produce(), "float32", count=2)
    assert (tmp_path / "gen.json").read_bytes() == (tmp_path / "list.json").read_bytes()
    assert asked == [0, 1]
    for wrong in (1, 3):
        with pytest.raises(CheckpointError, match="announced"):
            write_state_bits(tmp_path / "list.json", iter(arrays), "float32", count=wrong)
        assert (tmp_path / "gen.json").read_bytes() == (tmp_path / "list.json").read_bytes()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
