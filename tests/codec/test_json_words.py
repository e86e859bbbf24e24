"""The fast path of exact-bits JSON reading (``codec/json_words.py``) agrees with the general one.

Every check runs a document through ``read_state_bits`` and ``inspect_state_bits`` twice: as
shipped (fast path first) and with the fast path switched off (orjson on the whole document),
and requires the same arrays or the same error (class, message, field, actual, expected).
Documents: every vector; hypothesis-generated files of every encoding written compact, pretty,
by orjson and the stdlib with indents and with whitespace around commas, or with random JSON
whitespace between all tokens, under several chunk sizes; hostile word literals and document
structures; every truncation; random byte mutations. Where a document is plain, the tests also
require that the fast path really took it, and that its document equals orjson's.
"""

from __future__ import annotations

import io
import json
import math
import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tlckpt.codec import json_words
from tlckpt.codec import state_bits as sb
from tlckpt.codec.errors import CheckpointError
from tlckpt.codec.state_bits import inspect_state_bits, read_state_bits, write_state_bits
from tlckpt.formats.state_bits import ENCODINGS, encoding_by_name, parse_tag
from tlckpt.testing.vectors import vectors_dir

VECTORS = vectors_dir()

F32 = "torchlean_state_float32_bits_v1"
F64 = "torchlean_state_bits_v1"
WS = " \t\n\r"
MAX64 = 2**64 - 1


# --------------------------------------------------------------------------- helpers


def outcome(call: Callable[[], Any]) -> tuple[Any, ...]:
    """What a read gives: the arrays (dtype, shape, bytes) or the error, in full."""
    try:
        result = call()
    except CheckpointError as exc:
        return (
            "error",
            type(exc).__name__,
            str(exc),
            exc.field,
            repr(exc.actual),
            repr(exc.expected),
        )
    if isinstance(result, dict):
        return ("inspect", result)
    return ("arrays", [(a.dtype.str, a.shape, a.tobytes()) for a in result])


@contextmanager
def general_only() -> Iterator[None]:
    with mock.patch.object(sb, "_fast_document", lambda *args, **kwargs: None):
        yield


def source(data: bytes | Path) -> Any:
    return data if isinstance(data, Path) else io.BytesIO(data)


@contextmanager
def fast_first() -> Iterator[None]:
    """The fast path is tried on every document, however dense in tensors or small in words."""
    with (
        mock.patch.object(sb, "_CUT_MIN_BYTES_PER_TENSOR", 0),
        mock.patch.object(sb, "_CUT_MIN_SHARE", 0.0),
    ):
        yield


def agree(data: bytes | Path, shapes: list[Any], encoding: str) -> tuple[Any, ...]:
    """Both paths (and the readers' own choice) give the same outcome, for reading and for
    inspecting; return it."""
    calls = [
        lambda: read_state_bits(source(data), shapes, encoding),
        lambda: inspect_state_bits(source(data)),
    ]
    outcomes = []
    for call in calls:
        with fast_first():
            fast = outcome(call)
        with general_only():
            general = outcome(call)
        assert fast == general == outcome(call)
        outcomes.append(fast)
    raw = data.read_bytes() if isinstance(data, Path) else data
    check_fast_document(raw)
    return outcomes[0]


def check_fast_document(data: bytes) -> None:
    """Whenever the fast path builds a document, it is orjson's, word for word."""
    for fmt in (None, *(encoding_by_name(e) for e in ("float32", "bfloat16", "float8_e5m2"))):
        fast = sb._fast_document(data, fmt)
        if fast is None:
            assert sb._fast_document(data, fmt, counts_only=True) is None
            continue
        reference = orjson.loads(data)  # must parse: the fast path took it for JSON
        counts = sb._fast_document(data, fmt, counts_only=True)
        assert counts is not None
        assert counts.values.tolist() == [len(w) for w in fast.values]
        document = fast.document
        assert len(fast.values) == len(document["state"])
        for entry, words in zip(document["state"], fast.values, strict=True):
            assert isinstance(words, np.ndarray) and entry["values"] == []
            assert words.dtype == np.dtype(fast.fmt.word_dtype)
            entry["values"] = words.tolist()
        assert orjson.dumps(document) == orjson.dumps(reference)  # ints stay ints: 1 is not true


def fast_taken(data: bytes, shapes: list[Any], encoding: str) -> bool:
    """Whether ``read_state_bits`` returned the fast path's arrays."""
    fmt = encoding_by_name(encoding) or parse_tag(encoding)
    fast = sb._fast_document(data, fmt)
    if fast is None:
        return False
    try:
        sb._checked_arrays(fast.document, fast.values, None, fmt, [tuple(s) for s in shapes])
    except (CheckpointError, sb._NotFast):
        return False
    return True


