"""Helpers shared by the JSON fast-path tests (``test_json_words*.py``): run a document through
both paths and require the same outcome, check that the fast path really took a plain
document, and build documents (shaped, randomly spaced)."""

from __future__ import annotations

import io
import json
import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import orjson

from tlckpt.codec.errors import CheckpointError
from tlckpt.codec.model_state import state_bits as sb
from tlckpt.codec.model_state.state_bits import inspect_state_bits, read_state_bits
from tlckpt.formats.state_bits import encoding_by_name, parse_tag
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
