"""Hostile input for the JSON fast path (``codec/exact_json/json_words.py``): it agrees with
the general path on hostile word literals and arrays, hostile document structures, duplicate
keys, every truncation and random byte mutations (the helpers and the plain documents are in
``json_words_support.py`` and ``test_json_words.py``).
"""

from __future__ import annotations

import io
import json
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from json_words_support import (
    F32,
    F64,
    MAX64,
    agree,
    fast_taken,
    shaped,
)

from tlckpt.codec.errors import CheckpointError
from tlckpt.codec.exact_json import json_words
from tlckpt.codec.model_state.state_bits import inspect_state_bits
from tlckpt.codec.model_state.state_bits_writer import write_state_bits
from tlckpt.formats.state_bits import encoding_by_name

# --------------------------------------------------------------------------- hostile words


HOSTILE_LITERALS = [
    "0",
    "00",
    "01",
    "007",
    "-0",
    "-1",
    "+1",
    "1.0",
    "1.",
    ".5",
    "1e3",
    "1E3",
    "1e-3",
    "0e0",
    "1.5",
    "true",
    "false",
    "null",
    '"1"',
    "[1]",
    "[]",
    "{}",
    "NaN",
    "Infinity",
    "0x10",
    str(MAX64),
    str(MAX64 + 1),
    str(MAX64 + 10**18),
    "19999999999999999999",
    "20000000000000000000",
    "99999999999999999999",
    "100000000000000000000",
    str(MAX64) + "0",
    "0" * 20,
    "1" + "0" * 19,
    "1" * 5000,
    "٣",
    "１",  # noqa: RUF001 (non-ASCII digits are no JSON digits)
]
for width in (6, 8, 16, 32, 64):
    HOSTILE_LITERALS += [
        str(2**width - 1),
        str(2**width),
        str(2**width + 1),
        str(10 ** len(str(2**width))),
    ]

HOSTILE_ARRAYS = [
    "",
    " ",
    "\n\t\r ",
    ",",
    "1,",
    ",1",
    "1,,2",
    "1, ,2",
    "1 2",
    "1\n2",
    "1\t2",
    "12 , 3",
    " 1 , 2 ",
    "1\r\n,\r\n2",
    "1\x0b,2",
    "1,\x0c2",
    "1,\x002",
    "1,2\x00",
    "1\u00a0,2",
    "1,2,",
    "1,2]",
    "[1,2",
    "1;2",
    "1,2,3,4,5,6,7,8,9,10",
    "0,0,0",
    "0,00",
    "1,-0,2",
    "4294967295,0",
]


@pytest.mark.parametrize("literal", HOSTILE_LITERALS)
@pytest.mark.parametrize("encoding", ["float32", "float64", "bfloat16", "float8_e4m3fn"])
def test_hostile_literals_agree(literal: str, encoding: str) -> None:
    tag = encoding_by_name(encoding).tag
    for text in (literal, f"1,{literal}", f"{literal},2", f"3, {literal} ,4"):
        data = shaped(text, tag=tag)
        count = text.count(",") + 1
        agree(data, [[count]], encoding)


@pytest.mark.parametrize("text", HOSTILE_ARRAYS)
@pytest.mark.parametrize("chunk", [1, 3, json_words.CHUNK])
def test_hostile_arrays_agree(text: str, chunk: int) -> None:
    with mock.patch.object(json_words, "CHUNK", chunk):
        for count in {text.count(",") + 1, 0, 2}:
            agree(shaped(text, count), [[count]], "float32")
        agree(shaped(text, tag=F64), [[text.count(",") + 1]], "float64")


# --------------------------------------------------------------------------- hostile documents


def document(*entries: str, top: str = "", tag: str = F32) -> bytes:
    return ('{"format": "' + tag + '"' + top + ', "state": [' + ", ".join(entries) + "]}").encode()