def shaped(values: str, count: int | None = None, tag: str = F32) -> bytes:
    """One tensor holding the given ``values`` text, its shape the number of items."""
    if count is None:
        count = values.count(",") + 1 if values.strip(WS) else 0
    return (
        '{"format": "'
        + tag
        + '", "state": [{"shape": ['
        + str(count)
        + '], "values": ['
        + values
        + "]}]}"
    ).encode("utf-8", "surrogatepass")


# --------------------------------------------------------------------------- vectors


@pytest.mark.vectors("state_bits")
def test_vectors_agree_and_plain_ones_are_fast(vector: dict[str, Any]) -> None:
    path = VECTORS / vector["file"]
    assert agree(path, vector["shapes"], vector["encoding"])[0] == "arrays"
    assert agree(path, vector["shapes"], vector["format"])[0] == "arrays"
    if not encoding_by_name(vector["encoding"]).pair:
        assert fast_taken(path.read_bytes(), vector["shapes"], vector["encoding"])


@pytest.mark.vectors("invalid", kind="state_bits")
def test_invalid_vectors_agree(vector: dict[str, Any]) -> None:
    path = VECTORS / vector["file"]
    assert agree(path, vector["shapes"], vector["encoding"])[0] == "error"


# --------------------------------------------------------------------------- generated files


def special_words(width: int) -> list[int]:
    top = (1 << width) - 1
    near = {0, 1, 9, 10, 99, 100, top, top - 1, 1 << (width - 1), (1 << (width - 1)) - 1}
    if width == 64:  # 19 and 20 digits, the largest 20-digit words
        near |= {10**19 - 1, 10**19, 10**19 + 1, MAX64 - 10**10, 2 * 10**18}
    return sorted(w for w in near if 0 <= w <= top)


@st.composite
def state(draw: st.DrawFn, encoding: str) -> tuple[list[list[int]], list[Any]]:
    """Shapes and JSON values (words, or [re, im] pairs) of a few tensors."""
    fmt = encoding_by_name(encoding)
    word = st.one_of(st.sampled_from(special_words(fmt.width)), st.integers(0, 2**fmt.width - 1))
    shapes, values = [], []
    for _ in range(draw(st.integers(0, 4))):
        shape = draw(st.lists(st.integers(0, 4), max_size=3))
        count = math.prod(shape)
        if fmt.pair:
            flat = draw(st.lists(word, min_size=2 * count, max_size=2 * count))
            values.append([flat[k : k + 2] for k in range(0, 2 * count, 2)])
        else:
            values.append(draw(st.lists(word, min_size=count, max_size=count)))
        shapes.append(shape)
    return shapes, values


def spaced(value: Any, rng: random.Random) -> str:
    """JSON text of ``value`` with random JSON whitespace (possibly none) around every token."""

    def ws() -> str:
        return "".join(rng.choice(WS) for _ in range(rng.choice([0, 0, 1, 2, 4])))

    if isinstance(value, dict):
        members = [ws() + json.dumps(k) + ws() + ":" + spaced(v, rng) for k, v in value.items()]
        return ws() + "{" + (",".join(members) or ws()) + "}" + ws()
    if isinstance(value, list):
        return ws() + "[" + (",".join(spaced(v, rng) for v in value) or ws()) + "]" + ws()
    return ws() + json.dumps(value) + ws()


LAYOUTS = ["ours-pretty", "ours-compact", "orjson-indent", "json-indent", "json", "json-loose"]
LAYOUTS += ["spaced", "values-first", "extras"]


def render(
    layout: str, tag: str, shapes: list[Any], values: list[Any], rng: random.Random
) -> bytes:
    entries: list[dict[str, Any]] = [
        {"shape": s, "values": v} for s, v in zip(shapes, values, strict=True)
    ]
    if layout == "values-first":
        entries = [{"values": e["values"], "shape": e["shape"]} for e in entries]
    if layout == "extras":  # unknown keys are ignored; none of them is named values
        entries = [{**e, "name": "w", "meta": {"dims": [1, 2], "ok": True}} for e in entries]
        document: dict[str, Any] = {"comment": {"a": [[]]}, "format": tag, "state": entries}
    else:
        document = {"format": tag, "state": entries}
    if layout == "orjson-indent":
        return orjson.dumps(document, option=orjson.OPT_INDENT_2)
    if layout == "json-indent":
        return json.dumps(document, indent=rng.choice([0, 1, 2, 4, "\t"])).encode()
    if layout == "json":
        return json.dumps(document).encode()  # ", " and ": "
    if layout == "json-loose":
        return json.dumps(document, separators=(" , ", " : ")).encode()
    if layout == "spaced":
        return spaced(document, rng).encode()
    return json.dumps(document, separators=(",", ":")).encode()


