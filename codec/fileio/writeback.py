"""Early writeback: the disk writes a file's first bytes while the next ones are copied.

A durable save writes its bytes into the page cache, then ``fsync``\\ s: the disk starts only
at the ``fsync``, and the save waits for every byte twice over — once copied, once written.
:class:`Writeback` asks the kernel to start writing each window of :data:`WINDOW_BYTES` as
soon as it is in the page cache (Linux ``sync_file_range(SYNC_FILE_RANGE_WRITE)``, the
technique of RocksDB's ``bytes_per_sync``), so that the copy and the disk overlap and the
final ``fsync`` finds little left to do. Measured on a 256 MiB file (32 writes of 8 MiB,
ext4 on a virtual disk, 7 runs in turns): 88 ms write + ``fsync`` against 140 ms, the
``fsync`` 3 ms against 80 ms; windows of 2, 8, 32 and 64 MiB gave 96, 88, 111 and 132 ms.

It is a hint and only a hint: it neither waits for the disk nor makes anything durable, and
the ``fsync`` that every durable save still ends with is the guarantee. Only
``SYNC_FILE_RANGE_WRITE`` is used, which reports no writeback error and consumes none (the
kernel checks and advances the file's error sequence only with ``WAIT_AFTER``): an I/O
error is reported by that ``fsync`` as before. Where the call is missing (not Linux) or the
file cannot take it (a pipe, a file system without it), nothing is asked again for that file
and the save goes on as without it.
"""

from __future__ import annotations

import ctypes
import errno
import os
from typing import Any

__all__ = ["WINDOW_BYTES", "Writeback"]

#: Bytes written between two requests (see the module docstring for the measurements).
WINDOW_BYTES = 8 << 20

_SYNC_FILE_RANGE_WRITE = 2  # linux/fs.h


def _sync_file_range() -> Any:
    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):  # not Linux (or a C library without it)
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_SYNC_FILE_RANGE = _sync_file_range()


class Writeback:
    """Early writeback of one file being written (see the module docstring).

    Args:
        fd: the file's descriptor, open for writing; ``None``: nothing is ever asked (a file
            object without a plain descriptor).

    Example:
        >>> wb = Writeback(fd)              # doctest: +SKIP
        >>> wb.wrote(os.write(fd, chunk))   # doctest: +SKIP
    """

    __slots__ = ("fd", "pending")

    def __init__(self, fd: int | None):
        self.fd = fd if _SYNC_FILE_RANGE is not None else None
        self.pending = 0

    def wrote(self, nbytes: int) -> None:
        """Count ``nbytes`` just handed to the kernel; once a window is full, ask it to start
        writing the file's dirty pages (all of them: those of a buffered writer's earlier
        flushes too), without waiting."""
        if self.fd is None:
            return
        self.pending += nbytes
        if self.pending < WINDOW_BYTES:
            return
        self.pending = 0
        if _SYNC_FILE_RANGE(self.fd, 0, 0, _SYNC_FILE_RANGE_WRITE) != 0:
            code = ctypes.get_errno()
            self.fd = None  # asked no more for this file
            if code == errno.EBADF:  # not an open descriptor: a caller's bug
                raise OSError(code, os.strerror(code))
            # ESPIPE, EINVAL, ENOSYS, EOPNOTSUPP: not for this file; EIO, ENOSPC: an error
            # the final fsync reports (this call consumes none).
