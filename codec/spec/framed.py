"""Framing of the binary families: pick the version's spec, and the trailing-data rule."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from ...formats import registry
from ...formats.framing import MAGIC_SIZE, VERSION_OFFSET
from ...formats.primitives import U64_SIZE, unpack_u64
from ..errors import TrailingDataError, UnsupportedFormatError, UnsupportedVersionError
from ..fileio.source import FileStamp, PathOrFile, Source, open_source
from .walker import Visitor, parse

__all__ = ["read_framing", "check_trailing", "family_name", "read_framed"]

_V = TypeVar("_V", bound=Visitor)


def family_name(magic: bytes) -> str:
    """A magic as messages show it (``TLADAMF``)."""
    return magic.decode("ascii", "replace")


def read_framing(src: Source, expect: bytes | None) -> registry.FileSpec:
    """Read magic and version, return the registered spec, and rewind to the start.

    Args:
        src: the file, positioned at the checkpoint's first byte.
        expect: the family's magic, or ``None`` to accept any registered family.

    Raises:
        UnsupportedFormatError: a foreign magic (another family, or not a checkpoint).
        UnsupportedVersionError: a known family with a version nobody registered.
        TruncatedError: the file ends inside the framing.
    """
    start = src.pos
    known = [expect] if expect is not None else list(registry.FAMILIES)
    head = src.read(min(MAGIC_SIZE, src.remaining), "magic")
    if len(head) < MAGIC_SIZE:
        if any(m.startswith(head) for m in known):
            src.seek(start)  # the magic starts there: its bytes wanted, and those there
            src.need(MAGIC_SIZE, "magic")  # raises: ends inside a known magic
        raise UnsupportedFormatError(
            f"unsupported checkpoint family: {len(head)}-byte file {head!r}",
            offset=start,
            field="magic",
            actual=head,
        )
    if head not in known:
        names = " or ".join(family_name(m) for m in known)
        raise UnsupportedFormatError(
            f"unsupported checkpoint family: magic {head!r}, expected {names}",
            offset=start,
            field="magic",
            actual=head,
            expected=names,
        )
    version = unpack_u64(src.read(U64_SIZE, "version"))
    spec = registry.lookup(head, version)
    if spec is None:
        versions = registry.known_versions(head)
        listed = ", ".join(map(str, versions[:-1])) + (" or " if len(versions) > 1 else "")
        listed += str(versions[-1]) if versions else "none"
        raise UnsupportedVersionError(
            f"unsupported format version {version} of {family_name(head)}; expected {listed}",
            offset=start + VERSION_OFFSET,
            field="version",
            actual=version,
            expected=versions,
        )
    src.seek(start)
    return spec


def check_trailing(src: Source) -> None:
    """Raise :class:`TrailingDataError` if any byte follows the last expected record."""
    if src.remaining:
        raise TrailingDataError(
            f"{src.remaining} trailing byte(s) after the last record",
            offset=src.pos,
            field="end of file",
            actual=src.remaining,
            expected=0,
        )


def read_framed(
    path: PathOrFile, magic: bytes, visitor: Callable[[registry.FileSpec], _V]
) -> tuple[_V, FileStamp]:
    """Walk a whole file of the family ``magic``: its framing, then every field with the
    visitor made for its version's spec, then the trailing-data rule.

    Args:
        path: file path, or a seekable binary file object (read from its position).
        magic: the family's magic.
        visitor: makes the visitor from the file's registered spec.

    Returns:
        The visitor, once the whole file has been walked and checked, and the file's stamp
        from before its first byte was read (for reads by position afterwards).

    Raises:
        CheckpointError: a subclass, from the framing, the visitor or the trailing bytes.
        OSError: from the file system.
    """
    with open_source(path) as src:
        spec = read_framing(src, expect=magic)
        reader = visitor(spec)
        parse(src, spec.struct, reader)
        check_trailing(src)
    return reader, src.stamp
