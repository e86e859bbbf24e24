"""Exact-bits JSON model state (FORMAT.md §5): vectors, round trips, hostile and caller input."""

from __future__ import annotations

import contextlib
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

from tlckpt.codec import state_bits_writer as state_bits_module
from tlckpt.codec.errors import (
    CheckpointError,
    FileTooLargeError,
    MalformedError,
    SchemaMismatchError,
    UnsupportedFormatError,
)
from tlckpt.codec.state_bits import inspect_state_bits, read_state_bits, write_state_bits
from tlckpt.formats.state_bits import ENCODINGS, BinaryFormat, encoding_by_name
from tlckpt.testing.vectors import vectors_dir

VECTORS = vectors_dir()

CATEGORY_ERRORS: dict[str, type[CheckpointError]] = {
    "json": MalformedError,
    "value": MalformedError,
    "family": UnsupportedFormatError,
    "schema": SchemaMismatchError,
}

F32 = "torchlean_state_float32_bits_v1"


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


def doc(*state: Any, tag: str = F32) -> bytes:
    return json.dumps({"format": tag, "state": list(state)}).encode()


def read_bytes(data: bytes, shapes: list[list[int]], encoding: str = "float32") -> list[Any]:
    return read_state_bits(io.BytesIO(data), shapes, encoding)


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
    error = CATEGORY_ERRORS[vector["category"]]
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


# --------------------------------------------------------------------------- reading rules


@pytest.mark.parametrize(
    ("data", "shapes", "error", "match"),
    [
        (b"", [[2]], MalformedError, "not JSON"),
        (b"\xff\xfe{}", [[2]], MalformedError, "not JSON"),
        (b'{"format": "\xff"}', [[2]], MalformedError, "not JSON"),
        (b'{"format": "' + F32.encode() + b'"} x', [[2]], MalformedError, "not JSON"),
        (b"[]", [[2]], MalformedError, "top level"),
        (b"null", [[2]], MalformedError, "top level"),
        (b'"text"', [[2]], MalformedError, "top level"),
        (b"{}", [[2]], UnsupportedFormatError, "format"),
        (b'{"format": 7}', [[2]], UnsupportedFormatError, "format"),
        (b'{"format": null}', [[2]], UnsupportedFormatError, "format"),
        (b'{"format": "torchlean_state_bits_v1"}', [[2]], UnsupportedFormatError, "expected"),
        (doc(tag="x" * 10_000), [[2]], UnsupportedFormatError, "expected"),
        (json.dumps({"format": F32}).encode(), [], None, None),  # missing state = empty
        (json.dumps({"format": F32}).encode(), [[2]], SchemaMismatchError, "missing state"),
        (json.dumps({"format": F32, "state": {}}).encode(), [], MalformedError, "state"),
        (json.dumps({"format": F32, "state": None}).encode(), [], MalformedError, "state"),
        (doc([1, 2]), [[2]], MalformedError, "expected an object"),
        (doc({"values": [1, 2]}), [[2]], MalformedError, '"shape"'),
        (doc({"shape": [2]}), [[2]], MalformedError, '"values"'),
        (doc({"shape": 2, "values": [1, 2]}), [[2]], MalformedError, "shape"),
        (doc({"shape": [2.0], "values": [1, 2]}), [[2]], MalformedError, "dimension"),
        (doc({"shape": [True], "values": [1]}), [[1]], MalformedError, "dimension"),
        (doc({"shape": [-2], "values": [1, 2]}), [[2]], MalformedError, "dimension"),
        (doc({"shape": [2**64], "values": [1, 2]}), [[2]], MalformedError, "dimension"),
        (doc({"shape": [2], "values": {"0": 1}}), [[2]], MalformedError, "values"),
        (doc({"shape": [2], "values": "12"}), [[2]], MalformedError, "values"),
        (doc({"shape": [2], "values": None}), [[2]], MalformedError, "values"),
        (doc({"shape": [2], "values": [1, True]}), [[2]], MalformedError, "boolean"),
        (doc({"shape": [2], "values": [1, 2.0]}), [[2]], MalformedError, "not an integer"),
        (doc({"shape": [2], "values": [1, None]}), [[2]], MalformedError, "null"),
        (doc({"shape": [2], "values": [1, [2]]}), [[2]], MalformedError, "array"),
        (doc({"shape": [2], "values": [1, "2"]}), [[2]], MalformedError, "string"),
        (doc({"shape": [2], "values": [1, -1]}), [[2]], MalformedError, "negative"),
        (doc({"shape": [2], "values": [1, 2**32]}), [[2]], MalformedError, "too wide"),
        (doc({"shape": [2], "values": [1, 2**63]}), [[2]], MalformedError, "too wide"),
        (doc({"shape": [2], "values": [1, 2**64]}), [[2]], MalformedError, "too large"),
        (doc({"shape": [2], "values": [1, 10**400]}), [[2]], MalformedError, "too large"),
        (doc({"shape": [2], "values": [1, -(10**400)]}), [[2]], MalformedError, "too large"),
        (doc({"shape": [2], "values": [1, -(2**64)]}), [[2]], MalformedError, "negative"),
        (
            doc({"shape": [2], "values": [1, 0]})[:-5] + b"1" * 5000 + b"]}]}",
            [[2]],
            MalformedError,
            "too large",
        ),
        (
            b'{"format": "' + F32.encode() + b'", "state": [{"shape": [1], "values": [1e400]}]}',
            [[1]],
            MalformedError,
            "not JSON",
        ),
        (
            b'{"format": "' + F32.encode() + b'", "state": [{"shape": [1], "values": [NaN]}]}',
            [[1]],
            MalformedError,
            "not JSON",
        ),
        (doc({"shape": [3], "values": [1, 2]}), [[3]], SchemaMismatchError, "2 values"),
        (doc({"shape": [2], "values": [1, 2]}), [[2, 1]], SchemaMismatchError, "shape"),
        (doc({"shape": [2], "values": [1, 2]}), [[2], [2]], SchemaMismatchError, "2/2"),
        (doc({"shape": [2], "values": [1, 2]}, {}, {}), [[2]], SchemaMismatchError, "2 trailing"),
        (doc({"shape": [2], "values": [1, 2], "extra": {"x": [True]}}), [[2]], None, None),
    ],
)
def test_reading_rules(
    data: bytes, shapes: list[list[int]], error: type[Exception] | None, match: str | None
) -> None:
    if error is None:
        read_bytes(data, shapes)
        return
    with pytest.raises(error, match=match) as info:
        read_bytes(data, shapes)
    assert type(info.value) is error
    assert len(str(info.value)) < 600  # hostile content is never echoed in full


