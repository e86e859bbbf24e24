"""Python values ↔ JSON, exactly or not at all (the values of a training-state document).

JSON holds ``None``, booleans, strings (valid UTF-8: no lone surrogate), lists,
string-keyed objects, integers (every reader of 64-bit integers keeps ``INT_RANGE``) and
finite binary64 numbers (orjson writes the shortest text that reads back to the same bits,
``-0.0`` included). Everything else a scheduler's ``state_dict`` or a caller's ``extra``
commonly holds is written as a tagged one-member object
(``formats.checkpoint_set.VALUE_TAGS``): an infinity or NaN (its exact bits), a larger
integer, a tuple, a mapping with keys that are not all plain strings, a
``collections.Counter``, ``OrderedDict``, ``deque`` (with its ``maxlen``) or ``defaultdict``
(of a known default factory), a ``set`` or ``frozenset``, a zero-dimensional tensor (by
dtype name and value; the runtime makes and reads those, see :class:`TensorScalar`).
Anything else (a tensor of more than one element, bytes, an object, a numpy scalar, an
``IntEnum``, a subclass of a supported type, a ``defaultdict`` of a lambda) is refused,
naming where it is: never pickled, never approximated.

Decoding is the exact inverse (types, order, ``maxlen`` and default factories included), and
refuses (:class:`~.errors.MalformedError`, naming the path) a tag it does not know, a
malformed tagged value, and nesting deeper than ``LIMITS.value_depth``. Depth is counted the
same way on both sides — one level per container, however it is tagged — so that a value
the encoder accepts is never too deep for the decoder.
"""

from __future__ import annotations

import builtins
import collections
import math
import re
import struct
import sys
from collections import Counter, OrderedDict, defaultdict, deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ...formats import checkpoint_set as layout
from ...formats.checkpoint_set import (
    DEFAULT_FACTORIES,
    INT_RANGE,
    TAG_COUNTER,
    TAG_DEFAULT_DICT,
    TAG_DEQUE,
    TAG_DICT,
    TAG_FLOAT,
    TAG_FROZENSET,
    TAG_INT,
    TAG_MARK,
    TAG_ORDERED_DICT,
    TAG_SET,
    TAG_TENSOR,
    TAG_TUPLE,
)
from ..errors import CheckpointError, MalformedError

__all__ = ["TensorScalar", "encode_value", "decode_value", "json_path"]

_BITS = re.compile(r"0x[0-9a-f]{16}")
_DIGITS = re.compile(r"-?[1-9][0-9]*")
#: The dtype names a tagged tensor scalar may have (torch's, without the ``torch.`` prefix).
_TENSOR_DTYPES = re.compile(r"[a-z][a-z0-9_]{0,31}")
#: Decimal conversion in chunks of this many digits, so that neither direction depends on
#: the process's ``sys.set_int_max_str_digits`` (the format's bound is ``int_digits``).
_CHUNK_DIGITS = 18
_CHUNK = 10**_CHUNK_DIGITS

#: A tagged mapping's tag → its type (each is written as its ``[key, value]`` pairs).
_MAPPING_TAGS: dict[str, type] = {
    TAG_DICT: dict,
    TAG_COUNTER: Counter,
    TAG_ORDERED_DICT: OrderedDict,
}
_TAG_OF_MAPPING = {Counter: TAG_COUNTER, OrderedDict: TAG_ORDERED_DICT}


def _named_type(name: str) -> type:
    """A default factory's type from its name in ``DEFAULT_FACTORIES`` (a builtin, or
    ``collections.<name>``)."""
    module, _, attribute = name.rpartition(".")
    return getattr(collections if module == "collections" else builtins, attribute)


#: The default factories a tagged ``defaultdict`` may have, by name (the format's table).
_FACTORY_TYPES: dict[str, type] = {name: _named_type(name) for name in DEFAULT_FACTORIES}
_FACTORY_NAMES = {t: name for name, t in _FACTORY_TYPES.items()}


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


def _decimal(n: int) -> str:
    """``str(n)``, in chunks that no ``int_max_str_digits`` setting refuses."""
    sign, n = ("-", -n) if n < 0 else ("", n)
    chunks = []
    while n >= _CHUNK:
        n, low = divmod(n, _CHUNK)
        chunks.append(f"{low:0{_CHUNK_DIGITS}d}")
    chunks.append(f"{n:d}")
    return sign + "".join(reversed(chunks))


