"""§1 of FORMAT.md: the framing every binary family starts with.

``magic`` (7 ASCII bytes naming the family) then ``version`` (u64). The codec parses
:data:`FRAMING` first to pick the version's spec from the registry; each version spec then
repeats the two fields as constants so that it describes its whole file on its own.
"""

from __future__ import annotations

from construct import Bytes, Const, Struct

from .primitives import U64, field_path, unpack_u64

__all__ = [
    "MAGIC_SIZE",
    "VERSION_OFFSET",
    "FRAMING_SIZE",
    "FRAMING",
    "VERSION",
    "ADAM_MAGIC",
    "FLOAT32_STATE_MAGIC",
    "OPTIMIZER_MAGIC",
    "framed",
    "framing_of",
    "framing_bytes",
]

MAGIC_SIZE = 7
ADAM_MAGIC = b"TLADAMF"
FLOAT32_STATE_MAGIC = b"TLSF32B"
#: tlckpt's own optimizer family (not TorchLean's): no TorchLean reader takes it for ``TLADAMF``.
OPTIMIZER_MAGIC = b"TLCKOPT"

#: What the codec reads before it knows the version.
FRAMING = Struct(
    "magic" / Bytes(MAGIC_SIZE) * "ASCII family tag",
    "version" / U64 * "format version within the family",
)

#: The spec path of the version, the same in every version spec (:func:`framed`).
VERSION = field_path(FRAMING, "version")

#: Where the version starts, and how many bytes the framing takes.
VERSION_OFFSET = MAGIC_SIZE
FRAMING_SIZE: int = FRAMING.sizeof()


def framed(magic: bytes, version: int) -> list:
    """The two leading fields of a version spec, fixed to ``magic`` and ``version``."""
    if len(magic) != MAGIC_SIZE:
        raise ValueError(f"magic must be {MAGIC_SIZE} bytes, got {magic!r}")
    return [
        "magic" / Const(magic) * "ASCII family tag",
        "version" / Const(version, U64) * "format version within the family",
    ]


def framing_of(head: bytes) -> tuple[bytes, int] | None:
    """``(magic, version)`` of a file that starts with ``head``; ``None`` if ``head`` is
    shorter than the framing. Nothing is checked: the magic may be any 7 bytes."""
    if len(head) < FRAMING_SIZE:
        return None
    return bytes(head[:MAGIC_SIZE]), unpack_u64(head, VERSION_OFFSET)


def framing_bytes(magic: bytes, version: int) -> bytes:
    """The framing of a file of ``magic`` and ``version`` (for hand-made files and tests)."""
    return FRAMING.build({"magic": magic, "version": version})