@pytest.mark.parametrize(
    ("values", "match"),
    [
        ([[1, 2], [3]], "2-element"),
        ([[1, 2], [3, 4, 5]], "2-element"),
        ([[1, 2], 3], "2-element"),
        ([[1, 2], {"re": 1, "im": 2}], "2-element"),
        ([[1, 2], [3, 2**32]], "too wide"),
        ([[1, 2], [3, 1.5]], "not an integer"),
        ([[1, 2], [-3, 1]], "negative"),
    ],
)
def test_complex_value_rules(values: list[Any], match: str) -> None:
    tag = encoding_by_name("complex64").tag
    with pytest.raises(MalformedError, match=match):
        read_bytes(doc({"shape": [2], "values": values}, tag=tag), [[2]], "complex64")


def test_duplicate_keys_are_refused() -> None:
    """Readers disagree on doubled keys (orjson keeps the last, others the first): refused."""
    data = (
        b'{"format": "torchlean_state_bits_v1", "format": "' + F32.encode() + b'", '
        b'"state": [{"shape": [1], "values": [6]}]}'
    )
    with pytest.raises(MalformedError, match='duplicate key "format"'):
        read_bytes(data, [[1]])
    with pytest.raises(MalformedError, match='duplicate key "format"'):
        inspect_state_bits(io.BytesIO(data))


