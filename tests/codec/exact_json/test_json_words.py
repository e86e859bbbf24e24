"""The fast path of exact-bits JSON reading (``codec/exact_json/json_words.py``) agrees with
the general one.

Every check runs a document through ``read_state_bits`` and ``inspect_state_bits`` twice: as
shipped (fast path first) and with the fast path switched off (orjson on the whole document),
and requires the same arrays or the same error (class, message, field, actual, expected).
Documents: every vector; hypothesis-generated files of every encoding written compact, pretty,
by orjson and the stdlib with indents and with whitespace around commas, or with random JSON
whitespace between all tokens, under several chunk sizes; hostile word literals and document
structures; every truncation; random byte mutations. Where a document is plain, the tests also
require that the fast path really took it, and that its document equals orjson's.

This module: the vectors, generated files and the word parsers; the hostile words,
documents, duplicate keys, truncations and mutations are in ``test_json_words_hostile.py``.
"""

from __future__ import annotations

import io
import json
import math
import random
from typing import Any
from unittest import mock

import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from json_words_support import (
    F64,
    MAX64,
    VECTORS,
    WS,
    agree,
    fast_taken,
    spaced,
)

from tlckpt.codec.exact_json import json_words
from tlckpt.codec.model_state import state_bits as sb
from tlckpt.codec.model_state.state_bits import read_state_bits
from tlckpt.codec.model_state.state_bits_writer import write_state_bits
from tlckpt.formats.state_bits import ENCODINGS, encoding_by_name

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
