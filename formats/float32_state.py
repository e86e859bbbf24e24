"""§4 of FORMAT.md: streamed float32 model state, family ``TLSF32B``.

Parameters and persistent buffers in module order, no names: each tensor's rank, dims and
element count right before its binary32 payload, so a writer can stream one tensor at a time.
"""

from __future__ import annotations

from construct import Array, Struct, this

from .framing import FLOAT32_STATE_MAGIC, framed
from .primitives import U64, Payload, Valid, product

__all__ = ["TENSOR_RECORD", "FLOAT32_STATE_V1"]

TENSOR_RECORD = Struct(
    "rank" / U64 * "number of dims (0 for a scalar)",
    "dims" / Array(this.rank, U64) * "u64 per dim",
    "element_count"
    / Valid(
        U64,
        lambda value, ctx: value == product(ctx.dims),
        expected="the product of the dims",
        category="schema",
    )
    * "product of dims (1 for rank 0)",
    "payload" / Payload(this.element_count, "<f4") * "binary32, little-endian",
)

#: v1: the only version. Written one tensor at a time so that a large device model never
#: needs a second host-side copy.
FLOAT32_STATE_V1 = Struct(
    *framed(FLOAT32_STATE_MAGIC, 1),
    "tensor_count" / U64 * "number of state tensors",
    "tensors" / Array(this.tensor_count, TENSOR_RECORD) * "in module state order",
)
