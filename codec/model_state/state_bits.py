"""Exact-bits JSON model state (FORMAT.md §5): the validating reader, and ``inspect``'s view.

Reading decides from the first bytes and the file's size whether to read at all
(:mod:`~tlckpt.codec.exact_json.json_document`: a destination's largest valid encoding, or the
``max_json_bytes`` cap), parses the bytes with orjson (bounded nesting, no code execution),
refuses duplicate meaningful keys, and validates every field with set-level type checks and
numpy range checks over all tensors at once (:mod:`~tlckpt.codec.exact_json.state_words`), not
per-element (or, for valid files, per-tensor) Python loops. Untrusted bytes raise only
:class:`~tlckpt.codec.errors.CheckpointError` subclasses (or ``OSError``).

Reading first tries a fast path (:mod:`~tlckpt.codec.exact_json.json_words`) on documents whose
``values`` arrays make up most of them: the flat arrays are cut out of the bytes and converted
by numpy without one Python int per word, and orjson parses only the small remainder. It is
taken only when it provably yields the document orjson would (see :func:`_fast_document`)
and that document passes every check; on anything else, valid or not, the general path
(:mod:`~tlckpt.codec.exact_json.json_diagnosis`) parses the bytes whole and gives the result or the
error. The writer is :mod:`~tlckpt.codec.model_state.state_bits_writer` (re-exported here).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import orjson

from ...formats.state_bits import FORMAT_KEY, STATE_KEY, VALUES_KEY, ScalarFormat, parse_tag
from ..errors import CheckpointError, SchemaMismatchError, UnsupportedFormatError, names_the_file
from ..exact_json import json_words
from ..exact_json.json_diagnosis import (
    element_count_is,
    entry_fields,
    parse_document,
    parse_header,
    words_of,
)
from ..exact_json.json_document import (
    DEFAULT_MAX_JSON_BYTES,
    keys_counted_once,
    largest_document,
    read_document,
)
from ..exact_json.state_words import (
    as_arrays,
    counts_match,
    expected_shapes,
    format_of,
    plain_lengths,
    plain_shapes,
    plain_words,
    short,
    short_name,
    split_arrays,
)
from ..fileio.gcpause import without_gc
from ..fileio.source import PathOrFile, open_source
from ..sniffing import JSON_FAMILY

__all__ = ["inspect_state_bits", "read_state_bits"]

#: How the fast path finds each tensor's words: the member name, as bytes and as JSON text.
_VALUES_NAME = VALUES_KEY.encode()
_VALUES_TEXT = orjson.dumps(VALUES_KEY)

#: Documents with fewer bytes than this per tensor skip the fast path: cutting out arrays of
#: a few words costs more than the Python ints it saves, and those few ints cost little
#: memory (inspecting a million one-word tensors took 2.3 s of CPU through the fast path,
#: 1.4 s through orjson alone).
_CUT_MIN_BYTES_PER_TENSOR = 64


#: The fast path also declines a document whose arrays are less than this share of it: the
#: remainder would be a copy of most of the document (a padded or hostile file), for little.
_CUT_MIN_SHARE = 0.5


#: The density of tensors is estimated on the document's first MiB (a full count would cost
#: a pass over a document of one huge tensor for nothing).
_DENSITY_SAMPLE = 1 << 20


def _worth_cutting(data: bytes) -> bool:
    """Whether the fast path pays for ``data``: on average at least
    :data:`_CUT_MIN_BYTES_PER_TENSOR` bytes of document per ``"values"``, in its first MiB.

    Only the speed depends on it: both paths give the same arrays or the same error.
    """
    sample = min(len(data), _DENSITY_SAMPLE)
    return sample >= _CUT_MIN_BYTES_PER_TENSOR * data.count(_VALUES_TEXT, 0, sample)


class _NotFast(Exception):
    """The fast path's words cannot be judged without the general path (never escapes)."""


class _FastDocument(NamedTuple):
    """orjson's document without the values, and each tensor's words (or word counts)."""

    document: dict[str, Any]
    fmt: ScalarFormat
    values: list[np.ndarray] | np.ndarray