HOSTILE_DOCUMENTS: list[tuple[bytes, list[list[int]]]] = [
    # duplicate values keys: the last one counts, in either order of good and bad
    (document('{"shape": [1], "values": [5], "values": [6]}'), [[1]]),
    (document('{"shape": [1], "values": [true], "values": [6]}'), [[1]]),
    (document('{"shape": [1], "values": [6], "values": [true]}'), [[1]]),
    (document('{"shape": [1], "values": [1, 2], "values": [6]}'), [[1]]),
    (document('{"shape": [1], "values": [6], "values": []}'), [[1]]),
    (document('{"shape": [0], "values": [], "values": []}'), [[0]]),
    # values in unknown objects, or in keys that are not values
    (document('{"shape": [1], "values": [5], "extra": {"values": [7]}}'), [[1]]),
    (document('{"shape": [1], "extra": {"values": [7]}, "values": [5]}'), [[1]]),
    (document('{"shape": [1], "values": [5]}', top=', "values": [1, 2]'), [[1]]),
    (document('{"shape": [1], "values": [true]}', top=', "values": [1]'), [[1]]),
    (document('{"shape": [1], "values": [5]}', top=', "x": [{"values": []}]'), [[1]]),
    (document('{"shape": [1], "values": [5], "my values": [1, 2], "values ": [3]}'), [[1]]),
    (document('{"shape": [1], "values": [5], "Values": [3], "VALUES": [4]}'), [[1]]),
    (document('{"shape": [1], "values": [5], "note": "values"}'), [[1]]),
    (document('{"shape": [1], "values": [5], "note": ["values", 1]}'), [[1]]),
    (document('{"shape": [1], "values": 5}'), [[1]]),
    (document('{"shape": [1], "values": {"values": [5]}}'), [[1]]),
    (document('{"shape": [1], "values": [{"values": [5]}]}'), [[1]]),
    # strings holding "values": [1,2] text need escaped quotes; escaped keys
    (document('{"shape": [1], "values": [5], "s": "\\"values\\": [1,2]"}'), [[1]]),
    (document('{"shape": [2], "s": "\\"values\\": [1,2]", "values": [5]}'), [[2]]),
    (document('{"shape": [1], "val\\u0075es": [5]}'), [[1]]),
    (document('{"shape": [0], "val\\u0075es": []}', top=', "x": {"values": [5]}'), [[0]]),
    (document('{"shape": [1], "values": [5], "val\\u0075es": [6]}'), [[1]]),
    (document('{"shape": [1], "values": [5]}', tag=F32.replace("_", "\\u005f")), [[1]]),
    # a tensor without values, another with two
    (document('{"shape": [1]}', '{"shape": [1], "values": [1], "values": [2]}'), [[1], [1]]),
    (document('{"shape": [1], "x": {"values": [3]}}', '{"shape": [1], "values": [2]}'), [[1], [1]]),
    (document('{"shape": [1]}', '{"shape": [1], "values": [2]}'), [[1], [1]]),
    (document('{"values": [1]}'), [[1]]),
    (document("[1]", '{"shape": [1], "values": [2]}'), [[1], [1]]),
    (document('{"shape": [1], "values": [2]}', '"values"'), [[1]]),
    # zero-size tensors, whitespace in empty arrays
    (
        document('{"shape": [0], "values": []}', '{"shape": [2, 0], "values": [ \n\t\r ]}'),
        [[0], [2, 0]],
    ),
    (document('{"shape": [0], "values": []}'), [[1]]),
    (document('{"shape": [1], "values": []}'), [[1]]),
    (document('{"shape": [0], "values": [0]}'), [[0]]),
    # nested arrays (complex) read as real and as complex
    (document('{"shape": [1], "values": [[1, 2]]}'), [[1]]),
    (
        document(
            '{"shape": [1], "values": [[1, 2]]}', tag="torchlean_state_complex_v1(" + F32 + ")"
        ),
        [[1]],
    ),
    (
        document('{"shape": [0], "values": []}', tag="torchlean_state_complex_v1(" + F32 + ")"),
        [[0]],
    ),
    (
        document('{"shape": [1], "values": [1, 2]}', tag="torchlean_state_complex_v1(" + F32 + ")"),
        [[1]],
    ),
    # the state and format keys
    (document('{"shape": [1], "values": [5]}', top=', "state": []'), [[1]]),
    (document('{"shape": [1], "values": [5]}').replace(b'"state"', b'"state": [], "state"'), [[1]]),
    (document('{"shape": [1], "values": [5]}', tag=F64), [[1]]),
    (document('{"shape": [1], "values": [5]}', top=', "format": 7'), [[1]]),
    (b'{"format": "' + F32.encode() + b'", "state": {"values": [1]}}', [[1]]),
    (b'{"format": "' + F32.encode() + b'", "values": [1]}', [[1]]),
    (b'{"format": "' + F32.encode() + b'", "values": [1]}', []),
    (b'[{"format": "' + F32.encode() + b'", "state": [{"shape": [1], "values": [1]}]}]', [[1]]),
    (b'{"state": [{"shape": [1], "values": [1]}]}', [[1]]),
    # shapes and counts
    (document('{"shape": [2], "values": [5]}'), [[2]]),
    (document('{"shape": [1], "values": [5, 6]}'), [[1]]),
    (document('{"shape": [2], "values": [5, 6]}'), [[3]]),
    (document('{"shape": [2.0], "values": [5, 6]}'), [[2]]),
    (document('{"shape": [1], "values": [5]}', '{"shape": [1], "values": [6]}'), [[1]]),
    (document('{"shape": [1], "values": [5]}'), [[1], [1]]),
    # not JSON around valid arrays
    (document('{"shape": [1], "values": [5]}') + b" x", [[1]]),
    (document('{"shape": [1], "values": [5]}').replace(b'"values"', b'"values" "'), [[1]]),
    (document('{"shape": [1], "values": [5]}').replace(b"]}]", b"]}"), [[1]]),
    (document('{"shape": [1], "values": [5]}').replace(b'": [5]', b'":: [5]'), [[1]]),
    (document('{"shape": [1], "values": [5]}').replace(b'"values"', b'"a""values"'), [[1]]),
    (document('{"shape": [1], "values": [5]}').replace(b"float32", b"flo\xffat32"), [[1]]),
    (document('{"shape": [1], "values": [5]}')[:-1] + b', "x": "\xff"}', [[1]]),
    (b"\xef\xbb\xbf" + document('{"shape": [1], "values": [5]}'), [[1]]),
    (document('{"shape": [1], "values": [5]}').replace(b'"shape"', b"shape"), [[1]]),
    (document('{"shape": [1], "values": [5]}') + b"\n\t\r ", [[1]]),
]


