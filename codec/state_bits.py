"""Exact-bits JSON model state (FORMAT.md §5): streaming writer, validating reader.

Every scalar travels as its storage word, a JSON integer ``0 <= w < 2**width``; float arrays
are viewed as unsigned words of the same width, never converted through Python floats, so
NaN payloads, ``-0.0`` and subnormals survive bit for bit.

Writing checks all caller input first, then streams the document one tensor at a time (values
in bounded chunks) through an atomic output. Reading decides from the first bytes and the
file's size whether to read at all (:mod:`~tlckpt.codec.json_document`: a destination's
largest valid encoding, or the ``max_json_bytes`` cap), parses the bytes with orjson
(bounded nesting, no code execution), refuses duplicate meaningful keys, and validates every
field with set-level type checks and numpy range checks over all tensors at once, not per-element
(or, for valid files, per-tensor) Python loops. Untrusted bytes raise only
:class:`~tlckpt.codec.errors.CheckpointError` subclasses (or ``OSError``).

Reading first tries a fast path (:mod:`~tlckpt.codec.json_words`) on documents whose
``values`` arrays make up most of them: the flat arrays are cut out of the bytes and converted
by numpy without one Python int per word, and orjson parses only the small remainder. It is
taken only when it provably yields the document orjson would (see :func:`_fast_document`)
and that document passes every check; on anything else, valid or not, the general path above
parses the bytes whole and gives the result or the error.
"""

from __future__ import annotations

import itertools
import json
import math
import operator
import re
import reprlib
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np
import orjson

from ..formats.state_bits import (
    ENCODINGS,
    BinaryFormat,
    ComplexFormat,
    ScalarFormat,
    encoding_by_name,
    parse_tag,
)
from . import json_words
from .atomic import output
from .errors import (
    CheckpointError,
    MalformedError,
    SchemaMismatchError,
    UnsupportedFormatError,
    names_the_file,
)
from .gcpause import without_gc
from .json_document import (
    DEFAULT_MAX_JSON_BYTES,
    duplicate_key_error,
    keys_counted_once,
    largest_document,
    read_document,
)
from .source import PathOrFile, open_source

__all__ = ["DEFAULT_MAX_JSON_BYTES", "inspect_state_bits", "read_state_bits", "write_state_bits"]

#: Values serialised per orjson call: bounds the writer's memory to a few MiB of JSON text
#: beyond the caller's arrays, however large one tensor is.
_CHUNK = 1 << 20
#: Largest document re-parsed with the stdlib to tell a too-large integer from a float
#: (orjson turns integers beyond 64 bits into floats); only ever on the error path.
_REDIAGNOSE_LIMIT = 8 << 20

#: numpy < 2 wraps negative Python ints into uint64 (with a DeprecationWarning) instead of
#: raising OverflowError, so there negative words need their own check.
_NUMPY_WRAPS_NEGATIVES = np.lib.NumpyVersion(np.__version__) < "2.0.0"

_brief = reprlib.Repr()
_brief.maxstring = 80
_brief.maxother = 80
_brief.maxlist = 8
_brief.maxdict = 4
_brief.maxlevel = 2


def _short(value: Any) -> str:
    """A bounded repr for messages: hostile files hold megabyte strings and lists."""
    return _brief.repr(value)


# --------------------------------------------------------------------------- encodings


def _format_of(encoding: str | ScalarFormat) -> ScalarFormat:
    fmt: ScalarFormat | None
    if isinstance(encoding, str):
        fmt = encoding_by_name(encoding)
    elif isinstance(encoding, (BinaryFormat, ComplexFormat)):
        fmt = encoding
    else:
        fmt = None
    if fmt is None:
        raise UnsupportedFormatError(
            f"unknown state encoding {_short(encoding)}; expected one of "
            f"{', '.join(ENCODINGS)} or a torchlean_state_*_v1 format tag",
            field="encoding",
            actual=_short(encoding),
            expected=tuple(ENCODINGS),
        )
    return fmt


def _short_name(fmt: ScalarFormat) -> str | None:
    for name, known in ENCODINGS.items():
        if known.tag == fmt.tag:
            return name
    return None