@pytest.mark.parametrize("encoding", sorted(ENCODINGS))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_generated_files_agree_and_are_fast(encoding: str, data: st.DataObject) -> None:
    fmt = encoding_by_name(encoding)
    shapes, values = data.draw(state(encoding))
    layout = data.draw(st.sampled_from(LAYOUTS))
    rng = data.draw(st.randoms(use_true_random=False))
    chunk = data.draw(st.sampled_from([1, 2, 7, 64, json_words.CHUNK]))
    if layout.startswith("ours"):
        out = io.BytesIO()
        words = [np.array(v, dtype=fmt.word_dtype).reshape(-1) for v in values]
        arrays = [
            w.reshape((*s, 2))
            if fmt.pair and fmt.native_dtype is None
            else w.view(fmt.array_dtype).reshape(s)
            for w, s in zip(words, shapes, strict=True)
        ]
        write_state_bits(out, arrays, encoding, pretty=layout == "ours-pretty")
        text = out.getvalue()
    else:
        text = render(layout, fmt.tag, shapes, values, rng)
    assert json.loads(text)["state"] == [
        {"shape": s, "values": v} for s, v in zip(shapes, values, strict=True)
    ] or layout in ("values-first", "extras")
    with mock.patch.object(json_words, "CHUNK", chunk):
        result = agree(text, shapes, encoding)
        assert result[0] == "arrays"
        # Plain files take the fast path: all but complex ones with any value.
        plain = not fmt.pair or not any(values)
        assert fast_taken(text, shapes, encoding) == (plain and bool(shapes))
        # Wrong expectations are answered alike too.
        agree(text, [*shapes, [1]], encoding)
        if shapes:
            agree(text, [[*shapes[0], 1], *shapes[1:]], encoding)
            agree(text, shapes, "float8_e4m3fn" if encoding == "float8_e5m2" else "float8_e5m2")


def test_large_tensor_many_chunks() -> None:
    rng = np.random.default_rng(5)
    words = rng.integers(0, 2**64, size=300_000, dtype=np.uint64)
    words[::7] = rng.integers(0, 10, size=len(words[::7]))  # one-digit words among 20-digit ones
    words[::11] = MAX64
    for pretty in (True, False):
        out = io.BytesIO()
        write_state_bits(out, [words.view(np.float64)], "float64", pretty=pretty)
        data = out.getvalue()
        assert len(data) > 4 * json_words.CHUNK
        assert fast_taken(data, [[len(words)]], "float64")
        [back] = read_state_bits(io.BytesIO(data), [[len(words)]], "float64")
        assert np.array_equal(back.view(np.uint64), words)
    indented = json.dumps(
        {"format": F64, "state": [{"shape": [2000], "values": words[:2000].tolist()}]}, indent=3
    ).encode()
    assert fast_taken(indented, [[2000]], "float64")
    assert agree(indented, [[2000]], "float64")[0] == "arrays"


def test_many_small_tensors_are_batched() -> None:
    rng = np.random.default_rng(6)
    arrays = [rng.standard_normal(int(n)).astype(np.float32) for n in rng.integers(0, 40, 3000)]
    out = io.BytesIO()
    write_state_bits(out, arrays, "float32", pretty=False)
    shapes = [a.shape for a in arrays]
    assert fast_taken(out.getvalue(), shapes, "float32")
    back = read_state_bits(io.BytesIO(out.getvalue()), shapes, "float32")
    assert all(np.array_equal(a.view(np.uint32), b.view(np.uint32)) for a, b in zip(arrays, back))
    # No result keeps a chunk shared with other tensors alive.
    assert all((b if b.base is None else b.base).nbytes == b.nbytes for b in back)


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


# --------------------------------------------------------------------------- the parsers


