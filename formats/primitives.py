"""Building blocks shared by every format spec: u64, checked fields, streamed payloads.

These are ordinary ``construct`` constructs, so every spec can also be parsed and built by
construct itself (the slow, fully interpreted reference path). The codec recognises
:class:`Payload` and streams its bytes between the file and caller buffers instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from construct import (
    Construct,
    ConstructError,
    Int64ul,
    SizeofError,
    Subconstruct,
    stream_read,
    stream_write,
)
from construct.core import evaluate

__all__ = [
    "U64",
    "U64_MAX",
    "CATEGORIES",
    "InvalidField",
    "Valid",
    "Payload",
    "product",
]

#: Every integer of the binary families: unsigned 64-bit little-endian.
U64 = Int64ul
U64_MAX = 2**64 - 1

#: What a failed check means; the codec maps each category to one error class.
CATEGORIES = frozenset(
    {"family", "version", "truncated", "trailing", "schema", "config", "entry", "malformed"}
)


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
        category: one of :data:`CATEGORIES`; decides the error class the codec raises.
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
        self.category = category

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
                category="entry",
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