#: Documents naming a meaningful key twice, and the field the error names.
DUPLICATES: list[tuple[bytes, list[list[int]], str]] = [
    (document('{"shape": [1], "values": [5]}', top=', "format": "x"'), [[1]], "format"),
    (document('{"shape": [1], "values": [5]}', top=', "form\\u0061t": "x"'), [[1]], "format"),
    (document('{"shape": [1], "values": [5]}', top=', "state": []'), [[1]], "state"),
    (document('{"shape": [1], "values": [5]}', top=', "st\\u0061te": []'), [[1]], "state"),
    (document('{"shape": [1], "values": [5], "values": [6]}'), [[1]], "state[0].values"),
    (document('{"shape": [1], "values": [5], "val\\u0075es": [6]}'), [[1]], "state[0].values"),
    (document('{"shape": [1], "\\u0076alues": [5], "values": [5]}'), [[1]], "state[0].values"),
    (document('{"shape": [1], "shape": [1], "values": [5]}'), [[1]], "state[0].shape"),
    (document('{"shape": [1], "sh\\u0061pe": [1], "values": [5]}'), [[1]], "state[0].shape"),
    (
        document('{"shape": [0], "values": []}', '{"shape": [1], "shape": [1], "values": [5]}'),
        [[0], [1]],
        "state[1].shape",
    ),
    (
        document("[1]", "7", '{"shape": [1], "values": [5], "values": [5]}'),
        [[1]] * 3,
        "state[2].values",
    ),
    (document('{"shape": [1], "values": [5], "values": [5]}', tag="x"), [[1]], "state[0].values"),
]


