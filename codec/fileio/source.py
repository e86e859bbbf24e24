"""Bounded reading from a file: every read is checked against the bytes actually left, and
the file is checked not to have changed while it was read.

A change is seen through the open handle's ``fstat`` (:class:`FileStamp`): the size, the
modification time and the status-change time, taken when reading starts and compared when it
ends. Linux (6.13 and later, on ext4, xfs, btrfs, tmpfs) gives a write that follows an
``fstat`` a fresh fine-grained timestamp, so a write after the first stamp is always seen; on
file systems with coarse timestamps a rewrite within one clock tick of the first stamp can
keep both times. The kernel stamps a write when it begins, so a single ``write`` call that
was already under way when the first stamp was taken is not seen either. Equal stamps prove
that the bytes read are the file's contents at one moment, not that whoever wrote them had
finished.

A reader that runs out of memory all the same (a file of allowed size on a small machine, or
under an address-space limit) raises :class:`~tlckpt.codec.errors.FileTooLargeError` naming
the file and its size, never ``MemoryError``: :func:`open_source` converts it for every reader.
"""

from __future__ import annotations

import contextlib
import io
import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np

from ..errors import (
    CheckpointError,
    FileChangedError,
    FileTooLargeError,
    TruncatedError,
    UnsupportedFormatError,
)
from ..paths import field_name
from .transfer import PARALLEL_MIN_BYTES, Extents, address_of, plain_fd, read_extents

__all__ = ["FileStamp", "Source", "open_source", "open_regular", "file_kind", "PathOrFile"]

PathOrFile = str | os.PathLike | BinaryIO

#: Payloads from this size on are read in parallel chunks (:mod:`.transfer`).
BULK_READ_MIN = PARALLEL_MIN_BYTES


@dataclass(frozen=True)
class FileStamp:
    """What an open file's ``fstat`` says about its contents (``None`` where the object has
    no file descriptor: then only the size is known).

    Attributes:
        device, inode: the file's identity.
        size: its size in bytes.
        mtime_ns, ctime_ns: modification and status-change times.
        links: its link count.
    """

    device: int | None
    inode: int | None
    size: int
    mtime_ns: int | None
    ctime_ns: int | None
    links: int | None

    @classmethod
    def of(cls, st: os.stat_result) -> FileStamp:
        """The stamp of an ``fstat`` result."""
        return cls(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_nlink)

    def same_contents(self, later: FileStamp) -> bool:
        """Whether ``later`` (a stamp of the same handle) shows the contents unchanged.

        A write changes the size or the modification time; a write whose modification time
        was then set back (``touch -d``, ``cp -p``) still changes the status-change time.
        That time also moves when the file is linked, unlinked or renamed over, which leaves
        the contents of this handle as they were: a new status-change time that comes with
        a new link count is not a change (tlckpt's own writers rename a new file over the
        old one, and a load of the old one stays good).
        """
        if (self.device, self.inode, self.size, self.mtime_ns) != (
            later.device,
            later.inode,
            later.size,
            later.mtime_ns,
        ):
            return False
        return self.ctime_ns == later.ctime_ns or self.links != later.links


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
            self.stamp = self.current_stamp()
        except (AttributeError, io.UnsupportedOperation) as exc:
            raise TypeError("reading needs a seekable binary file object") from exc
        self.size = self.stamp.size
        self.pos = self.start

    def current_stamp(self) -> FileStamp:
        """The file's :class:`FileStamp` now (one ``fstat``; a seek where there is no
        descriptor, which leaves the position where it was)."""
        with contextlib.suppress(AttributeError, OSError, io.UnsupportedOperation):
            return FileStamp.of(os.fstat(self.file.fileno()))
        here = self.file.tell()
        size = self.file.seek(0, io.SEEK_END)
        self.file.seek(here)
        return FileStamp(None, None, size, None, None, None)

    def check_unchanged(self, since: FileStamp, when: str) -> None:
        """Raise :class:`FileChangedError` unless the file still has the contents it had
        when ``since`` was taken.

        Args:
            since: an earlier stamp of this file.
            when: the moment of the check, for the message ("before reading payloads").
        """
        now = self.current_stamp()
        if not since.same_contents(now):
            raise FileChangedError(
                f"the file changed while it was being read (found {when}: {since.size} ->"
                f" {now.size} bytes, modified at {since.mtime_ns} -> {now.mtime_ns} ns):"
                " another process wrote it in place; load it again once it is complete",
                actual=now.size,
                expected=since.size,
            )

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
        """Fill ``buffer`` (any writable C-contiguous buffer) from the file, no copies.

        A large buffer of a plain OS file is read by positional reads on a few threads
        (:func:`~.transfer.read_extents`)."""
        view = memoryview(buffer)
        total = view.nbytes
        self.need(total, what)
        if total == 0:  # zero-size tensors: nothing to read (and cast() refuses 0 dims)
            return
        view = view.cast("B")
        if total >= BULK_READ_MIN and plain_fd(self.file) is not None:
            array = np.frombuffer(view, dtype=np.uint8)
            extents = Extents.build([address_of(array)], [total], [self.pos], [array])
            read_extents(self.file, extents, what)
            self.pos += total
            self.file.seek(self.pos)
            return
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


