"""Helpers shared by the mutation tests (``test_mutation*.py``): u64 packing and its edge
values, readers of each family, and a read of untrusted bytes that may only succeed or raise
a checked :class:`CheckpointError`."""

from __future__ import annotations

import io
import struct
from collections.abc import Callable
from typing import Any

from tlckpt.codec import (
    CheckpointError,
    MomentDtype,
    ParameterSchema,
    inspect,
    read_adam,
    read_float32_state,
)

#: Examples of each random-splice and random-header test.
SPLICE_EXAMPLES = 300
#: The values every u64 field is set to in turn.
EDGE_U64 = (0, 1, 2**32, 2**63, 2**64 - 1)
U64 = struct.Struct("<Q")


def u64(x: int) -> bytes:
    """``x`` as a little-endian u64."""
    return U64.pack(x)


def adam_reader(schema: ParameterSchema, dtype: MomentDtype) -> Callable[[Any], Any]:
    """A reader of Adam files of this schema and moment dtype."""
    return lambda src: read_adam(src, schema, dtype=dtype)


def f32_reader(shapes: list) -> Callable[[Any], Any]:
    """A reader of float32 model-state files of these shapes."""
    return lambda src: read_float32_state(src, shapes)


def looks_like_json(data: bytes) -> bool:
    # What ``inspect`` hands to the exact-bits JSON reader, whose errors have no byte offset.
    return data.lstrip(b" \t\r\n\xef\xbb\xbf")[:1] in (b"{", b"[")


def attempt(read: Callable[[Any], Any], data: bytes) -> Any:
    """Read ``data``: what was read, or the CheckpointError (offset checked). Any other
    exception propagates and fails the test."""
    try:
        return read(io.BytesIO(data))
    except CheckpointError as exc:
        if exc.offset is None and read is inspect and looks_like_json(data):
            return exc
        assert isinstance(exc.offset, int), f"no offset: {exc!r}"
        assert 0 <= exc.offset <= len(data), f"offset {exc.offset} outside {len(data)}: {exc!r}"
        return exc


def outcome(read: Callable[[Any], Any], data: bytes) -> CheckpointError | None:
    """Read ``data``; return the CheckpointError (checked), or None on success."""
    result = attempt(read, data)
    return result if isinstance(result, CheckpointError) else None
