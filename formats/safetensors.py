"""The safetensors layout (Hugging Face's ``safetensors``, format as of 0.8.0), as a spec.

A file is three regions, no magic::

    header_length   u64, little-endian: bytes of the header that follows
    header          UTF-8 JSON object, padded with spaces (0x20) to a multiple of 8 bytes
    data            the tensors' bytes, back to back, little-endian, row-major

The header maps each tensor name to ``{"dtype": D, "shape": [dims], "data_offsets": [begin,
end]}`` (offsets relative to the start of the data region) and may hold one
``"__metadata__"`` object of string to string. Rules the reference implementation enforces,
kept here as the spec's rules (the codec's reader checks each, :mod:`tlckpt.codec.safetensors`):

* the header is at most :data:`HEADER_LIMIT` bytes and starts with ``{``;
* ``dtype`` is one of :data:`DTYPES`; ``shape`` is a list of non-negative integers;
* ``end - begin`` is the element count times the dtype's width (sub-byte dtypes: the bit
  count, which must be a whole number of bytes, over 8);
* sorted by offsets, the tensors tile the data region exactly: the first begins at 0, each
  begins where the previous ended, the last ends at the end of the file.

The writer (``safetensors.serialize``) lays tensors out by dtype, widest-ranked first
(:data:`DTYPES` order reversed), then by name; writes ``__metadata__`` first, then the tensors
in that order, as compact JSON (no spaces; ``"``, ``\\`` and control characters escaped, the
rest of UTF-8 as it is); and pads the header with spaces so the data region starts at a
multiple of :data:`ALIGNMENT`.
"""

from __future__ import annotations

from dataclasses import dataclass

from construct import Bytes, Struct, this

from .primitives import U64, U64_SIZE, Category, Valid

__all__ = [
    "ALIGNMENT",
    "DTYPES",
    "DTYPE_BY_NAME",
    "DTYPE_RANK",
    "ENTRY_KEYS",
    "HEADER_LENGTH_SIZE",
    "HEADER_LIMIT",
    "HEADER_START",
    "METADATA_KEY",
    "PADDING",
    "SAFETENSORS_PREFIX",
    "SafetensorsDtype",
    "DATA_OFFSETS_KEY",
    "DTYPE_KEY",
    "SHAPE_KEY",
]

#: The reference reader refuses a header larger than this (``MAX_HEADER_SIZE``: 100 MB).
HEADER_LIMIT = 100_000_000
#: Bytes of the header-length field.
HEADER_LENGTH_SIZE = U64_SIZE
#: The data region starts at a multiple of this (the header is padded to it).
ALIGNMENT = 8
#: The byte the header is padded with.
PADDING = b" "
#: The byte every header starts with (the reference reader refuses any other).
HEADER_START = b"{"
#: The optional header member holding string-to-string metadata.
METADATA_KEY = "__metadata__"
DTYPE_KEY = "dtype"
SHAPE_KEY = "shape"
DATA_OFFSETS_KEY = "data_offsets"
#: The members of a tensor's entry, in the order the writer emits them.
ENTRY_KEYS = (DTYPE_KEY, SHAPE_KEY, DATA_OFFSETS_KEY)


@dataclass(frozen=True)
class SafetensorsDtype:
    """One element type of the layout.

    Attributes:
        name: the header's word (``"BF16"``).
        bits: bits per element (8 times its bytes; 4 and 6 for the sub-byte float kinds).
        storage: a numpy dtype of the same width holding the raw words (``"<u2"`` for BF16,
            which numpy lacks), or ``None`` for the sub-byte kinds (raw bytes, ``"u1"``).
        numpy: the numpy dtype whose values these are, where numpy has one (``"<f4"``).
        torch: the ``torch`` dtype attribute name (``"bfloat16"``), or ``None`` where torch
            has none. ``F4`` is torch's ``float4_e2m1fn_x2``: two values per byte, so the
            header's last dimension is twice torch's.
    """

    name: str
    bits: int
    storage: str | None
    numpy: str | None
    torch: str | None

    @property
    def width(self) -> int | None:
        """Bytes per element, or ``None`` for the sub-byte kinds."""
        return self.bits // 8 if self.bits % 8 == 0 else None


def _d(name: str, bits: int, storage: str | None, numpy: str | None, torch: str | None):
    return SafetensorsDtype(name, bits, storage, numpy, torch)


#: Every dtype, in the reference's declaration order (``enum Dtype``), which is also its
#: layout order: the writer places tensors of a later dtype first.
DTYPES: tuple[SafetensorsDtype, ...] = (
    _d("BOOL", 8, "u1", "?", "bool"),
    _d("F4", 4, None, None, "float4_e2m1fn_x2"),
    _d("F6_E2M3", 6, None, None, None),
    _d("F6_E3M2", 6, None, None, None),
    _d("U8", 8, "u1", "u1", "uint8"),
    _d("I8", 8, "i1", "i1", "int8"),
    _d("F8_E5M2", 8, "u1", None, "float8_e5m2"),
    _d("F8_E4M3", 8, "u1", None, "float8_e4m3fn"),
    _d("F8_E8M0", 8, "u1", None, "float8_e8m0fnu"),
    _d("F8_E4M3FNUZ", 8, "u1", None, "float8_e4m3fnuz"),
    _d("F8_E5M2FNUZ", 8, "u1", None, "float8_e5m2fnuz"),
    _d("I16", 16, "<i2", "<i2", "int16"),
    _d("U16", 16, "<u2", "<u2", "uint16"),
    _d("F16", 16, "<u2", "<f2", "float16"),
    _d("BF16", 16, "<u2", None, "bfloat16"),
    _d("I32", 32, "<i4", "<i4", "int32"),
    _d("U32", 32, "<u4", "<u4", "uint32"),
    _d("F32", 32, "<u4", "<f4", "float32"),
    _d("C64", 64, "<u8", "<c8", "complex64"),
    _d("F64", 64, "<u8", "<f8", "float64"),
    _d("I64", 64, "<i8", "<i8", "int64"),
    _d("U64", 64, "<u8", "<u8", "uint64"),
)

DTYPE_BY_NAME: dict[str, SafetensorsDtype] = {d.name: d for d in DTYPES}
#: Each dtype's rank in the layout order (higher is written first).
DTYPE_RANK: dict[str, int] = {d.name: i for i, d in enumerate(DTYPES)}


def _header_fits(length: int, _context: object) -> bool:
    return length <= HEADER_LIMIT


#: The fixed part of a file: its header length (checked against :data:`HEADER_LIMIT`) and
#: the header's bytes. The data region follows; its tensors are described by the header and
#: streamed by the codec, never parsed through construct.
SAFETENSORS_PREFIX = Struct(
    "header_length"
    / Valid(U64, _header_fits, expected=f"<= {HEADER_LIMIT}", category=Category.MALFORMED)
    * "bytes of the JSON header, padding included",
    "header" / Bytes(this.header_length) * "UTF-8 JSON object, space-padded",
)
