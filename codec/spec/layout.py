"""The layout of a file to be written: its header bytes and where each payload goes.

A binary file's every byte offset follows from its values other than the payloads (shapes,
counts, config): the writer's builder, run over :class:`~.builder.Reserved` placeholders
instead of payload arrays, produces the file's header bytes and each payload's offset and
size without touching a payload. Writers that fill payloads themselves (several processes
writing their own rows of one file with positional writes) write the headers from here and
every payload byte at the offset here: the file is byte for byte the one the streaming
writer makes from the same values. Nothing here restates a layout: the specs do, through
the builder.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from construct import Struct

from ..paths import Path
from .builder import build

__all__ = ["FileLayout", "PayloadPlace", "layout_of_spec"]


@dataclass(frozen=True)
class PayloadPlace:
    """Where one payload goes.

    Attributes:
        path: the payload's spec path (for a tensor record: ``(*TENSORS, i, "payload")``).
        offset: its first byte's position in the file.
        nbytes: its size in bytes.
    """

    path: Path
    offset: int
    nbytes: int


@dataclass(frozen=True)
class FileLayout:
    """A file to be written, but for its payloads.

    Attributes:
        headers: ``(offset, bytes)`` of every run of non-payload bytes, in file order.
        payloads: every payload's place, in file order.
        size: the file's size in bytes.
    """

    headers: tuple[tuple[int, bytes], ...]
    payloads: tuple[PayloadPlace, ...]
    size: int

    def header_bytes(self) -> int:
        """How many bytes the headers hold together."""
        return sum(len(data) for _, data in self.headers)


class _LayoutStream:
    """What the builder writes to for a layout: header bytes, joined into runs, and the
    places the builder reserves for payloads."""

    def __init__(self) -> None:
        self.runs: list[tuple[int, bytearray]] = []
        self.places: list[PayloadPlace] = []
        self.pos = 0

    def write(self, data: Any) -> int:
        n = memoryview(data).nbytes
        if n:
            if self.runs and self.runs[-1][0] + len(self.runs[-1][1]) == self.pos:
                self.runs[-1][1].extend(data)
            else:
                self.runs.append((self.pos, bytearray(data)))
            self.pos += n
        return n

    def reserve(self, path: Path, offset: int, nbytes: int) -> None:
        self.places.append(PayloadPlace(tuple(path), offset, nbytes))
        self.pos = offset + nbytes


def layout_of_spec(spec: Struct, values: Any, params: dict | None = None) -> FileLayout:
    """The layout of the file ``build(f, spec, values, params)`` would write.

    Args:
        spec: the file's construct spec (a registered version's struct).
        values: the builder's values, with a :class:`~.builder.Reserved` in place of each
            payload array (record arrays may be generators, as for the builder).
        params: the builder's parameters.

    Returns:
        The header runs, the payloads' places and the file's size.

    Raises:
        CheckpointError: the values do not build (a reserved payload of the wrong size
            included), as the streaming writer would raise.
    """
    stream = _LayoutStream()
    size = build(stream, spec, values, params)  # type: ignore[arg-type]  # a write() is enough
    headers = tuple((offset, bytes(data)) for offset, data in stream.runs)
    return FileLayout(headers, tuple(stream.places), size)