def _from_decimal(text: str) -> int:
    """``int(text)`` for a checked decimal, in chunks (see :func:`_decimal`)."""
    sign, digits = (-1, text[1:]) if text.startswith("-") else (1, text)
    n = 0
    for start in range(0, len(digits), _CHUNK_DIGITS):
        chunk = digits[start : start + _CHUNK_DIGITS]
        n = n * 10 ** len(chunk) + int(chunk)
    return sign * n


def _refused(path: tuple, message: str, actual: Any = None) -> CheckpointError:
    where = json_path(path)
    return CheckpointError(f"{where} {message}", field=where, actual=actual)


def _key_part(key: Any, index: int) -> Any:
    """How a mapping's entry is named in a path: by its key when it is a string or an
    integer (``extra.note``, ``extra[3]``), else by its position."""
    if type(key) is str or type(key) is int:
        return key
    return f"<key {index}>"


class _Encoder:
    """One value's encoding: the bounds of :data:`~.checkpoint_set.LIMITS` as of the call."""

    def __init__(self) -> None:
        limits = layout.LIMITS
        self.depth_limit = limits.value_depth
        self.int_bound = 10**limits.int_digits  # |n| below it has at most int_digits digits
        self.int_digits = limits.int_digits

    def string(self, value: str, path: tuple) -> str:
        # isascii() is O(1) in CPython: only other strings pay for the UTF-8 check.
        if not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise _refused(
                    path,
                    f"is a string holding a lone surrogate ({value[exc.start : exc.end]!a} at"
                    f" index {exc.start}), which UTF-8 (and so JSON) cannot hold",
                    actual=ascii(value[:40]),
                ) from None
        return value

    def container(self, path: tuple, depth: int) -> None:
        if depth >= self.depth_limit:
            raise _refused(
                path,
                f"is nested more than {self.depth_limit} containers deep (the bound every"
                " reader of the document keeps)",
                actual=depth + 1,
            )

    def pairs(self, mapping: dict, path: tuple, depth: int) -> list[list[Any]]:
        out = []
        for i, (k, v) in enumerate(mapping.items()):
            part = _key_part(k, i)
            key = self.encode(k, (*path, f"<key {i}>"), depth + 1)
            out.append([key, self.encode(v, (*path, part), depth + 1)])
        return out

    def items(self, values: Iterable[Any], path: tuple, depth: int) -> list[Any]:
        return [self.encode(v, (*path, i), depth + 1) for i, v in enumerate(values)]

    def encode(self, value: Any, path: tuple, depth: int) -> Any:
        kind = type(value)
        if value is None or kind is bool:
            return value
        if kind is str:
            return self.string(value, path)
        if kind is int:
            if INT_RANGE[0] <= value <= INT_RANGE[1]:
                return value
            if not -self.int_bound < value < self.int_bound:
                raise _refused(
                    path,
                    f"is an integer of more than {self.int_digits} decimal digits (the most a"
                    " reader of the document takes)",
                    actual=f"{value.bit_length()} bits",
                )
            return {TAG_INT: _decimal(value)}
        if kind is float:
            return value if math.isfinite(value) else {TAG_FLOAT: _float_bits(value)}
        if kind is TensorScalar:
            return self.tensor(value, path, depth)
        self.container(path, depth)
        if kind is list:
            return self.items(value, path, depth)
        if kind is tuple:
            return {TAG_TUPLE: self.items(value, path, depth)}
        if kind is dict:
            if all(type(k) is str and not k.startswith(TAG_MARK) for k in value):
                return {
                    self.string(k, (*path, f"<key {i}>")): self.encode(v, (*path, k), depth + 1)
                    for i, (k, v) in enumerate(value.items())
                }
            return {TAG_DICT: self.pairs(value, path, depth)}
        if kind in _TAG_OF_MAPPING:
            return {_TAG_OF_MAPPING[kind]: self.pairs(value, path, depth)}
        if kind is defaultdict:
            factory = value.default_factory
            if factory is not None and factory not in _FACTORY_NAMES:
                raise _refused(
                    path,
                    f"is a defaultdict whose default factory is {factory!r}; a saved"
                    f" defaultdict's factory is one of {', '.join(DEFAULT_FACTORIES)} or None"
                    " (code is never saved)",
                    actual=repr(factory)[:60],
                )
            name = None if factory is None else _FACTORY_NAMES[factory]
            return {TAG_DEFAULT_DICT: [name, *self.pairs(value, path, depth)]}
        if kind is deque:
            return {TAG_DEQUE: [value.maxlen, *self.items(value, path, depth)]}
        if kind is set or kind is frozenset:
            tag = TAG_SET if kind is set else TAG_FROZENSET
            return {tag: self.items(value, path, depth)}
        raise _refused(
            path,
            f"is a {kind.__module__}.{kind.__qualname__}, which JSON cannot hold exactly; a"
            " training-state value must be None, bool, int, float, str, or a list, tuple,"
            " dict, set, frozenset, collections.Counter, OrderedDict, deque or defaultdict"
            " of those (never pickled)",
            actual=kind.__qualname__,
        )

    def tensor(self, value: TensorScalar, path: tuple, depth: int) -> Any:
        # The reader's rules for a tagged tensor, checked before anything is written.
        if type(value.dtype) is not str or not _TENSOR_DTYPES.fullmatch(value.dtype):
            raise _refused(path, f"is a tensor of dtype {value.dtype!r}, not a dtype name")
        if type(value.value) not in (bool, int, float):
            raise _refused(
                path,
                f"is a tensor whose value is a {type(value.value).__qualname__}; a saved"
                " zero-dimensional tensor holds a number or a boolean",
                actual=type(value.value).__qualname__,
            )
        return {TAG_TENSOR: [value.dtype, self.encode(value.value, (*path, "value"), depth + 1)]}


