"""The general path of the exact-bits JSON reader, and every error it words.

orjson parses the whole document (bounded nesting, no code execution); a document naming a
meaningful key twice is refused before anything else is judged (:func:`parse_document`).
Then each part is checked in document order, and the first thing wrong gets its message:
the top-level object (:func:`parse_header`), each tensor entry (:func:`entry_fields`) and
its words (:func:`words_of`). Loops over values happen here only on the way to an error.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from typing import Any, NamedTuple, TypeVar

import numpy as np
import orjson

from ...formats.state_bits import (
    DOCUMENT_SKETCH,
    ENTRY_KEYS,
    ENTRY_SKETCH,
    FORMAT_KEY,
    SHAPE_KEY,
    STATE_KEY,
    VALUES_KEY,
    ScalarFormat,
)
from ..errors import CheckpointError, MalformedError, UnsupportedFormatError
from .json_document import duplicate_key_error
from .state_words import NUMPY_WRAPS_NEGATIVES, short

__all__ = [
    "REDIAGNOSE_LIMIT",
    "json_type",
    "json_error",
    "parse_document",
    "parse_header",
    "entry_fields",
    "element_count_is",
    "value_error",
    "words_of",
]

#: Largest document re-parsed with the stdlib to tell a too-large integer from a float
#: (orjson turns integers beyond 64 bits into floats); only ever on the error path.
REDIAGNOSE_LIMIT = 8 << 20

_E = TypeVar("_E", bound=CheckpointError)


#: JSON's name for what a parsed value is, by Python type (``bool`` before ``int``, its base).
_JSON_TYPES = (
    (bool, "boolean"),
    (int, "integer"),
    (float, "number (not an integer)"),
    (str, "string"),
    (list, "array"),
    (dict, "object"),
    (type(None), "null"),
)


def json_type(value: Any) -> str:
    """What a parsed JSON value is, in JSON's words (for messages)."""
    return next((name for t, name in _JSON_TYPES if isinstance(value, t)), type(value).__name__)


_INTEGER_LITERAL = re.compile(rb"-?[0-9]+(?![0-9.eE])")


def json_error(exc: orjson.JSONDecodeError, data: bytes) -> MalformedError:
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


def parse_document(data: bytes) -> tuple[Any, bytes | None]:
    """The general path: orjson's document, and the bytes when small enough to re-diagnose.

    A document naming a meaningful key twice is refused here, before anything else is
    judged: orjson keeps the last of them, other readers the first.
    """
    try:
        document = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise json_error(exc, data) from None
    duplicate = duplicate_key_error(data, document)
    if duplicate is not None:
        raise duplicate
    return document, (data if len(data) <= REDIAGNOSE_LIMIT else None)


def _not_a(cls: type[_E], what: str, value: Any, wanted: str, field: str, actual: Any = None) -> _E:
    """The error for ``what``, a JSON ``value`` that is not ``wanted`` (``actual``: its
    JSON type unless given; ``expected``: the type ``wanted`` names, its second word)."""
    return cls(
        f"{what} is a JSON {json_type(value)}, expected {wanted}",
        field=field,
        actual=json_type(value) if actual is None else actual,
        expected=wanted.split()[1],
    )


def parse_header(document: Any) -> tuple[str, list[Any]]:
    """The ``format`` tag and the ``state`` list of a parsed document."""
    if not isinstance(document, dict):
        raise _not_a(
            MalformedError, "top level", document, f"an object {DOCUMENT_SKETCH}", "document"
        )
    if FORMAT_KEY not in document:
        raise UnsupportedFormatError(
            f'no "{FORMAT_KEY}" tag: not an exact-bits state file',
            field=FORMAT_KEY,
            expected="a tag",
        )
    tag = document[FORMAT_KEY]
    if not isinstance(tag, str):
        what = f'"{FORMAT_KEY}"'
        raise _not_a(UnsupportedFormatError, what, tag, "a string tag", FORMAT_KEY, short(tag))
    state = document.get(STATE_KEY, [])
    if not isinstance(state, list):
        raise _not_a(MalformedError, f'"{STATE_KEY}"', state, "an array of tensors", STATE_KEY)
    return tag, state