# --------------------------------------------------------------------------- writing


def _check_array(index: int, array: Any, fmt: ScalarFormat) -> np.ndarray:
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


def _json_shape_and_words(array: np.ndarray, fmt: ScalarFormat) -> tuple[bytes, np.ndarray]:
    """The tensor's shape (as JSON numbers) and its words: flat, or ``(n, 2)`` (re, im) rows.

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
    return b"[" + b", ".join(b"%d" % d for d in shape) + b"]", words


def _values_json(words: np.ndarray, native: np.dtype) -> Iterator[bytes]:
    """The JSON array of ``words`` as byte pieces, at most ``_CHUNK`` values at a time."""
    yield b"["
    rows = max(1, _CHUNK // words.shape[-1]) if words.ndim == 2 else _CHUNK
    for start in range(0, len(words), rows):
        if start:
            yield b","
        chunk = np.ascontiguousarray(words[start : start + rows], dtype=native)
        yield orjson.dumps(chunk, option=orjson.OPT_SERIALIZE_NUMPY)[1:-1]
    yield b"]"


@names_the_file()
def write_state_bits(
    path: PathOrFile,
    arrays: Sequence[np.ndarray],
    encoding: str | ScalarFormat,
    *,
    pretty: bool = True,
) -> None:
    """Write arrays as exact-bits JSON model state.

    Every array is checked before the first byte is written; the document is then streamed
    one tensor at a time through an atomic write (a path ends up either the old file or the
    complete new one).

    Args:
        path: destination path, or a binary file object opened by the caller (written as is).
        arrays: one numpy array per state tensor, of the encoding's array dtype: the native
            dtype where numpy has one (float64, float32, float16, complex64, complex128),
            else unsigned storage words (uint16 for bfloat16, uint8 for the float8 formats);
            for a complex format without a native dtype (complex32), words with a trailing
            axis of 2 holding (re, im). Either byte order.
        encoding: a short name (``"float32"``, ``"bfloat16"``, ``"complex32"``, ...) or a
            full format tag (``"torchlean_state_binary_5_2_15_ieee_v1"``).
        pretty: indent the document, one line per tensor; ``False`` writes it compact.
            Either way any standard JSON reader accepts it.

    Returns:
        None.

    Raises:
        UnsupportedFormatError: ``encoding`` names no format we can write.
        CheckpointError: ``arrays`` is one array rather than a sequence, or an array has the
            wrong type or dtype, a word-pair array lacks its trailing axis of 2, or a word
            does not fit the format's width; raised before the destination is touched.
        OSError: from the file system; the old file is left as it was.

    Example:
        >>> write_state_bits("state.json", [np.zeros((2, 3), np.float32)], "float32")
    """
    fmt = _format_of(encoding)
    if isinstance(arrays, np.ndarray):
        raise CheckpointError(
            "arrays must be a sequence of arrays (one per state tensor), not one array",
            field="arrays",
        )
    try:
        items = list(arrays)
    except TypeError:
        raise CheckpointError(
            f"arrays must be a sequence of arrays, got {type(arrays).__name__}", field="arrays"
        ) from None
    checked = [_check_array(i, a, fmt) for i, a in enumerate(items)]
    native = np.dtype(fmt.word_dtype).newbyteorder("=")  # what orjson serialises
    tag = orjson.dumps(fmt.tag)
    if pretty:
        head = b'{\n  "format": ' + tag + b',\n  "state": ['
        open_entry, between = b'\n    {"shape": ', b', "values": '
        tail = b"\n  ]\n}\n" if checked else b"]\n}\n"
    else:
        head = b'{"format":' + tag + b',"state":['
        open_entry, between, tail = b'{"shape":', b',"values":', b"]}"
    with output(path) as f:
        f.write(head)
        for i, array in enumerate(checked):
            shape, words = _json_shape_and_words(array, fmt)
            f.write(b"," + open_entry if i else open_entry)
            f.write(shape if pretty else shape.replace(b" ", b""))
            f.write(between)
            for piece in _values_json(words, native):
                f.write(piece)
            f.write(b"}")
        f.write(tail)


# --------------------------------------------------------------------------- reading


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number (not an integer)"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return "null" if value is None else type(value).__name__


_INTEGER_LITERAL = re.compile(rb"-?[0-9]+(?![0-9.eE])")


def _json_error(exc: orjson.JSONDecodeError, data: bytes) -> MalformedError:
    """orjson's rejection as ours; an integer too large even for a double gets its own words."""
    literal = _INTEGER_LITERAL.match(data, exc.pos) if "infinity" in exc.msg else None
    if literal is not None:
        digits = len(literal.group()) - literal.group().startswith(b"-")
        return MalformedError(
            f"integer too large at position {exc.pos}: a {digits}-digit JSON integer is no word "
            "(word too wide)",
            field="document",
            actual=f"{digits}-digit integer",
            expected="integer 0 <= w < 2^64",
        )
    return MalformedError(
        f"not JSON: {exc.msg} (at position {exc.pos})", field="document", actual=exc.msg
    )