def reference_words(text: bytes) -> list[int] | None:
    """What a JSON reader makes of ``[text]``, when that is a list of words below 2^64."""
    try:
        values = orjson.loads(b"[" + text + b"]")
    except orjson.JSONDecodeError:
        return None
    if not values or not all(type(v) is int and 0 <= v <= MAX64 for v in values):
        return None
    if any(b"-" in token for token in text.split(b",")):
        return None  # -0 is the word 0 to a JSON reader; the fast path leaves it to it
    return values


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.one_of(st.integers(0, 9), st.integers(0, MAX64), st.just(MAX64)), min_size=1),
    st.randoms(use_true_random=False),
)
def test_parse_words_reads_every_plain_array(words: list[int], rng: random.Random) -> None:
    def ws() -> str:
        return "".join(rng.choice(WS) for _ in range(rng.choice([0, 0, 1, 3])))

    text = ",".join(ws() + str(w) + ws() for w in words).encode()
    parsed = json_words.parse_words(text)
    assert parsed is not None and parsed.dtype == np.uint64 and parsed.tolist() == words


TOKENS = [
    "0",
    "1",
    "7",
    "00",
    "01",
    "10",
    "-",
    "-0",
    "+",
    ".",
    "e",
    "E",
    ",",
    ",",
    ",",
    " ",
    "\n",
    "\t",
    "\r",
    "\x0b",
    "\x0c",
    "\x00",
    "[",
    "]",
    '"',
    "a",
    "\u00a0",
    str(MAX64),
    str(MAX64 + 1),
    "99999999999999999999",
    "10000000000000000000",
    "9" * 21,
    "1" * 19,
    "2" + "0" * 19,
]


@settings(max_examples=1000, deadline=None)
@given(st.lists(st.sampled_from(TOKENS), min_size=0, max_size=12))
def test_parse_words_never_accepts_what_json_reads_otherwise(tokens: list[str]) -> None:
    text = "".join(tokens).encode()
    parsed = json_words.parse_words(text)
    expected = reference_words(text)
    assert (parsed is None) == (expected is None)
    if parsed is not None:
        assert parsed.tolist() == expected


def test_parse_arrays_width_and_dtype() -> None:
    data = b"[1,255][256][][ 7 ]"
    spans = [(1, 6), (8, 11), (13, 13), (16, 17)]
    words = json_words.parse_arrays(data, spans, np.uint8, 8)
    assert words is None  # 256 does not fit 8 bits
    words = json_words.parse_arrays(data, spans, np.uint16, 9)
    assert words is not None
    assert [w.tolist() for w in words] == [[1, 255], [256], [], [7]]
    assert all(w.dtype == np.uint16 for w in words)
    assert json_words.parse_arrays(data, spans, np.uint8, 6) is None  # 255 >= 2^6


def test_cut_arrays() -> None:
    data = b'{"a": {"values" :\n[ 1, 2 ]}, "values":[], "b": "values"}'
    assert json_words.cut_arrays(data, b"values") is None  # "values" not a key
    data = b'{"a": {"values" :\n[ 1, 2 ]}, "values":[ ]}'
    remainder, spans = json_words.cut_arrays(data, b"values")  # type: ignore[misc]
    assert remainder == b'{"a": {"values" :\n[ ]}, "values":[ ]}'
    assert [data[a:b] for a, b in spans] == [b"1, 2 ", b""]
    assert json_words.cut_arrays(b'{"values": [1]}\\', b"values") is None
    assert json_words.cut_arrays(b'{"values": [1', b"values") is None
    assert json_words.cut_arrays(b'{"values": [1], "values": [2', b"values") is None
    # a "values" inside a cut array is the array's text: it leaves with it, and the
    # array is then no plain word array
    remainder, spans = json_words.cut_arrays(b'{"values": [1, "values": [2]}', b"values")
    assert remainder == b'{"values": []}' and spans.tolist() == [[12, 27]]
    assert json_words.parse_arrays(b'{"values": [1, "values": [2]}', spans) is None
    data = b'{"values": [1, 2], "x": "y", "values": []}'
    assert json_words.cut_arrays(data, b"values", min_share=0.1) is None  # 4 bytes of 42
    assert json_words.cut_arrays(data, b"values", min_share=0.09) is not None
    remainder, spans = json_words.cut_arrays(b'{"x": [1]}', b"values")  # type: ignore[misc]
    assert remainder == b'{"x": [1]}' and spans.shape == (0, 2)


def test_no_python_int_per_word() -> None:
    """The fast path converts words in bulk: it never calls the JSON parser on them."""
    out = io.BytesIO()
    write_state_bits(out, [np.arange(50_000, dtype=np.float32)], "float32", pretty=False)
    data = out.getvalue()
    seen: list[int] = []
    real = orjson.loads

    def loads(text: Any) -> Any:
        seen.append(len(text))
        return real(text)

    with mock.patch.object(sb.orjson, "loads", loads):
        read_state_bits(io.BytesIO(data), [[50_000]], "float32")
    assert seen and max(seen) < 200