def test_tag_spelled_differently_is_unsupported() -> None:
    for tag in (
        "torchlean_state_binary_05_10_15_ieee_v1",
        "torchlean_state_binary_5_10_" + "9" * 5000 + "_ieee_v1",
        "torchlean_state_complex_v1(" * 50 + ")" * 50,
        "torchlean_state_binary_40_40_1_ieee_v1",
    ):
        with pytest.raises(UnsupportedFormatError):
            inspect_state_bits(io.BytesIO(doc(tag=tag)))
        with pytest.raises(UnsupportedFormatError):
            read_bytes(doc(tag=tag), [], "float16")


def test_inspect_checks_counts_without_huge_products() -> None:
    data = doc({"shape": [2**62] * 100_000, "values": [1, 2]})
    with pytest.raises(SchemaMismatchError):
        inspect_state_bits(io.BytesIO(data))
    # 2 MB: larger than any valid file of one 2-element tensor, so refused unread.
    with pytest.raises(FileTooLargeError):
        read_bytes(data, [[2]])
    with pytest.raises(SchemaMismatchError):
        read_bytes(data, [[2**62] * 40_000])
    empty = inspect_state_bits(io.BytesIO(doc({"shape": [2**62, 0], "values": []})))
    assert empty["tensors"] == [{"shape": [2**62, 0], "elements": 0}]


# --------------------------------------------------------------------------- hostile input


def test_deep_nesting() -> None:
    for data in (
        b"[" * 10_000,
        b"{" + b'"a": [' * 10_000,
        b'{"format": "'
        + F32.encode()
        + b'", "state": [{"shape": [1], "values": '
        + b"[" * 10_000
        + b"]" * 10_000
        + b"}]}",
    ):
        with pytest.raises(MalformedError):
            read_bytes(data, [[1]])
        with pytest.raises(MalformedError):
            inspect_state_bits(io.BytesIO(data))


def test_every_truncation_is_rejected() -> None:
    arrays = [np.array([[1.5, -0.0], [np.inf, np.nan]], np.float32), np.float32(2)]
    for pretty in (True, False):
        out = io.BytesIO()
        write_state_bits(out, arrays, "float32", pretty=pretty)
        data = out.getvalue()
        for cut in range(len(data)):
            prefix = data[:cut]
            if prefix.strip() == data.strip():  # only trailing whitespace cut: still whole
                read_bytes(prefix, [[2, 2], []])
                continue
            with pytest.raises(MalformedError):
                read_bytes(prefix, [[2, 2], []])


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=20,
)
FIELDS = st.sampled_from(["format", "state", "shape", "values"])


@settings(max_examples=300, deadline=None)
@given(
    st.fixed_dictionaries(
        {},
        optional={
            "format": st.sampled_from([F32, "torchlean_state_bits_v1"]) | JSON_VALUES,
            "state": st.lists(
                st.fixed_dictionaries(
                    {},
                    optional={
                        "shape": st.lists(st.integers(0, 3), max_size=2) | JSON_VALUES,
                        "values": st.lists(st.integers(0, 2**33), max_size=4) | JSON_VALUES,
                    },
                )
                | JSON_VALUES,
                max_size=3,
            )
            | JSON_VALUES,
        },
    )
    | JSON_VALUES,
    st.sampled_from(["float32", "complex64", "bfloat16"]),
)
def test_random_json_only_checkpoint_errors(document: Any, encoding: str) -> None:
    data = json.dumps(document).encode()
    for attempt in (
        lambda: read_bytes(data, [[2]], encoding),
        lambda: read_bytes(data, [[2], [1, 2]], encoding),
        lambda: inspect_state_bits(io.BytesIO(data)),
    ):
        with contextlib.suppress(CheckpointError):
            attempt()


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_mutated_bytes_only_checkpoint_errors(data: st.DataObject) -> None:
    out = io.BytesIO()
    write_state_bits(out, [np.array([1.0, -2.5], np.float32), np.float32(3)], "float32")
    raw = bytearray(out.getvalue())
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(raw) - 1))
        if data.draw(st.booleans()):
            raw[at] = data.draw(st.integers(0, 255))
        else:
            del raw[at]
    for attempt in (
        lambda: read_bytes(bytes(raw), [[2], []]),
        lambda: inspect_state_bits(io.BytesIO(bytes(raw))),
    ):
        with contextlib.suppress(CheckpointError):
            attempt()


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
