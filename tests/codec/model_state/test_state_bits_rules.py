"""Exact-bits JSON model state (FORMAT.md §5): the reading rules, and hostile input that
may raise nothing but checkpoint errors."""

from __future__ import annotations

import contextlib
import io
import json
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from state_bits_support import F32, doc, read_bytes

from tlckpt.codec.errors import (
    CheckpointError,
    FileTooLargeError,
    MalformedError,
    SchemaMismatchError,
    UnsupportedFormatError,
)
from tlckpt.codec.model_state.state_bits import inspect_state_bits
from tlckpt.codec.model_state.state_bits_writer import write_state_bits
from tlckpt.formats.state_bits import encoding_by_name

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
