"""§4 of FORMAT.md: streamed float32 model state, family ``TLSF32B``.

Parameters and persistent buffers in module order, no names: each tensor's rank, dims and
element count right before its binary32 payload, so a writer can stream one tensor at a time.
"""

from __future__ import annotations

from construct import Array, Struct, this

from .framing import FLOAT32_STATE_MAGIC, framed
from .primitives import U64, Payload, field_path
from .schema import SHAPE_FIELDS

__all__ = [
    "TENSOR_DTYPE",
    "TENSOR_RECORD",
    "FLOAT32_STATE_V1",
    "FLOAT32_STATE_VERSIONS",
    "WRITTEN_VERSION",
    "TENSOR_COUNT",
    "TENSORS",
]

#: The dtype of every payload: binary32, little-endian.
TENSOR_DTYPE = "<f4"

TENSOR_RECORD = Struct(
    *SHAPE_FIELDS,
    "payload" / Payload(this.element_count, TENSOR_DTYPE) * "binary32, little-endian",
)

#: v1: the only version. Written one tensor at a time so that a large device model never
#: needs a second host-side copy.
FLOAT32_STATE_V1 = Struct(
    *framed(FLOAT32_STATE_MAGIC, 1),
    "tensor_count" / U64 * "number of state tensors",
    "tensors" / Array(this.tensor_count, TENSOR_RECORD) * "in module state order",
)

FLOAT32_STATE_VERSIONS = {1: FLOAT32_STATE_V1}
#: The version writers produce.
WRITTEN_VERSION = 1

#: Spec paths readers act on.
TENSOR_COUNT = field_path(FLOAT32_STATE_V1, "tensor_count")
TENSORS = field_path(FLOAT32_STATE_V1, "tensors")
