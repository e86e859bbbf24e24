"""Python values ↔ JSON, exactly or not at all (the values of a training-state document).

JSON holds ``None``, booleans, strings, lists, string-keyed objects, integers (every reader
of 64-bit integers keeps ``INT_RANGE``) and finite binary64 numbers (orjson writes the
shortest text that reads back to the same bits, ``-0.0`` included). Everything else a
scheduler's ``state_dict`` or a caller's ``extra`` commonly holds is written as a tagged
one-member object (``formats.checkpoint_set.VALUE_TAGS``): an infinity or NaN (its exact
bits), a larger integer, a tuple, a mapping with keys that are not all plain strings, a
zero-dimensional tensor (by dtype name and value; the runtime makes and reads those, see
:class:`TensorScalar`). Anything else (a tensor of more than one element, bytes, an object,
a numpy scalar, an ``IntEnum``) is refused, naming where it is: never pickled, never
approximated.

Decoding is the exact inverse, and refuses (:class:`~.errors.MalformedError`, naming the
path) a tag it does not know, a malformed tagged value, and nesting deeper than
``MAX_VALUE_DEPTH``.
"""

from __future__ import annotations

import math
import re
import struct
from dataclasses import dataclass
from typing import Any

from ..formats.checkpoint_set import (
    INT_RANGE,
    MAX_INT_DIGITS,
    MAX_VALUE_DEPTH,
    TAG_DICT,
    TAG_FLOAT,
    TAG_INT,
    TAG_MARK,
    TAG_TENSOR,
    TAG_TUPLE,
)
from .errors import CheckpointError, MalformedError

__all__ = ["TensorScalar", "encode_value", "decode_value", "json_path"]

_BITS = re.compile(r"0x[0-9a-f]{16}")
_DIGITS = re.compile(rf"-?[0-9]{{1,{MAX_INT_DIGITS}}}")
#: The dtype names a tagged tensor scalar may have (torch's, without the ``torch.`` prefix).
_TENSOR_DTYPES = re.compile(r"[a-z][a-z0-9_]{0,31}")


@dataclass(frozen=True)
class TensorScalar:
    """A zero-dimensional tensor as a document holds it (torch-free).

    Attributes:
        dtype: torch's name of its dtype without the prefix (``"float32"``).
        value: its value, as an exactly decodable Python value (a float holds every
            float32/float16/bfloat16 value exactly; an integer or bool as is).
    """

    dtype: str
    value: Any