def _fast_document(
    data: bytes,
    fmt: ScalarFormat | None = None,
    *,
    counts_only: bool = False,
    min_share: float = 0.0,
) -> _FastDocument | None:
    """orjson's document for ``data`` with each tensor's words read apart; or ``None``.

    :func:`json_words.cut_arrays` empties every ``"values"`` array (there is no backslash, so
    none hides behind an escape) and orjson parses the rest. The document is that of the
    file when the remainder is JSON, each cut array is a plain word array
    (:func:`json_words.parse_arrays`), and the cut arrays are exactly the tensors' values: as
    many cuts as ``state`` entries, each entry an object whose ``values`` is the emptied
    ``[]``. A tensor's ``values`` member is one of the cuts inside its own object, distinct
    tensors own distinct cuts, so equal counts leave no cut anywhere else (duplicate keys,
    ``values`` in extra objects, a second ``state``) and pair them in document order. The
    other meaningful keys (``format``, ``state``, ``shape``) must appear as text exactly as
    often as the document holds them, which rules their duplicates out
    (:func:`keys_counted_once`).

    The words are checked against ``fmt`` (default: the format the document's tag names) and
    come as its word dtype, one array per tensor, or with ``counts_only`` as one array of
    word counts. Words above the width, nested arrays (complex values) and every error are
    left to the general path, and so is a document whose arrays are less than ``min_share``
    of it.
    """
    cut = json_words.cut_arrays(data, _VALUES_NAME, min_share)
    if cut is None or not len(cut[1]):
        return None
    remainder, spans = cut
    try:
        document = orjson.loads(remainder)
    except orjson.JSONDecodeError:
        return None
    state = document.get(STATE_KEY) if type(document) is dict else None
    if type(state) is not list or len(state) != len(spans) or set(map(type, state)) != {dict}:
        return None
    if [entry.get(VALUES_KEY) for entry in state].count([]) != len(state):
        return None
    if not keys_counted_once(remainder, document):
        return None
    if fmt is None:
        tag = document.get(FORMAT_KEY)
        fmt = parse_tag(tag) if type(tag) is str else None
        if fmt is None:
            return None
    if fmt.pair and (spans[:, 1] > spans[:, 0]).any():
        return None  # complex values are [re, im] arrays, not words
    if counts_only:
        values: Any = json_words.count_words(data, spans, fmt.width)
    else:
        values = json_words.parse_arrays(data, spans, fmt.word_dtype, fmt.width)
    if values is None:
        return None
    return _FastDocument(document, fmt, values)


@names_the_file()
@without_gc
def read_state_bits(
    path: PathOrFile, shapes: Sequence[Sequence[int]], encoding: str | ScalarFormat
) -> list[np.ndarray]:
    """Read exact-bits JSON model state, checking it against the expected layout.

    The file is refused from its first bytes if it cannot be exact-bits JSON, and from its
    size if it is larger than the largest valid encoding of ``shapes`` in ``encoding`` (see
    :mod:`~tlckpt.codec.exact_json.json_document` for the allowances), before it is read.

    Args:
        path: the file, or a seekable binary file object (read from its current position).
        shapes: the expected shape of every state tensor, in order.
        encoding: the expected scalar encoding, a short name or a full format tag.

    Returns:
        One new array per tensor, of the encoding's array dtype (see
        :func:`write_state_bits`); word-pair complex formats get a trailing axis of 2.
        Every word is kept bit-exact, NaN payloads, ``-0.0`` and subnormals included.

    Raises:
        MalformedError: not JSON (or not UTF-8), the top level is not an object, an object
            names ``format``, ``state``, ``shape`` or ``values`` twice, ``state`` or a tensor
            entry has the wrong JSON type or lacks ``shape``/``values``, a value is not a
            non-negative JSON integer below ``2**width`` (booleans and floats are not
            integers), or a complex value is not a 2-element array.
        UnsupportedFormatError: a binary checkpoint (the families differ); ``format``
            missing, not a string, or not the expected tag; or ``encoding`` unknown.
        SchemaMismatchError: more or fewer tensors than expected, a shape that differs, or
            a value count that differs from the element count.
        FileTooLargeError: the file is larger than any valid encoding of ``shapes``, or does
            not fit in memory.
        CheckpointError: ``shapes`` is not a sequence of shapes.
        OSError: from the file system.

    Example:
        >>> [w] = read_state_bits("state.json", [(2, 3)], "float32")
    """
    fmt = format_of(encoding)
    expected = expected_shapes(shapes)
    limit = largest_document(expected, fmt)
    bound = (
        f"the largest valid encoding of the expected {len(expected)} tensor(s) "
        f"of {short_name(fmt) or fmt.tag}"
    )
    with open_source(path) as src:
        data = read_document(src, limit, bound)
        fast = _fast_document(data, fmt, min_share=_CUT_MIN_SHARE) if _worth_cutting(data) else None
        if fast is not None:
            try:
                return _checked_arrays(fast.document, fast.values, None, fmt, expected)
            except (CheckpointError, _NotFast):
                pass  # the general path below finds the same problem and words it
        document, diagnose = parse_document(data)
        return _checked_arrays(document, None, diagnose, fmt, expected)


