"""Fast reading of the flat word arrays of an exact-bits JSON document, without Python ints.

A JSON parser turns every word into a Python ``int`` (tens of bytes, tens of nanoseconds each)
before numpy sees it. For the plain documents our writer (and any JSON writer) produces, each
tensor's ``"values"`` is a flat array of decimal literals, so this module

1. cuts those arrays out of the raw bytes (:func:`cut_arrays`), leaving a small remainder that
   orjson parses with each array replaced by ``[]``;
2. validates each array's text with vectorised byte checks (only digits, commas and JSON
   whitespace; no empty item, no leading zero, at most 20 digits, not above ``2**64 - 1``)
   and converts it with numpy's C text parser (:func:`parse_arrays`), in bounded chunks.

Both steps only ever *decline* (return ``None``): anything unusual (a backslash anywhere, a
``"values"`` key not followed by a flat array of digits, a sign, a fraction, an exponent, a
leading zero, a 21-digit literal, nested arrays, ...) sends the caller back to its general
path, which owns every rule and every error message. Accepted text is exactly the JSON grammar
``[ ws (int ws (, ws int ws)*)? ]`` with ``int = 0 | [1-9][0-9]*`` and a value below ``2**64``,
so the words are the ones any JSON reader would produce.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

__all__ = ["cut_arrays", "parse_arrays", "parse_words"]

#: Bytes of array text converted per numpy call: large enough that per-call overhead is
#: negligible, small enough that the temporaries (a few bytes per text byte) stay in cache.
CHUNK = 1 << 19

#: ``"values"``, JSON whitespace, ``:``, whitespace, ``[``, whitespace: a key opening an array.
_WS = rb"[ \t\n\r]*"
_ARRAY_KEY = rb'"%s"' + _WS + rb":" + _WS + rb"\[" + _WS

_MAX_DIGITS = 20  # len(str(2**64 - 1))
_MAX_WORD = np.frombuffer(b"18446744073709551615", np.uint8)
_MAX_WORD_VALUE = np.uint64(2**64 - 1)
_TEN_TO_19 = np.uint64(10**19)

_COMMA, _ZERO, _ONE, _NINE = ord(","), ord("0"), ord("1"), ord("9")
_SPACE, _TAB, _LF, _CR = ord(" "), ord("\t"), ord("\n"), ord("\r")

_heads: dict[bytes, re.Pattern[bytes]] = {}


def cut_arrays(data: bytes, key: bytes) -> tuple[bytes, list[tuple[int, int]]] | None:
    """Cut the array of every ``"key"`` member out of a JSON document's bytes.

    Returns the remainder (every such array emptied to ``[]``, all other bytes kept) and the
    ``(start, stop)`` byte spans of the arrays' insides, in document order. Returns ``None``
    when the document holds a backslash (so no key can hide behind an escape and no
    ``"key"`` text can sit inside a string) or when some ``"key"`` is not followed by
    ``: [``. The spans are not validated here; :func:`parse_arrays` does that.

    With no backslash, a ``"`` outside a string opens a string, so in a valid document
    every ``"key"`` that is followed by ``:`` is a member name, and every member named
    ``key`` (whose value is an array) is found: a valid remainder then has exactly one
    emptied array per found span.
    """
    if b"\\" in data:
        return None
    head = _heads.get(key)
    if head is None:
        head = _heads.setdefault(key, re.compile(_ARRAY_KEY % re.escape(key)))
    needle = b'"' + key + b'"'
    view = memoryview(data)
    pieces: list[memoryview] = []
    spans: list[tuple[int, int]] = []
    kept = 0
    at = data.find(needle)
    while at >= 0:
        match = head.match(data, at)
        if match is None:
            return None
        start = match.end()
        stop = data.find(b"]", start)
        if stop < 0:
            return None
        pieces.append(view[kept:start])
        spans.append((start, stop))
        kept = stop
        at = data.find(needle, stop)
    pieces.append(view[kept:])
    return b"".join(pieces), spans


def parse_arrays(
    data: bytes, spans: list[tuple[int, int]], dtype: Any = np.uint64, width: int = 64
) -> list[np.ndarray] | None:
    """The words of each span's array text as ``dtype``, or ``None`` if any is not plain.

    ``None`` too if a word is ``2**width`` or more (``dtype`` must hold ``width`` bits). Short
    arrays are joined (with commas) into chunks of about :data:`CHUNK` bytes, long ones split
    at commas into such chunks, so there are few numpy calls however the words are spread over
    tensors, and temporaries stay bounded. Every returned array owns its memory.
    """
    dtype = np.dtype(dtype)

    def words_of(text: bytes) -> np.ndarray | None:
        words = parse_words(text)
        if words is None or (width < 64 and words.size and int(words.max()) >> width):
            return None
        return words if dtype == words.dtype else words.astype(dtype)

    result: list[np.ndarray | None] = [None] * len(spans)
    batch: list[memoryview] = []
    owners: list[tuple[int, int]] = []  # (span index, item count) of each joined span
    batch_bytes = 0
    view = memoryview(data)

    def flush() -> bool:
        nonlocal batch_bytes
        words = words_of(b",".join(batch))
        if words is None or len(words) != sum(count for _, count in owners):
            return False
        at = 0
        for index, count in owners:
            result[index] = words[at : at + count].copy() if len(owners) > 1 else words
            at += count
        batch.clear()
        owners.clear()
        batch_bytes = 0
        return True

    for index, (start, stop) in enumerate(spans):
        if start == stop:  # "[" whitespace "]": cut_arrays already took the whitespace
            result[index] = np.empty(0, dtype)
        elif stop - start < CHUNK:
            batch.append(view[start:stop])
            owners.append((index, data.count(b",", start, stop) + 1))
            batch_bytes += stop - start + 1
            if batch_bytes >= CHUNK and not flush():
                return None
        else:
            parts = []
            at = start
            while True:
                cut = data.find(b",", at + CHUNK, stop)
                words = words_of(data[at : stop if cut < 0 else cut])
                if words is None:
                    return None
                parts.append(words)
                if cut < 0:
                    break
                at = cut + 1
            result[index] = parts[0] if len(parts) == 1 else np.concatenate(parts)
    if batch and not flush():
        return None
    return result  # type: ignore[return-value]  # every entry was filled


def _without_whitespace(a: np.ndarray) -> np.ndarray | None:
    """``a`` without JSON whitespace; ``None`` for any other byte below ``,`` or for
    whitespace inside a number (``1 2`` is two tokens, never ``12``)."""
    low = a < _COMMA
    blank = (a == _SPACE) | (a == _LF) | (a == _CR) | (a == _TAB)
    if np.count_nonzero(low) != np.count_nonzero(blank):
        return None
    digit = a >= _ZERO  # the caller has checked that nothing lies above '9'
    runs = int(digit[0]) + np.count_nonzero(digit[1:] & ~digit[:-1])
    if runs != np.count_nonzero(a == _COMMA) + 1:  # a run split by whitespace, or an
        return None  # empty item: either way not a plain array (empty items rechecked below)
    return a[~low]


def parse_words(text: bytes) -> np.ndarray | None:
    """The uint64 words of ``text``, the inside of a JSON array of at least one integer.

    ``None`` unless ``text`` is: optional JSON whitespace around items separated by commas,
    each item ``0`` or ``[1-9][0-9]*`` of at most 20 digits and at most ``2**64 - 1``.
    """
    a = np.frombuffer(text, np.uint8)
    if not a.size or a.max() > _NINE:
        return None
    if a.min() < _COMMA:
        a = _without_whitespace(a)
        if a is None or not a.size:
            return None
        text = a.tobytes()
    commas = np.flatnonzero(a == _COMMA)
    if np.count_nonzero(a < _ZERO) != len(commas):  # '-', '.', '/'
        return None
    n = len(commas) + 1
    starts = np.empty(n, np.intp)
    starts[0] = 0
    starts[1:] = commas + 1
    ends = np.empty(n, np.intp)
    ends[:-1] = commas
    ends[-1] = len(a)
    lengths = ends - starts
    if lengths.min() < 1 or lengths.max() > _MAX_DIGITS:
        return None
    leading_zero = a[starts] == _ZERO
    if leading_zero.any() and (lengths[leading_zero] > 1).any():
        return None
    try:
        words = np.fromstring(text, dtype=np.uint64, sep=",")
    except ValueError:  # unreachable for text checked as above
        return None
    if len(words) != n:
        return None
    longest = lengths == _MAX_DIGITS
    if longest.any():
        # A 20-digit literal may exceed 2**64 - 1. It does if it starts with 2-9; starting
        # with 1, C's strtoull gives 2**64 - 1 for it (or, were it to wrap, less than 10**19):
        # those few are compared with 18446744073709551615 as text.
        suspect = np.flatnonzero(longest)
        if (a[starts[suspect]] != _ONE).any():
            return None
        value = words[suspect]
        suspect = suspect[(value == _MAX_WORD_VALUE) | (value < _TEN_TO_19)]
        if suspect.size:
            windows = np.lib.stride_tricks.sliding_window_view(a, _MAX_DIGITS)[starts[suspect]]
            if (windows != _MAX_WORD).any():
                return None
    return words
