"""Fast reading of the flat word arrays of an exact-bits JSON document, without Python ints.

A JSON parser turns every word into a Python ``int`` (tens of bytes, tens of nanoseconds each)
before numpy sees it. For the plain documents our writer (and any JSON writer) produces, each
tensor's ``"values"`` is a flat array of decimal literals, so this module

1. cuts those arrays out of the raw bytes (:func:`cut_arrays`), leaving a small remainder that
   orjson parses with each array replaced by ``[]``;
2. validates each array's text with vectorised byte checks (only digits, commas and JSON
   whitespace; no empty item, no leading zero, at most 20 digits, not above ``2**64 - 1``)
   and converts it with numpy's C text parser (:func:`parse_arrays`, :func:`count_words`),
   in bounded chunks.

Both steps only ever *decline* (return ``None``): anything unusual (a backslash anywhere, a
``"values"`` key not followed by a flat array of digits, a sign, a fraction, an exponent, a
leading zero, a 21-digit literal, nested arrays, ...) sends the caller back to its general
path, which owns every rule and every error message. Accepted text is exactly the JSON grammar
``[ ws (int ws (, ws int ws)*)? ]`` with ``int = 0 | [1-9][0-9]*`` and a value below ``2**64``,
so the words are the ones any JSON reader would produce.

Per array, the work is done by the regex engine and numpy, not by Python code: a document of
a million small tensors costs about as much as one tensor of the same size.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["CHUNK", "count_words", "cut_arrays", "parse_arrays", "parse_words"]

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

Spans = np.ndarray  # (n, 2) intp: the (start, stop) byte offsets of each array's inside


def cut_arrays(data: bytes, key: bytes, min_share: float = 0.0) -> tuple[bytes, Spans] | None:
    """Cut the array of every ``"key"`` member out of a JSON document's bytes.

    Returns the remainder (every such array emptied to ``[]``, all other bytes kept) and the
    ``(start, stop)`` byte spans of the arrays' insides, in document order, as an ``(n, 2)``
    array. Returns ``None`` when the document holds a backslash (so no key can hide behind an
    escape and no ``"key"`` text can sit inside a string), when some ``"key"`` is not
    followed by ``: [``, or when the arrays' insides are less than ``min_share`` of the
    document (the remainder, a copy, would then be most of it). The spans are not validated
    here; :func:`parse_arrays` does that.

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
    # From one key to the end of its array and on to the next key: the searches skip the
    # arrays' text at memchr speed, and there is one step per array.
    starts: list[int] = []
    stops: list[int] = []
    at = data.find(needle)
    while at >= 0:
        match = head.match(data, at)
        if match is None:
            return None
        start = match.end()
        stop = data.find(b"]", start)
        if stop < 0:
            return None
        starts.append(start)
        stops.append(stop)
        at = data.find(needle, stop)
    if sum(stops) - sum(starts) < min_share * len(data):
        return None
    view = memoryview(data)
    pieces = map(view.__getitem__, map(slice, [0, *stops], [*starts, len(data)]))
    return b"".join(pieces), np.array([starts, stops], np.intp).T.reshape(-1, 2)


def parse_arrays(
    data: bytes, spans: Sequence[Any], dtype: Any = np.uint64, width: int = 64
) -> list[np.ndarray] | None:
    """The words of each span's array text as ``dtype``, or ``None`` if any is not plain.

    ``None`` too if a word is ``2**width`` or more (``dtype`` must hold ``width`` bits). Short
    arrays are converted together, a window of about :data:`CHUNK` bytes of the document at a
    time, long ones split at commas into such chunks, so there are few numpy calls however
    the words are spread over tensors, and temporaries stay bounded. Every returned array owns
    its memory.
    """
    groups = _parse_groups(data, spans, np.dtype(dtype), width)
    if groups is None:
        return None
    result: list[np.ndarray] = []
    for words, counts in groups:
        if len(counts) == 1 and words.base is None:
            result.append(words)
            continue
        ends = np.cumsum(counts).tolist()
        # Copies, so that no tensor keeps a window shared with other tensors alive.
        result += [words[a:b].copy() for a, b in zip([0, *ends[:-1]], ends)]
    return result


def count_words(data: bytes, spans: Sequence[Any], width: int = 64) -> np.ndarray | None:
    """The number of words in each span's array, after the checks of :func:`parse_arrays`.

    For a caller that needs the counts and the verdict but not the words themselves.
    """
    groups = _parse_groups(data, spans, np.dtype(np.uint64), width)
    if groups is None:
        return None
    if not groups:
        return np.zeros(0, np.int64)
    return np.concatenate([counts for _, counts in groups])


def _parse_groups(
    data: bytes, spans: Sequence[Any], dtype: np.dtype, width: int
) -> list[tuple[np.ndarray, np.ndarray]] | None:
    """``(words, counts)`` per group of consecutive spans, or ``None`` if any is not plain.

    A group is one long span (:data:`CHUNK` bytes or more), or a run of short ones that start
    in the same :data:`CHUNK`-sized block of the document: the window from the run's first
    start to its last stop is then under ``2 * CHUNK`` bytes.
    """
    table = np.asarray(spans, np.intp).reshape(-1, 2)
    if not len(table):
        return []
    starts, stops = table[:, 0], table[:, 1]
    long = stops - starts >= CHUNK
    first = np.ones(len(table), bool)
    block = starts // CHUNK
    first[1:] = (block[1:] != block[:-1]) | long[1:] | long[:-1]
    bounds = [*np.flatnonzero(first).tolist(), len(table)]
    groups = []
    for g0, g1 in itertools.pairwise(bounds):
        if long[g0]:
            words = _long_array(data, int(starts[g0]), int(stops[g0]))
            counts = None if words is None else np.array([len(words)], np.int64)
        else:
            words, counts = _short_arrays(data, starts[g0:g1], stops[g0:g1])
        if words is None or counts is None:
            return None
        if width < 64 and words.size and int(words.max()) >> width:
            return None
        groups.append((words if words.dtype == dtype else words.astype(dtype), counts))
    return groups


def _long_array(data: bytes, start: int, stop: int) -> np.ndarray | None:
    """The words of one long array, converted a :data:`CHUNK` of text at a time."""
    parts = []
    at = start
    while True:
        cut = data.find(b",", at + CHUNK, stop)
        words = parse_words(memoryview(data)[at : stop if cut < 0 else cut].tobytes())
        if words is None:
            return None
        parts.append(words)
        if cut < 0:
            break
        at = cut + 1
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _short_arrays(
    data: bytes, starts: np.ndarray, stops: np.ndarray
) -> tuple[np.ndarray | None, np.ndarray | None]:
    """The words of a run of short arrays and each one's count, in one conversion.

    The window of the document from the first start to the last stop is copied; every byte
    outside the arrays (keys, shapes, brackets) becomes a space, and the ``]`` after each
    non-empty array but the last a comma. The window is then one plain array text exactly
    when every array is (an empty item, a stray byte or a split number in one of them stays
    one in the joined text), and its words are those of the arrays, in order.
    """
    low, high = int(starts[0]), int(stops[-1])
    inner_starts, inner_stops = starts - low, stops - low
    filled = inner_stops > inner_starts
    if not filled.any():
        return np.empty(0, np.uint64), np.zeros(len(starts), np.int64)
    window = np.frombuffer(data, np.uint8, high - low, low).copy()
    commas = np.zeros(len(window) + 1, np.int64)
    np.cumsum(window == _COMMA, out=commas[1:])
    counts = np.where(filled, commas[inner_stops] - commas[inner_starts] + 1, 0)
    edges = np.zeros(len(window) + 1, np.int8)
    edges[inner_starts] += 1  # starts are distinct, and so are stops
    edges[inner_stops] -= 1
    outside = np.cumsum(edges[:-1], dtype=np.int8) == 0
    window[outside] = _SPACE
    window[inner_stops[filled][:-1]] = _COMMA
    words = parse_words(window)
    if words is None or len(words) != int(counts.sum()):
        return None, None
    return words, counts


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


def parse_words(text: bytes | np.ndarray) -> np.ndarray | None:
    """The uint64 words of ``text``, the inside of a JSON array of at least one integer.

    ``None`` unless ``text`` (bytes, or their uint8 array) is: optional JSON whitespace
    around items separated by commas, each item ``0`` or ``[1-9][0-9]*`` of at most 20 digits
    and at most ``2**64 - 1``.
    """
    a = text if isinstance(text, np.ndarray) else np.frombuffer(text, np.uint8)
    if not a.size or a.max() > _NINE:
        return None
    if a.min() < _COMMA:
        a = _without_whitespace(a)
        if a is None or not a.size:
            return None
        text = a.tobytes()
    elif isinstance(text, np.ndarray):
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
