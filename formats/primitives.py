"""Building blocks shared by every format spec: u64, checked fields, streamed payloads.

These are ordinary ``construct`` constructs, so every spec can also be parsed and built by
construct itself (the slow, fully interpreted reference path). The codec recognises
:class:`Payload` and streams its bytes between the file and caller buffers instead.

Whoever reads a spec's tree (the codec's plan compiler, ``layout_of``, the reference
generator) unwraps its named fields with :func:`unwrap`; whoever handles a u64 or a binary64
outside a spec (a fuzz seed, a hex pattern in a description) packs it with the helpers here,
which read their byte layout off :data:`U64` and :data:`F64`.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Callable
from typing import Any

import numpy as np
from construct import (
    Array,
    Construct,
    ConstructError,
    Float64l,
    Int64ul,
    Renamed,
    SizeofError,
    Struct,
    Subconstruct,
    stream_read,
    stream_write,
)
from construct.core import evaluate

__all__ = [
    "U64",
    "U64_MAX",
    "U64_SIZE",
    "F64",
    "TextEnum",
    "Category",
    "CATEGORIES",
    "InvalidField",
    "Valid",
    "Payload",
    "flag",
    "product",
    "unwrap",
    "field_path",
    "pack_u64",
    "unpack_u64",
    "float_bits",
    "bits_float",
]

#: Every integer of the binary families: unsigned 64-bit little-endian.
U64 = Int64ul
U64_MAX = 2**64 - 1
#: Bytes of one u64 (a dim, a tag, a count): what an offset inside a u64 array steps by.
U64_SIZE: int = U64.sizeof()
#: Every float of the binary families (the Adam hyperparameters): binary64, little-endian.
F64 = Float64l

_U64 = struct.Struct(U64.fmtstr)
_F64 = struct.Struct(F64.fmtstr)


class TextEnum(str, enum.Enum):
    """An enum whose members are their words: they compare, hash, print and format as the
    plain strings (``Category.SCHEMA == "schema"``, ``f"{Category.SCHEMA}"`` is ``schema``),
    so output and older callers that use the words see no difference."""

    __str__ = str.__str__
    __format__ = str.__format__


class Category(TextEnum):
    """What a failed check means; the codec maps each category to one error class.

    The values are the words of the conformance manifest (``tests/vectors/README.md``).
    """

    FAMILY = "family"
    VERSION = "version"
    TRUNCATED = "truncated"
    TRAILING = "trailing"
    SCHEMA = "schema"
    CONFIG = "config"
    ENTRY = "entry"
    MALFORMED = "malformed"


#: Every category a :class:`Valid` check may name.
CATEGORIES = frozenset(c.value for c in Category)


class InvalidField(ConstructError):
    """A :class:`Valid` check failed; carries what the codec needs for a precise error."""

    def __init__(self, message: str, *, category: str, expected: str, actual: Any, path: str):
        super().__init__(message, path=path)
        self.category = category
        self.expected = expected
        self.actual = actual


class Valid(Subconstruct):
    """A field with its check attached, like Kaitai's ``valid:``.

    Args:
        subcon: the field's encoding (usually :data:`U64`).
        check: ``check(value, context) -> bool``.
        expected: how the rule reads in an error message ("0 or 1", "< 1", ...).
        category: a :class:`Category` (or its value); decides the error class the codec raises.
    """

    def __init__(
        self,
        subcon: Construct,
        check: Callable[[Any, Any], bool],
        *,
        expected: str,
        category: str,
    ):
        if category not in CATEGORIES:
            raise ValueError(f"unknown category {category!r}")
        super().__init__(subcon)
        self.check = check
        self.expected = expected
        self.category = Category(category)

    def _fail(self, obj: Any, path: str) -> InvalidField:
        return InvalidField(
            f"validation failed: expected {self.expected}, actual {obj!r}",
            category=self.category,
            expected=self.expected,
            actual=obj,
            path=path,
        )

    def _parse(self, stream, context, path):
        obj = self.subcon._parsereport(stream, context, path)
        if not self.check(obj, context):
            raise self._fail(obj, path)
        return obj

    def _build(self, obj, stream, context, path):
        if not self.check(obj, context):
            raise self._fail(obj, path)
        return self.subcon._build(obj, stream, context, path)


def _zero_or_one(value: Any, _: Any) -> bool:
    return value in (0, 1)


def flag(category: str) -> Valid:
    """A u64 that must be 0 or 1 (a yes/no field); any other value is an error of
    ``category``."""
    return Valid(U64, _zero_or_one, expected="0 or 1", category=category)


class Payload(Construct):
    """``count`` little-endian scalars of ``dtype``: a tensor's bytes.

    The codec never lets payload bytes pass through construct objects: it streams them with
    ``readinto`` / ``write(memoryview)``. Parsing through construct (the reference path used
    by tests) returns a numpy array.

    Args:
        count: element count, a constant or a context lambda (``this.count``).
        dtype: numpy dtype string, or a context lambda returning one (v5 chooses per file).
    """

    def __init__(self, count: Any, dtype: Any):
        super().__init__()
        self.count = count
        self.dtype = dtype
        # Most payloads have one dtype per version: resolve it once, not per record.
        self.fixed_dtype = None if callable(dtype) else np.dtype(dtype).newbyteorder("<")

    def resolve(self, context: Any) -> tuple[int, np.dtype]:
        """Element count and little-endian dtype for this record."""
        count = evaluate(self.count, context)
        dtype = self.fixed_dtype
        if dtype is None:
            dtype = np.dtype(evaluate(self.dtype, context)).newbyteorder("<")
        return count, dtype

    def _parse(self, stream, context, path):
        count, dtype = self.resolve(context)
        data = stream_read(stream, count * dtype.itemsize, path)
        return np.frombuffer(data, dtype=dtype).copy()

    def _build(self, obj, stream, context, path):
        count, dtype = self.resolve(context)
        array = np.ascontiguousarray(obj, dtype=dtype).reshape(-1)
        if array.size != count:
            raise InvalidField(
                f"payload has {array.size} elements, header says {count}",
                category=Category.ENTRY,
                expected=str(count),
                actual=array.size,
                path=path,
            )
        stream_write(stream, array.tobytes(), array.nbytes, path)
        return obj

    def _sizeof(self, context, path):
        raise SizeofError("payload size depends on the record", path=path)


def product(dims: Any) -> int:
    """Element count of a shape: the product of its dims, 1 for rank 0.

    Capped: once the running product passes ``U64_MAX`` it returns ``U64_MAX + 1`` (no u64
    count can equal it), so a hostile file with thousands of huge dims costs linear time,
    not a quadratic bigint product.
    """
    dims = [int(d) for d in dims]
    if 0 in dims:
        return 0
    total = 1
    for d in dims:
        total *= d
        if total > U64_MAX:
            return U64_MAX + 1
    return total


def unwrap(sc: Construct) -> Construct:
    """``sc`` without its ``Renamed`` wrappers (a field's name and ``*`` docs).

    Every reader of a spec's tree goes through this one function, so a construct that wraps
    fields differently is taught to all of them at once.
    """
    while isinstance(sc, Renamed):
        sc = sc.subcon
    return sc


def field_path(spec: Struct, *names: str) -> tuple[str, ...]:
    """The spec path of a field: ``names`` from the top of ``spec`` down, through sub-structs
    and the records of arrays; readers dispatch on such paths, declared next to the spec.

    Raises:
        ValueError: ``spec`` has no such field (a path that drifted from its spec fails when
            the spec's module is imported, not when a file is read).
    """
    node: Construct = spec
    for name in names:
        node = unwrap(node)
        while isinstance(node, Array):
            node = unwrap(node.subcon)
        found = [sc for sc in getattr(node, "subcons", ()) if sc.name == name]
        if not found:
            raise ValueError(f"no field {name!r} on the way to {'.'.join(names)}")
        node = found[0]
    return names


def pack_u64(*values: int) -> bytes:
    """``values`` as consecutive u64 fields, the way every spec lays them out."""
    return b"".join(map(_U64.pack, values))


def unpack_u64(data: bytes, offset: int = 0) -> int:
    """The u64 field at ``offset`` of ``data`` (``struct.error`` if fewer bytes are left)."""
    return _U64.unpack_from(data, offset)[0]


def float_bits(x: float) -> int:
    """The binary64 bit pattern of ``x`` as an unsigned integer (``-0.0`` and NaN payloads
    included): the u64 a spec's :data:`F64` field holds."""
    return _U64.unpack(_F64.pack(x))[0]


def bits_float(bits: int) -> float:
    """The float whose binary64 bit pattern is ``bits`` (the inverse of :func:`float_bits`).

    Raises:
        ValueError: ``bits`` is not in ``[0, 2**64)``.
    """
    if not 0 <= bits <= U64_MAX:
        raise ValueError(f"{bits} is not a 64-bit pattern")
    return _F64.unpack(_U64.pack(bits))[0]
