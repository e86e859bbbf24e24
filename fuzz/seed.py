"""A campaign's seed file and what it is read with (see :mod:`fuzz.seeds` for the seeds).

A :class:`Seed` is a file's bytes, its family (a name in the codec's family registry), the
report key it counts under, and the destination a reader is given for it, so that each
mutated copy can be read both against its destination and by ``inspect``. Everything a seed
needs to know about its family comes from that family's handler: how it is read against a
destination, whether it is binary, how its report keys are spelled.

This module imports the library only inside functions: the atheris runner imports it before
it instruments the library.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["REPO", "LARGE_LIMIT", "Reader", "Seed", "readers", "report_key", "format_keys"]

REPO = Path(__file__).resolve().parents[1]

#: Largest generated seed (the time/memory bounds are stated for inputs up to 1 MiB).
LARGE_LIMIT = 1 << 20

Reader = Callable[[Any], Any]


def _family(name: str) -> Any:
    from tlckpt.codec.families import family_named

    family = family_named(name)
    if family is None:
        raise KeyError(f"no family {name!r} is registered")
    return family


@dataclass
class Seed:
    """One seed file and the destination its readers expect.

    Attributes:
        name: file name (vectors) or a descriptive name (generated).
        fmt: report key, one of :func:`format_keys`.
        kind: the family's name (``"adam"``, ``"float32_state"``, ``"state_bits"``).
        data: the file's bytes.
        dest: the destination, of the type the family's handler reads against
            (:class:`~tlckpt.codec.values.destinations.AdamTarget`, ``ModelStateTarget``).
        valid: whether the unmutated file reads successfully against ``dest``.
        origin: ``"vector"``, ``"generated"`` or ``"crafted"``.
    """

    name: str
    fmt: str
    kind: str
    data: bytes
    dest: Any = None
    valid: bool = True
    origin: str = "vector"
    #: At most this many systematic mutations (sampled), for seeds whose reads are slow.
    cap: int | None = None

    @property
    def binary(self) -> bool:
        """Whether the family is a binary one (has a magic, and records to map)."""
        return _family(self.kind).magic is not None


def readers(seed: Seed) -> list[tuple[str, Reader]]:
    """``(label, reader)`` pairs: the destination reader, then ``inspect``.

    Each reader takes a binary file object positioned at the start of the file.
    """
    from tlckpt.codec import DEFAULT_MAX_JSON_BYTES, inspect

    family, dest = _family(seed.kind), seed.dest

    def read(f: Any) -> Any:
        return family.read(f, dest, True, DEFAULT_MAX_JSON_BYTES)

    return [(f"read_{family.name}", read), ("inspect", inspect)]


def report_key(kind: str, data: bytes) -> str:
    """The report key of a file of family ``kind``: ``"<label> v<version>"`` for a binary
    file whose framing names a registered version, ``"<label> other"`` for any other binary
    file, the family's label for a family without versions."""
    from tlckpt.formats import framing_of, lookup

    family = _family(kind)
    if family.magic is None:
        return family.label
    framing = framing_of(data)
    if framing is not None and framing[0] == family.magic and lookup(*framing) is not None:
        return f"{family.label} v{framing[1]}"
    return f"{family.label} other"


def format_keys() -> tuple[str, ...]:
    """Every report key, in report order: each family's registered versions and ``other``."""
    from tlckpt.codec.families import families
    from tlckpt.formats import known_versions

    keys: list[str] = []
    for family in families():
        if family.magic is None:
            keys.append(family.label)
        else:
            keys += [f"{family.label} v{v}" for v in known_versions(family.magic)]
            keys.append(f"{family.label} other")
    return tuple(keys)
