"""Declarative specs of TorchLean's checkpoint formats (no I/O, no torch).

One module per family: :mod:`.framing`, :mod:`.schema`, :mod:`.adam`, :mod:`.float32_state`,
:mod:`.state_bits`, and tlckpt's own optimizer family :mod:`.tlckpt_optimizer` (not
TorchLean's); :mod:`.registry` maps ``(magic, version)`` to a spec. :mod:`.safetensors` is
Hugging Face's layout (no magic, no version: it is recognised by its first bytes, through the
codec's family registry, not this one).
"""

from .adam import (
    ADAM_V2,
    ADAM_V3,
    ADAM_V4,
    ADAM_V5,
    ADAM_VERSIONS,
    AdamKind,
    AdamLayout,
    CounterPresence,
    layout_of,
)
from .float32_state import FLOAT32_STATE_V1, TENSOR_RECORD
from .framing import (
    ADAM_MAGIC,
    FLOAT32_STATE_MAGIC,
    FRAMING,
    OPTIMIZER_MAGIC,
    framed,
    framing_bytes,
    framing_of,
)
from .primitives import (
    F64,
    U64,
    U64_SIZE,
    Category,
    InvalidField,
    Payload,
    Valid,
    bits_float,
    field_path,
    float_bits,
    pack_u64,
    unpack_u64,
    unwrap,
)
from .registry import FileSpec, known_versions, lookup, register, unregister
from .schema import REPRESENTATIVES_BLOCK, SCHEMA_BLOCK, SHAPE_FIELDS, SLOT
from .state_bits import ENCODINGS, BinaryFormat, ComplexFormat, encoding_by_name, parse_tag
from .tlckpt_optimizer import (
    OPTIMIZER_ENTRY,
    OPTIMIZER_V1,
    OPTIMIZER_V2,
    OPTIMIZER_VERSIONS,
    PARAM_GROUP,
    MomentTag,
)

__all__ = [
    "ADAM_MAGIC",
    "ADAM_V2",
    "ADAM_V3",
    "ADAM_V4",
    "ADAM_V5",
    "ADAM_VERSIONS",
    "AdamKind",
    "AdamLayout",
    "BinaryFormat",
    "Category",
    "ComplexFormat",
    "CounterPresence",
    "ENCODINGS",
    "F64",
    "FLOAT32_STATE_MAGIC",
    "FLOAT32_STATE_V1",
    "FRAMING",
    "FileSpec",
    "InvalidField",
    "MomentTag",
    "OPTIMIZER_ENTRY",
    "OPTIMIZER_MAGIC",
    "OPTIMIZER_V1",
    "OPTIMIZER_V2",
    "OPTIMIZER_VERSIONS",
    "PARAM_GROUP",
    "Payload",
    "REPRESENTATIVES_BLOCK",
    "SCHEMA_BLOCK",
    "SHAPE_FIELDS",
    "SLOT",
    "TENSOR_RECORD",
    "U64",
    "U64_SIZE",
    "Valid",
    "bits_float",
    "encoding_by_name",
    "field_path",
    "float_bits",
    "framed",
    "framing_bytes",
    "framing_of",
    "known_versions",
    "layout_of",
    "lookup",
    "pack_u64",
    "parse_tag",
    "register",
    "unpack_u64",
    "unregister",
    "unwrap",
]