def entry_fields(entry: Any, index: int) -> tuple[list[int], list[Any]]:
    """The checked ``shape`` and the ``values`` array of state tensor ``index``."""
    field = f"state[{index}]"
    if not isinstance(entry, dict):
        raise _not_a(
            MalformedError, f"state tensor {index}", entry, f"an object {ENTRY_SKETCH}", field
        )
    for key in ENTRY_KEYS:
        if key not in entry:
            raise MalformedError(
                f'state tensor {index} has no "{key}"', field=f"{field}.{key}", expected=key
            )
    shape, values = entry[SHAPE_KEY], entry[VALUES_KEY]
    if not isinstance(shape, list):
        raise MalformedError(
            f"shape of state tensor {index} is a JSON {json_type(shape)}, expected an array "
            "of non-negative integers",
            field=f"{field}.shape",
            actual=short(shape),
            expected="array",
        )
    if not set(map(type, shape)) <= {int} or (shape and min(shape) < 0):
        bad = next((d for d in shape if type(d) is not int or d < 0), shape)
        raise MalformedError(
            f"shape of state tensor {index} has dimension {short(bad)}, expected a "
            "non-negative JSON integer",
            field=f"{field}.shape",
            actual=short(shape),
            expected="non-negative integers",
        )
    if not isinstance(values, list):
        raise MalformedError(
            f"values of state tensor {index} are a JSON {json_type(values)}, expected an array",
            field=f"{field}.values",
            actual=json_type(values),
            expected="array",
        )
    return shape, values


def element_count_is(shape: list[int], count: int) -> bool:
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
        values = document[STATE_KEY][index][VALUES_KEY]
        value = values[position // 2][position % 2] if pair else values[position]
    except (ValueError, RecursionError, LookupError, TypeError):
        return None
    return value if type(value) in (int, _HugeInteger) else None


def value_error(
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
        kind = f"a JSON {json_type(value)}"
    return MalformedError(
        f"state tensor {index}: {where} is {short(value)}, {kind}; expected a non-negative "
        f"integer word below 2^{fmt.width} ({fmt.tag})",
        field=field,
        actual=short(value),
        expected=expected,
    )


def words_of(values: list[Any], index: int, fmt: ScalarFormat, data: bytes | None) -> np.ndarray:
    """Validated uint64 words of one tensor's ``values`` (flat; complex: re, im interleaved)."""
    if fmt.pair:
        if not set(map(type, values)) <= {list} or not set(map(len, values)) <= {2}:
            k, bad = next(
                ((k, v) for k, v in enumerate(values) if type(v) is not list or len(v) != 2),
                (0, values),
            )
            raise MalformedError(
                f"state tensor {index}: value {k} is {short(bad)}, expected a 2-element "
                f"array [re_word, im_word] ({fmt.tag})",
                field=f"state[{index}].values[{k}]",
                actual=short(bad),
                expected="[re, im]",
            )
        flat = list(itertools.chain.from_iterable(values))
    else:
        flat = values
    # Set-level type check: booleans and floats are not integers (np.array would take them).
    if not set(map(type, flat)) <= {int}:
        raise value_error(flat, index, fmt, data)
    try:
        words = np.array(flat, dtype=np.uint64)
    except OverflowError:  # a negative integer
        raise value_error(flat, index, fmt, data) from None
    if NUMPY_WRAPS_NEGATIVES and flat and min(flat) < 0:
        raise value_error(flat, index, fmt, data)
    if fmt.width < 64 and words.size and int(words.max()) >> fmt.width:
        raise value_error(flat, index, fmt, data)
    return words