def json_path(path: tuple) -> str:
    """``("scheduler", "base_lrs", 1)`` → ``"scheduler.base_lrs[1]"``."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _float_bits(x: float) -> str:
    return f"0x{struct.unpack('<Q', struct.pack('<d', x))[0]:016x}"


def encode_value(value: Any, path: tuple) -> Any:
    """``value`` as a JSON-able value that :func:`decode_value` turns back into it exactly.

    Args:
        value: ``None``, ``bool``, ``int``, ``float``, ``str``, ``list``, ``tuple``, ``dict``
            (any keys of these kinds) or :class:`TensorScalar`, nested.
        path: where ``value`` is, for errors (``("scheduler",)``).

    Raises:
        CheckpointError: a value of another type, or nesting deeper than
            ``MAX_VALUE_DEPTH``; the message names the path.
    """
    if len(path) > MAX_VALUE_DEPTH:
        raise CheckpointError(
            f"{json_path(path)}: nested more than {MAX_VALUE_DEPTH} levels deep",
            field=json_path(path),
        )
    kind = type(value)
    if value is None or kind is bool or kind is str:
        return value
    if kind is int:
        if INT_RANGE[0] <= value <= INT_RANGE[1]:
            return value
        return {TAG_INT: str(value)}
    if kind is float:
        return value if math.isfinite(value) else {TAG_FLOAT: _float_bits(value)}
    if kind is list:
        return [encode_value(v, (*path, i)) for i, v in enumerate(value)]
    if kind is tuple:
        return {TAG_TUPLE: [encode_value(v, (*path, i)) for i, v in enumerate(value)]}
    if kind is dict:
        if all(type(k) is str and not k.startswith(TAG_MARK) for k in value):
            return {k: encode_value(v, (*path, k)) for k, v in value.items()}
        pairs = []
        for i, (k, v) in enumerate(value.items()):
            key = encode_value(k, (*path, f"<key {i}>"))
            pairs.append([key, encode_value(v, (*path, k if type(k) is str else i))])
        return {TAG_DICT: pairs}
    if kind is TensorScalar:
        return {TAG_TENSOR: [value.dtype, encode_value(value.value, (*path, "value"))]}
    where = json_path(path)
    raise CheckpointError(
        f"{where} is a {kind.__module__}.{kind.__qualname__}, which JSON cannot hold exactly;"
        " a training-state value must be None, bool, int, float, str, or a list, tuple or dict"
        " of those (never pickled)",
        field=where,
        actual=kind.__qualname__,
    )


def _malformed(path: tuple, message: str, actual: Any = None) -> MalformedError:
    where = json_path(path)
    return MalformedError(f"{where}: {message}", field=where, actual=actual)


def decode_value(value: Any, path: tuple) -> Any:
    """The Python value :func:`encode_value` made ``value`` from (``value`` as orjson parsed
    it: only JSON types).

    Raises:
        MalformedError: an unknown tag, a malformed tagged value, a dict key that cannot be
            one, or nesting deeper than ``MAX_VALUE_DEPTH``; the message names the path.
    """
    if len(path) > MAX_VALUE_DEPTH:
        raise _malformed(path, f"nested more than {MAX_VALUE_DEPTH} levels deep")
    kind = type(value)
    if kind is list:
        return [decode_value(v, (*path, i)) for i, v in enumerate(value)]
    if kind is not dict:
        return value  # None, bool, int, float, str: as JSON has them
    if len(value) != 1 or not next(iter(value)).startswith(TAG_MARK):
        for k in value:
            if k.startswith(TAG_MARK):
                raise _malformed(path, f"key {k!r} starts with {TAG_MARK!r} in a plain object")
        return {k: decode_value(v, (*path, k)) for k, v in value.items()}
    ((tag, body),) = value.items()
    if tag == TAG_FLOAT:
        if type(body) is not str or not _BITS.fullmatch(body):
            raise _malformed(path, f"{tag} must be 0x and 16 hex digits", body)
        x = struct.unpack("<d", struct.pack("<Q", int(body, 16)))[0]
        if math.isfinite(x):
            raise _malformed(path, f"{tag} holds a finite number ({x!r}): write it plainly", body)
        return x
    if tag == TAG_INT:
        if type(body) is not str or not _DIGITS.fullmatch(body):
            raise _malformed(path, f"{tag} must be up to {MAX_INT_DIGITS} decimal digits", body)
        n = int(body)
        if INT_RANGE[0] <= n <= INT_RANGE[1]:
            raise _malformed(path, f"{tag} holds {n}, which JSON holds plainly", body)
        return n
    if tag == TAG_TUPLE:
        if type(body) is not list:
            raise _malformed(path, f"{tag} must be an array", type(body).__name__)
        return tuple(decode_value(v, (*path, i)) for i, v in enumerate(body))
    if tag == TAG_DICT:
        if type(body) is not list:
            raise _malformed(path, f"{tag} must be an array of [key, value]", type(body).__name__)
        out: dict[Any, Any] = {}
        for i, pair in enumerate(body):
            if type(pair) is not list or len(pair) != 2:
                raise _malformed((*path, i), "a pair must be [key, value]")
            key = decode_value(pair[0], (*path, i, 0))
            try:
                hash(key)
            except TypeError:
                raise _malformed(
                    (*path, i, 0), "a key must be hashable (not a list or dict)"
                ) from None
            if key in out:
                raise _malformed((*path, i, 0), f"duplicate key {key!r}")
            out[key] = decode_value(pair[1], (*path, i, 1))
        return out
    if tag == TAG_TENSOR:
        if type(body) is not list or len(body) != 2 or type(body[0]) is not str:
            raise _malformed(path, f"{tag} must be [dtype name, value]")
        if not _TENSOR_DTYPES.fullmatch(body[0]):
            raise _malformed(path, f"{tag}: not a dtype name: {body[0][:40]!r}")
        scalar = decode_value(body[1], (*path, "value"))
        if type(scalar) not in (bool, int, float):
            raise _malformed(path, f"{tag}: the value must be a number or a boolean")
        return TensorScalar(body[0], scalar)
    raise _malformed(path, f"unknown tag {tag!r}", tag)