@pytest.mark.parametrize(("data", "shapes", "field"), DUPLICATES)
def test_duplicate_keys_are_refused_on_both_paths(
    data: bytes, shapes: list[list[int]], field: str
) -> None:
    """orjson keeps the last of two equal keys, other readers the first: one file, two
    readings. Both paths refuse it, whichever comes first and however the key is spelled."""
    key = field.rsplit(".", 1)[-1]
    for encoding in ("float32", "float64"):
        result = agree(data, shapes, encoding)
        assert result[:3] == ("error", "MalformedError", result[2])
        assert f'duplicate key "{key}"' in result[2] and result[3] == field
    with pytest.raises(CheckpointError, match="duplicate key"):
        inspect_state_bits(io.BytesIO(data))


@pytest.mark.parametrize(
    "data",
    [
        document('{"shape": [1], "values": [5], "extra": {"values": 1, "values": 2}}'),
        document('{"shape": [1], "values": [5], "name": "a", "name": "b"}'),
        document('{"shape": [1], "values": [5]}', top=', "values": [], "values": 1'),
        document('{"shape": [1], "values": [5]}', top=', "meta": {"state": 1, "state": 2}'),
        document('{"shape": [1], "values": [5]}', top=', "x": [{"format": 1, "format": 2}]'),
        document('{"shape": [1], "values": [5], "s": "\\"values\\": [1], \\"values\\""}'),
    ],
)
def test_duplicate_keys_that_mean_nothing_are_ignored(data: bytes) -> None:
    """Unknown members are ignored, and so are their keys, doubled or not."""
    result = agree(data, [[1]], "float32")
    assert result[0] == "arrays" and result[1][0][2] == (5).to_bytes(4, "little")


@pytest.mark.parametrize(("data", "shapes"), HOSTILE_DOCUMENTS)
def test_hostile_documents_agree(data: bytes, shapes: list[list[int]]) -> None:
    for encoding in ("float32", "float64", "complex64"):
        agree(data, shapes, encoding)


def test_plain_hostile_documents_are_still_fast() -> None:
    """Unknown keys without a values member, and whitespace, keep the fast path."""
    data = document(
        '{"name": "w\\u00e9", "shape": [2], "values": [ 1 ,\n 2 ]}', top=', "values_of": [1]'
    )
    assert not fast_taken(data, [[2]], "float32")  # a backslash anywhere: general path
    data = document('{"name": "w", "shape": [2], "values": [ 1 ,\n 2 ]}', top=', "valuesx": 1')
    assert fast_taken(data, [[2]], "float32")
    assert agree(data, [[2]], "float32")[0] == "arrays"


def test_every_truncation_agrees() -> None:
    arrays = [np.array([[1.5, -0.0], [np.inf, np.nan]], np.float32), np.float32(2)]
    zero = np.zeros((0, 3), np.float32)
    for pretty in (True, False):
        out = io.BytesIO()
        write_state_bits(out, [*arrays, zero], "float32", pretty=pretty)
        data = out.getvalue()
        for cut in range(len(data) + 1):
            agree(data[:cut], [[2, 2], [], [0, 3]], "float32")
    spaced_doc = json.dumps(
        {"format": F64, "state": [{"shape": [3], "values": [0, 10**19, MAX64]}]}, indent=2
    ).encode()
    for cut in range(len(spaced_doc) + 1):
        agree(spaced_doc[:cut], [[3]], "float64")


MUTATION_BYTES = b'0123456789,[]{}":-.eE \n\t\\x'


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_mutated_documents_agree(data: st.DataObject) -> None:
    out = io.BytesIO()
    write_state_bits(
        out,
        [np.array([1.0, -2.5, 0.0], np.float64), np.zeros(0), np.float64(3)],
        "float64",
        pretty=data.draw(st.booleans()),
    )
    raw = bytearray(out.getvalue())
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(raw) - 1))
        action = data.draw(st.sampled_from(["set", "insert", "delete", "byte"]))
        if action == "set":
            raw[at] = data.draw(st.sampled_from(MUTATION_BYTES))
        elif action == "insert":
            raw.insert(at, data.draw(st.sampled_from(MUTATION_BYTES)))
        elif action == "delete":
            del raw[at]
        else:
            raw[at] = data.draw(st.integers(0, 255))
    chunk = data.draw(st.sampled_from([1, 4, json_words.CHUNK]))
    with mock.patch.object(json_words, "CHUNK", chunk):
        agree(bytes(raw), [[3], [0], []], "float64")
