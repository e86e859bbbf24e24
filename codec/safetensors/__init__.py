"""The safetensors family: its header, reader, writer and lazy file (numpy only).

Holds :mod:`.header` (parse, validate and build the JSON header of
:mod:`tlckpt.formats.safetensors`), :mod:`.reader` (bounded reads of a header and of one
tensor's bytes into a caller's buffer), :mod:`.writer` (streaming, atomic, durable writes
whose bytes equal ``safetensors.serialize_file``'s), :mod:`.lazy` (an open file read
tensor by tensor) and :mod:`.family` (its handler, in the codec's list of built-in families,
:mod:`..registrations`). May import :mod:`tlckpt.formats` and the shared codec modules (errors,
sources, atomic output, JSON checks); never torch, never the ``safetensors`` package.
"""

from .header import Header, TensorEntry, build_header, layout_order, parse_header
from .lazy import SafetensorsReader
from .reader import read_header, read_metadata, read_safetensors, read_tensor_into
from .writer import TensorData, write_safetensors

__all__ = [
    "Header",
    "SafetensorsReader",
    "TensorData",
    "TensorEntry",
    "build_header",
    "layout_order",
    "parse_header",
    "read_header",
    "read_metadata",
    "read_safetensors",
    "read_tensor_into",
    "write_safetensors",
]
