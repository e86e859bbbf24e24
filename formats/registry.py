"""The registry of binary format versions: ``(magic, version) → spec``.

A version is data. Adding one means writing its spec and calling :func:`register`; the
codec finds it here and reads and writes it with the same machinery as every other.
"""

from __future__ import annotations

from dataclasses import dataclass

from construct import Struct

from .adam import ADAM_VERSIONS
from .float32_state import FLOAT32_STATE_VERSIONS
from .framing import ADAM_MAGIC, FLOAT32_STATE_MAGIC, OPTIMIZER_MAGIC
from .tlckpt_optimizer import OPTIMIZER_VERSIONS

__all__ = ["FileSpec", "FAMILIES", "register", "unregister", "lookup", "known_versions"]

#: Family name by magic.
FAMILIES: dict[bytes, str] = {
    ADAM_MAGIC: "adam",
    FLOAT32_STATE_MAGIC: "float32_state",
    OPTIMIZER_MAGIC: "tlckpt_optimizer",
}
_BUILT_IN = frozenset(FAMILIES)


@dataclass(frozen=True)
class FileSpec:
    """One registered version: its family, magic, version number and construct spec."""

    family: str
    magic: bytes
    version: int
    struct: Struct


_REGISTRY: dict[tuple[bytes, int], FileSpec] = {}


def register(magic: bytes, version: int, struct: Struct, family: str | None = None) -> FileSpec:
    """Register ``struct`` as ``version`` of the family with ``magic``.

    Args:
        magic: the 7-byte family tag.
        version: the version number the spec's framing fixes.
        struct: the spec; it must start with ``framing.framed(magic, version)``.
        family: family name; defaults to the known name for ``magic``.

    Returns:
        The registered :class:`FileSpec`.

    Raises:
        ValueError: the pair is registered already, or the family is unknown.
    """
    if (magic, version) in _REGISTRY:
        raise ValueError(f"{magic.decode('ascii', 'replace')} v{version} is registered already")
    name = family or FAMILIES.get(magic)
    if name is None:
        raise ValueError(f"unknown family magic {magic!r}; pass family=")
    FAMILIES.setdefault(magic, name)
    spec = FileSpec(name, magic, version, struct)
    _REGISTRY[(magic, version)] = spec
    return spec


def unregister(magic: bytes, version: int) -> None:
    """Remove a registration (tests that register toy versions clean up with this).

    A family registered with its first version here is forgotten with its last one.
    """
    _REGISTRY.pop((magic, version), None)
    if magic not in _BUILT_IN and not known_versions(magic):
        FAMILIES.pop(magic, None)


def lookup(magic: bytes, version: int) -> FileSpec | None:
    """The spec registered for ``(magic, version)``, or ``None``."""
    return _REGISTRY.get((magic, version))


def known_versions(magic: bytes) -> list[int]:
    """Registered versions of the family with ``magic``, ascending."""
    return sorted(v for (m, v) in _REGISTRY if m == magic)


for _magic, _versions in (
    (ADAM_MAGIC, ADAM_VERSIONS),
    (FLOAT32_STATE_MAGIC, FLOAT32_STATE_VERSIONS),
    (OPTIMIZER_MAGIC, OPTIMIZER_VERSIONS),
):
    for _version, _struct in _versions.items():
        register(_magic, _version, _struct)