def encode_value(value: Any, path: tuple) -> Any:
    """``value`` as a JSON-able value that :func:`decode_value` turns back into it exactly.

    Args:
        value: ``None``, ``bool``, ``int``, ``float``, ``str``, ``list``, ``tuple``,
            ``dict``, ``set``, ``frozenset``, ``collections.Counter``, ``OrderedDict``,
            ``deque`` or ``defaultdict`` (of a factory in ``DEFAULT_FACTORIES``), or
            :class:`TensorScalar`, nested; keys of any of these kinds that are hashable.
        path: where ``value`` is, for errors (``("scheduler",)``).

    Returns:
        The value of JSON types only (orjson writes it without error).

    Raises:
        CheckpointError: a value of another type (a subclass included), a string with a
            lone surrogate, an integer of more than ``LIMITS.int_digits`` digits, or
            containers nested deeper than ``LIMITS.value_depth``; the message names the path.
    """
    return _Encoder().encode(value, path, 0)


def _malformed(path: tuple, message: str, actual: Any = None) -> MalformedError:
    where = json_path(path)
    return MalformedError(f"{where}: {message}", field=where, actual=actual)


class _Decoder:
    """One value's decoding: the bounds of :data:`~.checkpoint_set.LIMITS` as of the call."""

    def __init__(self) -> None:
        limits = layout.LIMITS
        self.depth_limit = limits.value_depth
        self.int_digits = limits.int_digits

    def container(self, path: tuple, depth: int) -> None:
        if depth >= self.depth_limit:
            raise _malformed(path, f"nested more than {self.depth_limit} levels deep")

    def body_list(self, tag: str, body: Any, path: tuple, minimum: int = 0) -> list[Any]:
        if type(body) is not list or len(body) < minimum:
            raise _malformed(path, f"{tag} must be an array", type(body).__name__)
        return body

    def hashable(self, value: Any, path: tuple, what: str) -> Any:
        try:
            hash(value)
        except TypeError:
            raise _malformed(path, f"{what} must be hashable (not a list, dict or set)") from None
        return value

    def mapping(self, result: Any, pairs: list[Any], path: tuple, depth: int) -> Any:
        for i, pair in enumerate(pairs):
            if type(pair) is not list or len(pair) != 2:
                raise _malformed((*path, i), "a pair must be [key, value]")
            key = self.decode(pair[0], (*path, i, 0), depth + 1)
            self.hashable(key, (*path, i, 0), "a key")
            if key in result:
                raise _malformed((*path, i, 0), f"duplicate key {key!r}"[:120])
            result[key] = self.decode(pair[1], (*path, i, 1), depth + 1)
        return result

    def items(self, body: list[Any], path: tuple, depth: int) -> list[Any]:
        return [self.decode(v, (*path, i), depth + 1) for i, v in enumerate(body)]

    def decode(self, value: Any, path: tuple, depth: int) -> Any:
        kind = type(value)
        if kind is list:
            self.container(path, depth)
            return self.items(value, path, depth)
        if kind is not dict:
            return value  # None, bool, int, float, str: as JSON has them
        if len(value) != 1 or not next(iter(value)).startswith(TAG_MARK):
            self.container(path, depth)
            for k in value:
                if k.startswith(TAG_MARK):
                    raise _malformed(
                        path, f"key {k[:40]!r} starts with {TAG_MARK!r} in a plain object"
                    )
            return {k: self.decode(v, (*path, k), depth + 1) for k, v in value.items()}
        ((tag, body),) = value.items()
        if tag == TAG_FLOAT:
            if type(body) is not str or not _BITS.fullmatch(body):
                raise _malformed(path, f"{tag} must be 0x and 16 hex digits", body)
            x = struct.unpack("<d", struct.pack("<Q", int(body, 16)))[0]
            if math.isfinite(x):
                raise _malformed(path, f"{tag} holds a finite number ({x!r}): write it plainly")
            return x
        if tag == TAG_INT:
            return self.integer(body, path)
        if tag == TAG_TENSOR:
            return self.tensor(body, path, depth)
        self.container(path, depth)
        if tag == TAG_TUPLE:
            return tuple(self.items(self.body_list(tag, body, path), path, depth))
        if tag in _MAPPING_TAGS:
            pairs = self.body_list(tag, body, path)
            return self.mapping(_MAPPING_TAGS[tag](), pairs, path, depth)
        if tag == TAG_DEFAULT_DICT:
            body = self.body_list(tag, body, path, minimum=1)
            name = body[0]
            if name is not None and (type(name) is not str or name not in _FACTORY_TYPES):
                raise _malformed(
                    path,
                    f"{tag}: the default factory must be null or one of"
                    f" {', '.join(DEFAULT_FACTORIES)}",
                    str(name)[:40],
                )
            result = defaultdict(None if name is None else _FACTORY_TYPES[name])
            return self.mapping(result, body[1:], path, depth)
        if tag == TAG_DEQUE:
            body = self.body_list(tag, body, path, minimum=1)
            maxlen = body[0]
            if maxlen is not None and (
                type(maxlen) is not int or not len(body) - 1 <= maxlen <= sys.maxsize
            ):
                raise _malformed(
                    path,
                    f"{tag}: maxlen must be null or an integer from its item count to"
                    f" {sys.maxsize}",
                    maxlen,
                )
            return deque(self.items(body[1:], path, depth), maxlen)
        if tag in (TAG_SET, TAG_FROZENSET):
            members: set[Any] = set()
            for i, item in enumerate(self.items(self.body_list(tag, body, path), path, depth)):
                if self.hashable(item, (*path, i), "a set's item") in members:
                    raise _malformed((*path, i), f"{tag}: duplicate item {item!r}"[:120])
                members.add(item)
            return members if tag == TAG_SET else frozenset(members)
        raise _malformed(path, f"unknown tag {tag[:40]!r}", tag[:40])

    def integer(self, body: Any, path: tuple) -> int:
        if (
            type(body) is not str
            or len(body.removeprefix("-")) > self.int_digits
            or not _DIGITS.fullmatch(body)
        ):
            raise _malformed(
                path,
                f"{TAG_INT} must be up to {self.int_digits} decimal digits, without leading zeros",
                str(body)[:40],
            )
        n = _from_decimal(body)
        if INT_RANGE[0] <= n <= INT_RANGE[1]:
            raise _malformed(path, f"{TAG_INT} holds {n}, which JSON holds plainly", body)
        return n

    def tensor(self, body: Any, path: tuple, depth: int) -> TensorScalar:
        if type(body) is not list or len(body) != 2 or type(body[0]) is not str:
            raise _malformed(path, f"{TAG_TENSOR} must be [dtype name, value]")
        if not _TENSOR_DTYPES.fullmatch(body[0]):
            raise _malformed(path, f"{TAG_TENSOR}: not a dtype name: {body[0][:40]!r}")
        scalar = self.decode(body[1], (*path, "value"), depth + 1)
        if type(scalar) not in (bool, int, float):
            raise _malformed(path, f"{TAG_TENSOR}: the value must be a number or a boolean")
        return TensorScalar(body[0], scalar)


def decode_value(value: Any, path: tuple) -> Any:
    """The Python value :func:`encode_value` made ``value`` from (``value`` as orjson parsed
    it: only JSON types).

    Args:
        value: the parsed JSON value.
        path: where it is, for errors (``("extra",)``).

    Returns:
        The value, of the types :func:`encode_value` takes.

    Raises:
        MalformedError: an unknown tag, a malformed tagged value, a key or set item that
            cannot be one (unhashable, twice), or containers nested deeper than
            ``LIMITS.value_depth``; the message names the path.
    """
    return _Decoder().decode(value, path, 0)
