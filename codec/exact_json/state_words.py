"""Exact-bits encodings in memory: encoding names, and caller arrays ↔ storage words.

Every scalar travels as its storage word: float arrays are viewed as unsigned words of the same
width, never converted through Python floats, so NaN payloads, ``-0.0`` and subnormals survive
bit for bit. This module holds what the writer and the reader of exact-bits JSON share:

* :func:`format_of` / :func:`short_name`: an encoding's name ↔ its
  :class:`~tlckpt.formats.state_bits.ScalarFormat`;
* :func:`check_array` / :func:`shape_and_words`: a caller's array, checked, as words to write;
* :func:`as_arrays` / :func:`split_arrays`: words read back as the caller's arrays;
* the set-level checks of a parsed document (:func:`plain_shapes`, :func:`plain_lengths`,
  :func:`plain_words`), one Python call per document rather than per tensor or value.
"""

from __future__ import annotations

import itertools
import math
import operator
import reprlib
from collections.abc import Iterable
from typing import Any

import numpy as np

from ...formats.state_bits import (
    ENCODINGS,
    SHAPE_KEY,
    VALUES_KEY,
    BinaryFormat,
    ComplexFormat,
    ScalarFormat,
    encoding_by_name,
)
from ..errors import CheckpointError, UnsupportedFormatError

__all__ = [
    "NUMPY_WRAPS_NEGATIVES",
    "short",
    "format_of",
    "short_name",
    "check_array",
    "shape_and_words",
    "as_arrays",
    "split_arrays",
    "expected_shapes",
    "plain_shapes",
    "plain_lengths",
    "counts_match",
    "plain_words",
]

#: numpy < 2 wraps negative Python ints into uint64 (with a DeprecationWarning) instead of
#: raising OverflowError, so there negative words need their own check.
NUMPY_WRAPS_NEGATIVES = np.lib.NumpyVersion(np.__version__) < "2.0.0"

_brief = reprlib.Repr()
_brief.maxstring = 80
_brief.maxother = 80
_brief.maxlist = 8
_brief.maxdict = 4
_brief.maxlevel = 2


def short(value: Any) -> str:
    """A bounded repr for messages: hostile files hold megabyte strings and lists."""
    return _brief.repr(value)


def format_of(encoding: str | ScalarFormat) -> ScalarFormat:
    fmt: ScalarFormat | None
    if isinstance(encoding, str):
        fmt = encoding_by_name(encoding)
    elif isinstance(encoding, (BinaryFormat, ComplexFormat)):
        fmt = encoding
    else:
        fmt = None
    if fmt is None:
        raise UnsupportedFormatError(
            f"unknown state encoding {short(encoding)}; expected one of "
            f"{', '.join(ENCODINGS)} or a torchlean_state_*_v1 format tag",
            field="encoding",
            actual=short(encoding),
            expected=tuple(ENCODINGS),
        )
    return fmt


def short_name(fmt: ScalarFormat) -> str | None:
    for name, known in ENCODINGS.items():
        if known.tag == fmt.tag:
            return name
    return None


def check_array(index: int, array: Any, fmt: ScalarFormat) -> np.ndarray:
    """Validate one caller array without copying it; return it as an ndarray."""
    field = f"arrays[{index}]"
    expected = np.dtype(fmt.array_dtype)
    if isinstance(array, np.generic):  # a numpy scalar is a 0-d array of its dtype
        array = np.asarray(array)
    if not isinstance(array, np.ndarray):
        raise CheckpointError(
            f"expected a numpy array of dtype {expected}, got {type(array).__name__}",
            field=field,
            actual=type(array).__name__,
            expected=str(expected),
        )
    # Byte order is not a value conversion: a big-endian array of the right type is accepted.
    if array.dtype.newbyteorder("<") != expected.newbyteorder("<"):
        raise CheckpointError(
            f"dtype {array.dtype} does not fit the {fmt.tag} encoding, "
            f"which takes {expected} arrays (no implicit conversion)",
            field=field,
            actual=str(array.dtype),
            expected=str(expected),
        )
    if fmt.pair and fmt.native_dtype is None and (array.ndim == 0 or array.shape[-1] != 2):
        raise CheckpointError(
            f"{fmt.tag} takes {expected} word pairs with a trailing axis of 2 (re, im); "
            f"got shape {array.shape}",
            field=field,
            actual=array.shape,
            expected="(..., 2)",
        )
    # Only word arrays can hold too wide a word; max() reads any strides without a copy.
    narrow = fmt.native_dtype is None and fmt.width < 8 * expected.itemsize
    if narrow and array.size and int(array.max()) >> fmt.width:
        flat = int(np.argmax(array.reshape(-1) >> fmt.width != 0))
        bad = int(array.reshape(-1)[flat])
        raise CheckpointError(
            f"word {bad} at flat position {flat} does not fit the "
            f"{fmt.width}-bit words of {fmt.tag}",
            field=f"{field}[{flat}]",
            actual=bad,
            expected=f"< 2^{fmt.width}",
        )
    return array


def shape_and_words(array: np.ndarray, fmt: ScalarFormat) -> tuple[tuple[int, ...], np.ndarray]:
    """The tensor's shape and its words: flat, or ``(n, 2)`` (re, im) rows.

    A non-contiguous array is copied here, one tensor at a time, in its own byte order.
    """
    word = np.dtype(fmt.word_dtype).newbyteorder(array.dtype.byteorder)
    if fmt.pair and fmt.native_dtype is None:
        shape, words = array.shape[:-1], array.reshape(-1, 2)
    elif fmt.pair:
        # Viewing complex as words doubles the last axis, which must be contiguous.
        flat = np.ascontiguousarray(array).reshape(-1)
        shape, words = array.shape, flat.view(word).reshape(-1, 2)
    else:
        shape, words = array.shape, array.reshape(-1).view(word)
    return shape, words