#: What a file that is not a regular one is, as messages name it.
_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)

#: Opened without blocking where the platform has the flag (a FIFO's open waits for a writer).
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


def file_kind(mode: int) -> str:
    """What a file of ``st_mode`` ``mode`` is, in words ("a regular file", "a FIFO", ...)."""
    if stat.S_ISREG(mode):
        return "a regular file"
    return next((name for test, name in _KINDS if test(mode)), "a special file")


def _not_regular(path: str, kind: str) -> CheckpointError:
    return UnsupportedFormatError(
        f"not a regular file ({kind}): only regular files are read",
        path=path,
        field="file type",
        actual=kind,
        expected="a regular file",
    )


def open_regular(
    path: str | os.PathLike,
    refuse: Callable[[str, str], CheckpointError] = _not_regular,
) -> BinaryIO:
    """``path`` opened for reading in binary, if it is a regular file (symlinks followed).

    The file is opened without blocking, so that a FIFO (whose open would wait for a
    writer forever) is opened at once, then checked by ``fstat`` through the handle:
    anything but a regular file (a FIFO, a device such as ``/dev/zero``, which never ends)
    is refused before a byte is read. The flag is cleared again for the reads.

    Args:
        path: the file.
        refuse: the error for a file that is not regular, given the path and what the file
            is ("a FIFO"); by default an :class:`UnsupportedFormatError`.

    Returns:
        An open binary file object (``name`` is ``path``); the caller closes it.

    Raises:
        CheckpointError: from ``refuse``: not a regular file.
        OSError: it cannot be opened.
    """

    def opener(name: str, flags: int) -> int:
        fd = os.open(name, flags | _NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        try:
            mode = os.fstat(fd).st_mode
            if not stat.S_ISREG(mode):
                raise refuse(name, file_kind(mode))
            if _NONBLOCK:
                os.set_blocking(fd, True)
        except BaseException:
            os.close(fd)
            raise
        return fd

    return open(os.fspath(path), "rb", opener=opener)


@contextlib.contextmanager
def open_source(path_or_file: PathOrFile, *, since: FileStamp | None = None) -> Iterator[Source]:
    """A :class:`Source` over a path (opened and closed here) or a caller's file object.

    When the block ends without an error, the file is checked not to have changed since the
    source was opened — or since ``since``, an earlier stamp of the same handle (the first
    pass of a two-pass read), which is then also checked on entry, before the block reads
    anything. Errors raised inside carry the file's name; a ``MemoryError`` raised inside
    becomes a :class:`FileTooLargeError` naming the file and its size.

    A path is opened by :func:`open_regular`: a FIFO or a device is refused, never read.

    Raises:
        FileChangedError: the file changed meanwhile (see :meth:`FileStamp.same_contents`).
        UnsupportedFormatError: the path is not a regular file (a FIFO, a device).
    """
    if isinstance(path_or_file, (str, os.PathLike)):
        name: Any = os.fspath(path_or_file)
        ctx: Any = open_regular(name)
    else:
        name = getattr(path_or_file, "name", None)
        ctx = contextlib.nullcontext(path_or_file)
    with ctx as file:
        src: Source | None = None
        try:
            src = Source(file, name)
            if since is not None:
                src.check_unchanged(since, "before reading on")
            yield src
            src.check_unchanged(src.stamp if since is None else since, "after the last byte")
        except CheckpointError as exc:
            exc.with_path(name)
            raise
        except MemoryError:
            if src is None:
                raise
            size = src.size - src.start
            raise FileTooLargeError(
                f"out of memory while reading this {size:,}-byte file",
                path=name,
                actual=size,
            ) from None
