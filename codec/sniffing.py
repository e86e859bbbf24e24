"""Which family a file is, from its first bytes (at most :data:`HEAD_BYTES` of them).

A registered magic decides (:func:`magic_family`, from :mod:`tlckpt.formats.registry`);
a file without one is asked of each family that has no magic, in registration order
(:func:`head_family`; the family registry, :mod:`.families`, adds each such family's
``sniff`` here when it registers it). This module imports nothing but the format registry,
so the readers that refuse a file of the wrong kind early (exact-bits JSON, checkpoint sets)
need neither the family registry nor numpy.
"""

from __future__ import annotations

from collections.abc import Callable

from ..formats import registry

__all__ = [
    "HEAD_BYTES",
    "JSON_FAMILY",
    "JSON_WHITESPACE",
    "UTF8_BOM",
    "Sniff",
    "add_sniffer",
    "remove_sniffer",
    "magic_family",
    "head_family",
]

#: The family name of exact-bits JSON model state (it has no magic).
JSON_FAMILY = "state_bits"

#: Bytes looked at to decide a file's family: every magic, and the leading JSON whitespace a
#: document may have before its first significant byte. A document with more leading
#: whitespace than this is not refused from its head: it is read, under its bound, and judged
#: whole.
HEAD_BYTES = 4096

#: The four bytes JSON counts as whitespace (RFC 8259).
JSON_WHITESPACE = b" \t\n\r"

#: A UTF-8 byte order mark, which RFC 8259 does not allow a JSON text to start with.
UTF8_BOM = b"\xef\xbb\xbf"

#: Whether a file whose first bytes are ``head`` (``remaining`` bytes in all) is one of a
#: family's files, as far as the head can tell.
Sniff = Callable[[bytes, int], bool]

_SNIFFERS: dict[str, Sniff] = {}


def add_sniffer(family: str, sniff: Sniff) -> None:
    """Ask ``sniff`` of a file no magic names (after the families added before it)."""
    _SNIFFERS[family] = sniff


def remove_sniffer(family: str) -> None:
    """Forget a family's sniff (none added is no error)."""
    _SNIFFERS.pop(family, None)


def magic_family(head: bytes) -> str | None:
    """The family whose registered magic ``head`` starts with, or ``None``."""
    for magic, family in registry.FAMILIES.items():
        if head.startswith(magic):
            return family
    return None


def head_family(head: bytes, remaining: int) -> str | None:
    """The family a file starting with ``head`` (of ``remaining`` bytes) is, from its head.

    A registered magic decides first; then each family without one is asked (``sniff``).
    """
    found = magic_family(head)
    if found is not None:
        return found
    for name, sniff in _SNIFFERS.items():
        if sniff(head, remaining):
            return name
    return None