def _parse(data: bytes) -> tuple[Any, bytes | None]:
    """The general path: orjson's document, and the bytes when small enough to re-diagnose.

    A document naming a meaningful key twice is refused here, before anything else is
    judged: orjson keeps the last of them, other readers the first.
    """
    try:
        document = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise _json_error(exc, data) from None
    duplicate = duplicate_key_error(data, document)
    if duplicate is not None:
        raise duplicate
    return document, (data if len(data) <= _REDIAGNOSE_LIMIT else None)


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
    return sample >= _CUT_MIN_BYTES_PER_TENSOR * data.count(b'"values"', 0, sample)


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
    cut = json_words.cut_arrays(data, b"values", min_share)
    if cut is None or not len(cut[1]):
        return None
    remainder, spans = cut
    try:
        document = orjson.loads(remainder)
    except orjson.JSONDecodeError:
        return None
    state = document.get("state") if type(document) is dict else None
    if type(state) is not list or len(state) != len(spans) or set(map(type, state)) != {dict}:
        return None
    if [entry.get("values") for entry in state].count([]) != len(state):
        return None
    if not keys_counted_once(remainder, document):
        return None
    if fmt is None:
        tag = document.get("format")
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


def _parse_header(document: Any) -> tuple[str, list[Any]]:
    """The ``format`` tag and the ``state`` list of a parsed document."""
    if not isinstance(document, dict):
        raise MalformedError(
            f"top level is a JSON {_json_type(document)}, expected an object "
            '{"format": ..., "state": [...]}',
            field="document",
            actual=_json_type(document),
            expected="object",
        )
    if "format" not in document:
        raise UnsupportedFormatError(
            'no "format" tag: not an exact-bits state file', field="format", expected="a tag"
        )
    tag = document["format"]
    if not isinstance(tag, str):
        raise UnsupportedFormatError(
            f'"format" is a JSON {_json_type(tag)}, expected a string tag',
            field="format",
            actual=_short(tag),
            expected="string",
        )
    state = document.get("state", [])
    if not isinstance(state, list):
        raise MalformedError(
            f'"state" is a JSON {_json_type(state)}, expected an array of tensors',
            field="state",
            actual=_json_type(state),
            expected="array",
        )
    return tag, state


def _entry_fields(entry: Any, index: int) -> tuple[list[int], list[Any]]:
    """The checked ``shape`` and the ``values`` array of state tensor ``index``."""
    field = f"state[{index}]"
    if not isinstance(entry, dict):
        raise MalformedError(
            f"state tensor {index} is a JSON {_json_type(entry)}, expected an object "
            '{"shape": [...], "values": [...]}',
            field=field,
            actual=_json_type(entry),
            expected="object",
        )
    for key in ("shape", "values"):
        if key not in entry:
            raise MalformedError(
                f'state tensor {index} has no "{key}"', field=f"{field}.{key}", expected=key
            )
    shape, values = entry["shape"], entry["values"]
    if not isinstance(shape, list):
        raise MalformedError(
            f"shape of state tensor {index} is a JSON {_json_type(shape)}, expected an array "
            "of non-negative integers",
            field=f"{field}.shape",
            actual=_short(shape),
            expected="array",
        )
    if not set(map(type, shape)) <= {int} or (shape and min(shape) < 0):
        bad = next((d for d in shape if type(d) is not int or d < 0), shape)
        raise MalformedError(
            f"shape of state tensor {index} has dimension {_short(bad)}, expected a "
            "non-negative JSON integer",
            field=f"{field}.shape",
            actual=_short(shape),
            expected="non-negative integers",
        )
    if not isinstance(values, list):
        raise MalformedError(
            f"values of state tensor {index} are a JSON {_json_type(values)}, expected an array",
            field=f"{field}.values",
            actual=_json_type(values),
            expected="array",
        )
    return shape, values


