"""Bounded reading from a file: every read is checked against the bytes actually left.

A reader that runs out of memory all the same (a file of allowed size on a small machine, or
under an address-space limit) raises :class:`~tlckpt.codec.errors.FileTooLargeError` naming
the file and its size, never ``MemoryError``: :func:`open_source` converts it for every reader.
"""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Iterator
from typing import Any, BinaryIO

from .errors import CheckpointError, FileTooLargeError, TruncatedError
from .paths import field_name

__all__ = ["Source", "open_source", "PathOrFile"]

PathOrFile = str | os.PathLike | BinaryIO


class Source:
    """A seekable binary file and its size; reads exactly what is asked or raise.

    Position is tracked here rather than asked of the file, so bounds checks cost no system
    call. Reading starts at the file's current position (callers may hand us a file object
    positioned at a checkpoint embedded in something larger).
    """

    def __init__(self, file: BinaryIO, name: Any = None):
        self.file = file
        self.name = name
        try:
            self.start = file.tell()
            size = None
            with contextlib.suppress(AttributeError, OSError, io.UnsupportedOperation):
                size = os.fstat(file.fileno()).st_size
            if size is None:
                size = file.seek(0, io.SEEK_END)
                file.seek(self.start)
        except (AttributeError, io.UnsupportedOperation) as exc:
            raise TypeError("reading needs a seekable binary file object") from exc
        self.size = size
        self.pos = self.start

    @property
    def remaining(self) -> int:
        """Bytes between the current position and the end of the file."""
        return self.size - self.pos

    def need(self, nbytes: int, what: Any, offset: int | None = None) -> None:
        """Raise :class:`TruncatedError` unless ``nbytes`` are left.

        ``what`` names the field (a string, or a spec path rendered only on error).
        """
        if nbytes > self.remaining:
            what = field_name(what)
            raise TruncatedError(
                f"truncated checkpoint: {what} needs {nbytes} bytes, only {self.remaining} left",
                offset=self.pos if offset is None else offset,
                field=what,
                actual=self.remaining,
                expected=nbytes,
            )

    def read(self, nbytes: int, what: Any) -> bytes:
        """Exactly ``nbytes`` bytes."""
        if nbytes > self.size - self.pos:
            self.need(nbytes, what)
        data = self.file.read(nbytes)
        if len(data) != nbytes:  # the file shrank under us
            what = field_name(what)
            raise TruncatedError(
                f"truncated checkpoint: {what} needs {nbytes} bytes, got {len(data)}",
                offset=self.pos,
                field=what,
                actual=len(data),
                expected=nbytes,
            )
        self.pos += nbytes
        return data

    def readinto(self, buffer: Any, what: Any) -> None:
        """Fill ``buffer`` (any writable C-contiguous buffer) from the file, no copies."""
        view = memoryview(buffer)
        total = view.nbytes
        self.need(total, what)
        if total == 0:  # zero-size tensors: nothing to read (and cast() refuses 0 dims)
            return
        view = view.cast("B")
        got = 0
        while got < total:
            n = self.file.readinto(view[got:])
            if not n:
                what = field_name(what)
                raise TruncatedError(
                    f"truncated checkpoint: {what} needs {total} bytes, got {got}",
                    offset=self.pos + got,
                    field=what,
                    actual=got,
                    expected=total,
                )
            got += n
        self.pos += total

    def peek(self, nbytes: int) -> bytes:
        """Up to ``nbytes`` bytes from the current position, which does not move."""
        data = self.file.read(max(0, min(nbytes, self.remaining)))
        self.file.seek(self.pos)
        return data

    def skip(self, nbytes: int, what: Any) -> None:
        """Move past ``nbytes`` bytes that are known to be there."""
        self.need(nbytes, what)
        self.pos += nbytes
        self.file.seek(self.pos)

    def seek(self, pos: int) -> None:
        self.file.seek(pos)
        self.pos = pos


@contextlib.contextmanager
def open_source(path_or_file: PathOrFile) -> Iterator[Source]:
    """A :class:`Source` over a path (opened and closed here) or a caller's file object.

    Errors raised inside carry the file's name; a ``MemoryError`` raised inside becomes a
    :class:`FileTooLargeError` naming the file and its size.
    """
    if isinstance(path_or_file, (str, os.PathLike)):
        name: Any = os.fspath(path_or_file)
        ctx: Any = open(name, "rb")  # noqa: SIM115 - closed by the with below
    else:
        name = getattr(path_or_file, "name", None)
        ctx = contextlib.nullcontext(path_or_file)
    with ctx as file:
        src = Source(file, name)
        try:
            yield src
        except CheckpointError as exc:
            exc.with_path(name)
            raise
        except MemoryError:
            size = src.size - src.start
            raise FileTooLargeError(
                f"out of memory while reading this {size:,}-byte file",
                path=name,
                actual=size,
            ) from None
