"""Declarative specs of TorchLean's checkpoint formats (no I/O, no torch).

One module per family: :mod:`.framing`, :mod:`.schema`, :mod:`.adam`, :mod:`.float32_state`,
:mod:`.state_bits`; :mod:`.registry` maps ``(magic, version)`` to a spec.
"""

from .adam import ADAM_V2, ADAM_V3, ADAM_V4, ADAM_V5, ADAM_VERSIONS, AdamLayout, layout_of
from .float32_state import FLOAT32_STATE_V1, TENSOR_RECORD
from .framing import ADAM_MAGIC, FLOAT32_STATE_MAGIC, FRAMING, framed
from .primitives import U64, InvalidField, Payload, Valid
from .registry import FileSpec, known_versions, lookup, register, unregister
from .schema import REPRESENTATIVES_BLOCK, SCHEMA_BLOCK, SLOT
from .state_bits import ENCODINGS, BinaryFormat, ComplexFormat, encoding_by_name, parse_tag

__all__ = [
    "ADAM_MAGIC",
    "ADAM_V2",
    "ADAM_V3",
    "ADAM_V4",
    "ADAM_V5",
    "ADAM_VERSIONS",
    "AdamLayout",
    "BinaryFormat",
    "ComplexFormat",
    "ENCODINGS",
    "FLOAT32_STATE_MAGIC",
    "FLOAT32_STATE_V1",
    "FRAMING",
    "FileSpec",
    "InvalidField",
    "Payload",
    "REPRESENTATIVES_BLOCK",
    "SCHEMA_BLOCK",
    "SLOT",
    "TENSOR_RECORD",
    "U64",
    "Valid",
    "encoding_by_name",
    "framed",
    "known_versions",
    "layout_of",
    "lookup",
    "parse_tag",
    "register",
    "unregister",
]