def _element_count_is(shape: list[int], count: int) -> bool:
    """Whether ``prod(shape) == count``, without building huge products of hostile dims."""
    if 0 in shape:
        return count == 0
    product = 1
    for d in shape:
        product *= d
        if product > count:
            return False
    return product == count


class _HugeInteger(NamedTuple):
    """An integer literal too long to be worth converting; its sign and length say enough."""

    negative: bool
    digits: int

    def __str__(self) -> str:
        return f"{'-' if self.negative else ''}<{self.digits}-digit integer>"


def _parse_int_literal(text: str) -> int | _HugeInteger:
    if len(text) > 40:  # beyond any 64-bit word; int() of long strings is slow or refused
        negative = text.startswith("-")
        return _HugeInteger(negative, len(text) - negative)
    return int(text)


def _integer_literal(
    data: bytes | None, index: int, position: int, pair: bool
) -> int | _HugeInteger | None:
    """Re-read a small document with the stdlib: was this value an integer literal?

    orjson parses integers beyond 64 bits as floats; the stdlib keeps them. Returns the
    integer (or its sign and length), ``None`` for a float literal or when it cannot tell.
    """
    if data is None:
        return None
    try:
        document = json.loads(data, parse_int=_parse_int_literal, parse_float=lambda _: None)
        values = document["state"][index]["values"]
        value = values[position // 2][position % 2] if pair else values[position]
    except (ValueError, RecursionError, LookupError, TypeError):
        return None
    return value if type(value) in (int, _HugeInteger) else None


def _value_error(
    values: list[Any], index: int, fmt: ScalarFormat, data: bytes | None
) -> MalformedError:
    """The error for the first value that is not a word (error path: loops are fine here)."""
    limit = 1 << fmt.width
    position, value = next(
        ((k, v) for k, v in enumerate(values) if type(v) is not int or not 0 <= v < limit),
        (0, values[0] if values else None),  # unreachable: the callers found a bad value
    )
    if fmt.pair:
        where = f"value {position // 2} ({'im' if position % 2 else 're'})"
        field = f"state[{index}].values[{position // 2}][{position % 2}]"
    else:
        where, field = f"value {position}", f"state[{index}].values[{position}]"
    expected = f"integer 0 <= w < 2^{fmt.width}"
    literal: Any = value if type(value) is int else None
    # orjson reads integers beyond 64 bits as floats: a float this large may be one.
    maybe_integer = (
        isinstance(value, float)
        and math.isfinite(value)
        and value.is_integer()
        and not -(2**63) <= value < 2**64
    )
    if maybe_integer:
        literal = _integer_literal(data, index, position, fmt.pair)
    if literal is not None:
        negative = literal.negative if isinstance(literal, _HugeInteger) else literal < 0
        if negative:
            reason = f"negative word {literal}"
        elif isinstance(literal, int) and literal < 2**64:
            reason = f"word {literal}, too wide: not below 2^{fmt.width}"
        else:
            reason = f"integer {literal}, too large: word too wide, not below 2^{fmt.width}"
        return MalformedError(
            f"state tensor {index}: {where} is {reason} ({fmt.tag})",
            field=field,
            actual=str(literal),
            expected=expected,
        )
    if maybe_integer and data is None:  # too large a document to re-read and tell
        kind = "a float, or an integer too large for 64 bits (word too wide)"
    else:
        kind = f"a JSON {_json_type(value)}"
    return MalformedError(
        f"state tensor {index}: {where} is {_short(value)}, {kind}; expected a non-negative "
        f"integer word below 2^{fmt.width} ({fmt.tag})",
        field=field,
        actual=_short(value),
        expected=expected,
    )


def _words(values: list[Any], index: int, fmt: ScalarFormat, data: bytes | None) -> np.ndarray:
    """Validated uint64 words of one tensor's ``values`` (flat; complex: re, im interleaved)."""
    if fmt.pair:
        if not set(map(type, values)) <= {list} or not set(map(len, values)) <= {2}:
            k, bad = next(
                ((k, v) for k, v in enumerate(values) if type(v) is not list or len(v) != 2),
                (0, values),
            )
            raise MalformedError(
                f"state tensor {index}: value {k} is {_short(bad)}, expected a 2-element "
                f"array [re_word, im_word] ({fmt.tag})",
                field=f"state[{index}].values[{k}]",
                actual=_short(bad),
                expected="[re, im]",
            )
        flat = list(itertools.chain.from_iterable(values))
    else:
        flat = values
    # Set-level type check: booleans and floats are not integers (np.array would take them).
    if not set(map(type, flat)) <= {int}:
        raise _value_error(flat, index, fmt, data)
    try:
        words = np.array(flat, dtype=np.uint64)
    except OverflowError:  # a negative integer
        raise _value_error(flat, index, fmt, data) from None
    if _NUMPY_WRAPS_NEGATIVES and flat and min(flat) < 0:
        raise _value_error(flat, index, fmt, data)
    if fmt.width < 64 and words.size and int(words.max()) >> fmt.width:
        raise _value_error(flat, index, fmt, data)
    return words


def _as_arrays(
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


def _split_arrays(
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


_SHAPE = operator.itemgetter("shape")
_VALUES = operator.itemgetter("values")


def _expected_shapes(shapes: Iterable[Iterable[int]]) -> list[tuple[int, ...]]:
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
                f"{_short(shape)}",
                field=f"shapes[{i}]",
                actual=_short(shape),
            ) from None
        result.append(dims)
    return result


def _plain_shapes(state: list[Any]) -> list[list[int]] | None:
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


def _plain_lengths(state: list[Any]) -> list[int] | None:
    """Every entry's number of values when each ``values`` is an array, else ``None``."""
    try:
        values = list(map(_VALUES, state))
    except KeyError:
        return None
    return list(map(len, values)) if set(map(type, values)) <= {list} else None


def _counts_match(shapes: list[list[int]], lengths: list[int]) -> bool:
    """Whether every shape's element count is its length; ``False`` also when a shape has too
    many dimensions to multiply out cheaply (:func:`_element_count_is` then decides)."""
    if shapes and max(map(len, shapes)) > 64:  # dims < 2^64: products stay under 4096 bits
        return False
    return list(map(math.prod, shapes)) == lengths


def _plain_words(state: list[Any], fmt: ScalarFormat) -> np.ndarray | None:
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
    if _NUMPY_WRAPS_NEGATIVES and words and min(words) < 0:
        return None
    if fmt.width < 64 and array.size and int(array.max()) >> fmt.width:
        return None
    return array


@names_the_file()
@without_gc
def read_state_bits(
    path: PathOrFile, shapes: Sequence[Sequence[int]], encoding: str | ScalarFormat
) -> list[np.ndarray]:
    """Read exact-bits JSON model state, checking it against the expected layout.

    The file is refused from its first bytes if it cannot be exact-bits JSON, and from its
    size if it is larger than the largest valid encoding of ``shapes`` in ``encoding`` (see
    :mod:`~tlckpt.codec.json_document` for the allowances), before it is read.

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
    fmt = _format_of(encoding)
    expected = _expected_shapes(shapes)
    limit = largest_document(expected, fmt)
    bound = (
        f"the largest valid encoding of the expected {len(expected)} tensor(s) "
        f"of {_short_name(fmt) or fmt.tag}"
    )
    with open_source(path) as src:
        data = read_document(src, limit, bound)
        fast = _fast_document(data, fmt, min_share=_CUT_MIN_SHARE) if _worth_cutting(data) else None
        if fast is not None:
            try:
                return _checked_arrays(fast.document, fast.values, None, fmt, expected)
            except (CheckpointError, _NotFast):
                pass  # the general path below finds the same problem and words it
        document, diagnose = _parse(data)
        return _checked_arrays(document, None, diagnose, fmt, expected)


def _checked_arrays(
    document: Any,
    words: list[np.ndarray] | None,
    data: bytes | None,
    fmt: ScalarFormat,
    expected: list[tuple[int, ...]],
) -> list[np.ndarray]:
    """:func:`read_state_bits` on a parsed document; ``words``: the fast path's, checked."""
    tag, state = _parse_header(document)
    if tag != fmt.tag:
        raise UnsupportedFormatError(
            f"format {_short(tag)} is not the expected {fmt.tag!r}",
            field="format",
            actual=_short(tag),
            expected=fmt.tag,
        )
    n = len(expected)
    if len(state) > n:
        raise SchemaMismatchError(
            f"unexpected {len(state) - n} trailing state tensor(s): file has "
            f"{len(state)}, expected {n}",
            field="state",
            actual=len(state),
            expected=n,
        )
    shapes = _plain_shapes(state) if len(state) == n else None
    if shapes is not None and list(map(tuple, shapes)) == expected:
        lengths = list(map(len, words)) if words is not None else _plain_lengths(state)
        counts = list(map(math.prod, expected))
        if words is not None and lengths == counts:
            return _as_arrays(words, expected, fmt)
        flat = _plain_words(state, fmt) if lengths == counts else None
        if flat is not None:
            return _split_arrays(flat, counts, expected, fmt)
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
        shape, values = _entry_fields(state[i], i)
        if tuple(shape) != want:
            raise SchemaMismatchError(
                f"state tensor {i}: shape {_short(shape)} in file, expected {list(want)}",
                field=f"state[{i}].shape",
                actual=_short(shape),
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
        result.append(_words(values, i, fmt, data))
    return _as_arrays(result, expected, fmt)


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
        document, diagnose = _parse(data)
        return _described(document, None, diagnose, size)


def _described(
    document: Any, counts: np.ndarray | None, data: bytes | None, size: int
) -> dict[str, Any]:
    """:func:`inspect_state_bits` on a parsed document; ``counts``: the fast path's, checked."""
    tag, state = _parse_header(document)
    fmt = parse_tag(tag)
    if fmt is None:
        raise UnsupportedFormatError(
            f"format {_short(tag)} names no exact-bits encoding this library can hold",
            field="format",
            actual=_short(tag),
            expected="a torchlean_state_*_v1 tag",
        )
    shapes = _plain_shapes(state)
    if shapes is not None:
        lengths = counts.tolist() if counts is not None else _plain_lengths(state)
        if (
            lengths is not None
            and _counts_match(shapes, lengths)
            and (counts is not None or _plain_words(state, fmt) is not None)
        ):
            return _description(tag, fmt, shapes, lengths, size)
    if counts is not None:
        raise _NotFast  # a problem (or a shape of many dims): the general path judges it
    tensors = []
    for i, entry in enumerate(state):
        shape, values = _entry_fields(entry, i)
        if not _element_count_is(shape, len(values)):
            raise SchemaMismatchError(
                f"state tensor {i}: {len(values)} values in file for shape {_short(shape)}",
                field=f"state[{i}].values",
                actual=len(values),
                expected=f"prod({_short(shape)})",
            )
        _words(values, i, fmt, data)
        tensors.append(shape)
    return _description(tag, fmt, tensors, [len(entry["values"]) for entry in state], size)


def _description(
    tag: str, fmt: ScalarFormat, shapes: list[list[int]], lengths: list[int], size: int
) -> dict[str, Any]:
    return {
        "family": "state_bits",
        "format": tag,
        "encoding": _short_name(fmt),
        "tensors": [{"shape": s, "elements": n} for s, n in zip(shapes, lengths)],
        "bytes": size,
    }