def _checked_arrays(
    document: Any,
    words: list[np.ndarray] | None,
    data: bytes | None,
    fmt: ScalarFormat,
    expected: list[tuple[int, ...]],
) -> list[np.ndarray]:
    """:func:`read_state_bits` on a parsed document; ``words``: the fast path's, checked."""
    tag, state = parse_header(document)
    if tag != fmt.tag:
        raise UnsupportedFormatError(
            f"format {short(tag)} is not the expected {fmt.tag!r}",
            field=FORMAT_KEY,
            actual=short(tag),
            expected=fmt.tag,
        )
    n = len(expected)
    if len(state) > n:
        raise SchemaMismatchError(
            f"unexpected {len(state) - n} trailing state tensor(s): file has "
            f"{len(state)}, expected {n}",
            field=STATE_KEY,
            actual=len(state),
            expected=n,
        )
    shapes = plain_shapes(state) if len(state) == n else None
    if shapes is not None and list(map(tuple, shapes)) == expected:
        lengths = list(map(len, words)) if words is not None else plain_lengths(state)
        counts = list(map(math.prod, expected))
        if words is not None and lengths == counts:
            return as_arrays(words, expected, fmt)
        flat = plain_words(state, fmt) if lengths == counts else None
        if flat is not None:
            return split_arrays(flat, counts, expected, fmt)
    if words is not None:
        raise _NotFast  # a problem: the general path finds and words it
    result = []
    for i, want in enumerate(expected):
        if i >= len(state):
            raise SchemaMismatchError(
                f"missing state tensor {i + 1}/{n}: file has {len(state)}",
                field=f"state[{i}]",
                actual=len(state),
                expected=n,
            )
        shape, values = entry_fields(state[i], i)
        if tuple(shape) != want:
            raise SchemaMismatchError(
                f"state tensor {i}: shape {short(shape)} in file, expected {list(want)}",
                field=f"state[{i}].shape",
                actual=short(shape),
                expected=list(want),
            )
        count = math.prod(want)
        if len(values) != count:
            raise SchemaMismatchError(
                f"state tensor {i}: {len(values)} values in file for the {count} "
                f"elements of shape {list(want)}",
                field=f"state[{i}].values",
                actual=len(values),
                expected=count,
            )
        result.append(words_of(values, i, fmt, data))
    return as_arrays(result, expected, fmt)


@without_gc
def inspect_state_bits(
    path: PathOrFile, *, max_json_bytes: int = DEFAULT_MAX_JSON_BYTES
) -> dict[str, Any]:
    """Describe an exact-bits JSON state file without expecting a layout.

    The file is validated as far as it can be without a destination: JSON types, element
    counts, and word ranges of the encoding its tag names. It is refused from its first
    bytes if it cannot be exact-bits JSON, and from its size if larger than
    ``max_json_bytes``, before it is read.

    Args:
        path: the file, or a seekable binary file object (read from its current position).
        max_json_bytes: the largest document read (:data:`DEFAULT_MAX_JSON_BYTES`, 4 GiB).

    Returns:
        ``{"family": "state_bits", "format": tag, "encoding": short name or None,
        "tensors": [{"shape": [...], "elements": n}, ...], "bytes": document size}``.

    Raises:
        UnsupportedFormatError: a binary checkpoint (the families differ); ``format``
            missing, not a string, or naming no encoding we can hold.
        MalformedError: as for :func:`read_state_bits`.
        SchemaMismatchError: a tensor whose value count differs from its shape's elements.
        FileTooLargeError: the file is larger than ``max_json_bytes``, or does not fit in
            memory.
        OSError: from the file system.
    """
    with open_source(path) as src:
        size = src.remaining
        data = read_document(src, max_json_bytes, "the JSON read cap max_json_bytes")
        fast = None
        if _worth_cutting(data):
            fast = _fast_document(data, counts_only=True, min_share=_CUT_MIN_SHARE)
        if fast is not None:
            try:
                return _described(fast.document, fast.values, None, size)
            except (CheckpointError, _NotFast):
                pass  # the general path below finds the same problem and words it
        document, diagnose = parse_document(data)
        return _described(document, None, diagnose, size)


def _described(
    document: Any, counts: np.ndarray | None, data: bytes | None, size: int
) -> dict[str, Any]:
    """:func:`inspect_state_bits` on a parsed document; ``counts``: the fast path's, checked."""
    tag, state = parse_header(document)
    fmt = parse_tag(tag)
    if fmt is None:
        raise UnsupportedFormatError(
            f"format {short(tag)} names no exact-bits encoding this library can hold",
            field=FORMAT_KEY,
            actual=short(tag),
            expected="a torchlean_state_*_v1 tag",
        )
    shapes = plain_shapes(state)
    if shapes is not None:
        lengths = counts.tolist() if counts is not None else plain_lengths(state)
        if (
            lengths is not None
            and counts_match(shapes, lengths)
            and (counts is not None or plain_words(state, fmt) is not None)
        ):
            return _description(tag, fmt, shapes, lengths, size)
    if counts is not None:
        raise _NotFast  # a problem (or a shape of many dims): the general path judges it
    tensors = []
    for i, entry in enumerate(state):
        shape, values = entry_fields(entry, i)
        if not element_count_is(shape, len(values)):
            raise SchemaMismatchError(
                f"state tensor {i}: {len(values)} values in file for shape {short(shape)}",
                field=f"state[{i}].values",
                actual=len(values),
                expected=f"prod({short(shape)})",
            )
        words_of(values, i, fmt, data)
        tensors.append(shape)
    return _description(tag, fmt, tensors, [len(entry[VALUES_KEY]) for entry in state], size)


def _description(
    tag: str, fmt: ScalarFormat, shapes: list[list[int]], lengths: list[int], size: int
) -> dict[str, Any]:
    return {
        "family": JSON_FAMILY,
        "format": tag,
        "encoding": short_name(fmt),
        "tensors": [{"shape": s, "elements": n} for s, n in zip(shapes, lengths)],
        "bytes": size,
    }