def as_arrays(
    words: Iterable[np.ndarray], shapes: Iterable[tuple[int, ...]], fmt: ScalarFormat
) -> list[np.ndarray]:
    """Words → the caller's arrays: native dtype, or words (+ trailing 2 for pairs)."""
    dtype = np.dtype(fmt.word_dtype)
    native = np.dtype(fmt.array_dtype)
    pairs = fmt.pair and fmt.native_dtype is None
    result = []
    for w, shape in zip(words, shapes):
        # Our own fresh words are used as they are; a view into other words is copied.
        typed = w if w.dtype == dtype and w.base is None else w.astype(dtype)
        result.append(typed.reshape((*shape, 2)) if pairs else typed.view(native).reshape(shape))
    return result


def split_arrays(
    flat: np.ndarray, counts: list[int], shapes: list[tuple[int, ...]], fmt: ScalarFormat
) -> list[np.ndarray]:
    """All tensors' words, flat (uint64; complex: re, im interleaved) → the caller's arrays.

    Converted once, then cut: each tensor is a copy, so no array keeps the others alive.
    An empty tensor is reshaped from a fresh empty array, not copied: numpy gives a copied
    (or ``np.empty``-made) empty array zero strides, which torch's complex views refuse.
    """
    typed = flat.astype(np.dtype(fmt.word_dtype))
    pairs = fmt.pair and fmt.native_dtype is None
    typed = typed.reshape(-1, 2) if pairs else typed.view(np.dtype(fmt.array_dtype))
    ends = list(itertools.accumulate(counts))
    result = []
    for a, b, shape in zip([0, *ends[:-1]], ends, shapes):
        full = (*shape, 2) if pairs else shape
        piece = typed[a:b].reshape(full).copy() if b > a else np.empty(0, typed.dtype)
        result.append(piece.reshape(full))
    return result


_SHAPE = operator.itemgetter(SHAPE_KEY)


_VALUES = operator.itemgetter(VALUES_KEY)


def expected_shapes(shapes: Iterable[Iterable[int]]) -> list[tuple[int, ...]]:
    shapes = list(shapes)
    try:
        result = list(map(tuple, shapes))
    except TypeError:
        result = None
    if result is not None:
        dims = list(itertools.chain.from_iterable(result))
        if set(map(type, dims)) <= {int} and (not dims or min(dims) >= 0):
            return result
    # Not plain Python ints (numpy integers are fine), or not shapes: one by one, for the error.
    result = []
    for i, shape in enumerate(shapes):
        try:
            dims = tuple(shape)
            if any(isinstance(d, bool) for d in dims):
                raise TypeError
            dims = tuple(operator.index(d) for d in dims)
            if any(d < 0 for d in dims):
                raise TypeError
        except TypeError:
            raise CheckpointError(
                f"expected shape {i} must be a sequence of non-negative integers, got "
                f"{short(shape)}",
                field=f"shapes[{i}]",
                actual=short(shape),
            ) from None
        result.append(dims)
    return result


def plain_shapes(state: list[Any]) -> list[list[int]] | None:
    """Every entry's shape, when each entry is an object whose shape is an array of
    non-negative integers; else ``None`` (the entry-by-entry checks then say what is wrong).

    Set-level checks over all tensors at once: a file of a million small tensors costs no
    Python loop per tensor here.
    """
    if not set(map(type, state)) <= {dict}:
        return None
    try:
        shapes = list(map(_SHAPE, state))
    except KeyError:
        return None
    if not set(map(type, shapes)) <= {list}:
        return None
    dims = list(itertools.chain.from_iterable(shapes))
    if not set(map(type, dims)) <= {int} or (dims and min(dims) < 0):
        return None
    return shapes


def plain_lengths(state: list[Any]) -> list[int] | None:
    """Every entry's number of values when each ``values`` is an array, else ``None``."""
    try:
        values = list(map(_VALUES, state))
    except KeyError:
        return None
    return list(map(len, values)) if set(map(type, values)) <= {list} else None


def counts_match(shapes: list[list[int]], lengths: list[int]) -> bool:
    """Whether every shape's element count is its length; ``False`` also when a shape has too
    many dimensions to multiply out cheaply (:func:`element_count_is` then decides)."""
    if shapes and max(map(len, shapes)) > 64:  # dims < 2^64: products stay under 4096 bits
        return False
    return list(map(math.prod, shapes)) == lengths


def plain_words(state: list[Any], fmt: ScalarFormat) -> np.ndarray | None:
    """All tensors' words, flat (complex: re, im interleaved), when every value is a word of
    ``fmt`` (complex: an ``[re, im]`` pair of words); else ``None``."""
    flat: Any = itertools.chain.from_iterable(map(_VALUES, state))
    if fmt.pair:
        pairs = list(flat)
        if not set(map(type, pairs)) <= {list} or not set(map(len, pairs)) <= {2}:
            return None
        flat = itertools.chain.from_iterable(pairs)
    words = list(flat)
    if not set(map(type, words)) <= {int}:
        return None
    try:
        array = np.array(words, dtype=np.uint64)
    except OverflowError:  # negative, or 2^64 and more
        return None
    if NUMPY_WRAPS_NEGATIVES and words and min(words) < 0:
        return None
    if fmt.width < 64 and array.size and int(array.max()) >> fmt.width:
        return None
    return array
