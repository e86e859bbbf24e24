"""A leased file's bytes copied from the page cache in user space (Linux).

Why: ``preadv`` copies in the kernel, and the kernel's copy slows down by more than half when
the file offset and the destination differ in alignment within a cache line — as they do for
every payload of a format whose header is not padded (``TLSF32B``: 60 ms for 512 MiB of
warm page cache against 37 ms aligned, measured on the project's machine; the same bytes
copied from a mapping of the file: 37 ms at either alignment). So a load that holds a read
lease copies the large payloads whose pages are already in memory from a read-only mapping
of the file (``memmove``, a few threads), and reads the rest with ``preadv``, which is faster
than faulting pages in from disk through a mapping.

Why this is safe, and where it would not be: touching a mapping raises ``SIGBUS`` (the
process ends) where the file has shrunk under it, or where reading a page from the disk
fails. Neither can happen to a chunk copied here:

* the file is leased (:mod:`.leases`): nobody can truncate it until the lease is released,
  or until a writer has waited ``fs.lease-break-time`` (45 s by default; leases are not taken
  under 2 s). Each window (:data:`~.transfer.MAPPED_WINDOW`) is copied from the mapping only
  while the lease is unbroken; once a writer asks, the rest is read with ``preadv`` (which
  meets a shrunk file as a short read). So the copy of one window would have to take the
  whole break time for the kernel to let the writer through under it;
* every page of a window is mapped in by ``MADV_POPULATE_READ`` right before the copy, which
  reports a page it cannot read as an error (the chunk is then read instead). A page another
  thread has meanwhile dropped from the page tables is mapped again from the page cache.

A chunk is taken from the mapping only where the page in its middle is in memory
(``mincore``): cold chunks are read, ``preadv`` fetching from the disk faster than page
faults. The mapping spans the file's size when the load checked it: payloads lie inside it.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
from collections.abc import Iterator
from typing import BinaryIO

import numpy as np

from .leases import ReadLease
from .threads import THREADS, run_parallel
from .transfer import MAPPED_WINDOW, PARALLEL_MIN_BYTES

__all__ = ["FileMapping", "mapped"]

_PAGE = mmap.PAGESIZE


def _libc_function(name: str, restype: type, *argtypes: type) -> object | None:
    try:
        fn = getattr(ctypes.CDLL(None, use_errno=True), name)
    except (OSError, AttributeError):  # no such function here: no mapped copies
        return None
    fn.argtypes, fn.restype = list(argtypes), restype
    return fn


_mincore = _libc_function(
    "mincore", ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p
)
_memcmp = _libc_function("memcmp", ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
#: ``madvise(MADV_POPULATE_READ)`` (Linux 5.14): map a range's pages in, reading any that
#: are not in memory, and fail (``EFAULT``/``EIO``) where one cannot be read.
_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)
#: Bytes of each range compared per window (mapped in, compared, dropped from the page
#: tables): half the copies' window (:data:`~.transfer.MAPPED_WINDOW`), two ranges at once.
_COMPARE_BYTES = MAPPED_WINDOW // 2


class FileMapping:
    """A read-only shared mapping of a leased file (see the module docstring).

    Attributes:
        address: the mapping's first byte (the file's byte 0).
        size: bytes mapped.
    """

    def __init__(self, region: mmap.mmap, lease: ReadLease):
        self._region = region
        self._array = np.frombuffer(region, dtype=np.uint8)
        self.address = int(self._array.__array_interface__["data"][0])
        self.size = len(region)
        self.lease = lease

    def usable(self, offset: int, nbytes: int) -> bool:
        r"""Whether ``nbytes`` from ``offset`` are worth copying from the mapping: inside it,
        the lease unbroken, and the page in the range's middle in memory (else the range is
        taken for cold: ``preadv`` reads it faster; its ends may share a page with a header
        the load has just read). Each window is then :meth:`populate`\ d before its copy."""
        if offset < 0 or offset + nbytes > self.size or not self.lease.unbroken():
            return False
        middle = (offset + nbytes // 2) // _PAGE * _PAGE
        resident = ctypes.c_ubyte(0)  # one per call: threads ask at once
        if _mincore(self.address + middle, 1, ctypes.byref(resident)) != 0:  # type: ignore[operator]
            return False
        return bool(resident.value & 1)

    def populate(self, offset: int, nbytes: int) -> bool:
        """Map every page of the range in, right before it is copied: ``True`` when the lease
        is still unbroken and ``MADV_POPULATE_READ`` succeeded — it reports a page it cannot
        read as an error, where a copy touching that page would end the process."""
        if not self.lease.unbroken():
            return False
        first = offset - offset % _PAGE
        try:
            self._region.madvise(_POPULATE_READ, first, offset + nbytes - first)
        except (OSError, ValueError):
            return False
        return True

    def same(self, first: int, second: int, nbytes: int) -> bool | None:
        """Whether the file's ``nbytes`` at ``first`` and at ``second`` are equal, compared
        in the mapping a chunk at a time (large ranges on a few threads); ``None`` (read them
        instead) where a chunk is not :meth:`usable`."""
        if _memcmp is None:
            return None
        chunks = [(at, min(_COMPARE_BYTES, nbytes - at)) for at in range(0, nbytes, _COMPARE_BYTES)]

        def compare(chunk: tuple[int, int]) -> bool | None:
            at, n = chunk
            if not (self.usable(first + at, n) and self.usable(second + at, n)):
                return None
            if not (self.populate(first + at, n) and self.populate(second + at, n)):
                return None
            equal = _memcmp(self.address + first + at, self.address + second + at, n) == 0  # type: ignore[operator]
            self.release(first + at, n)
            self.release(second + at, n)
            return equal

        if nbytes < PARALLEL_MIN_BYTES or THREADS == 1:
            verdicts = []
            for chunk in chunks:
                verdicts.append(compare(chunk))
                if verdicts[-1] is not True:
                    break
        else:  # every job finishes before the call returns: none outlives the mapping
            verdicts = run_parallel(compare, chunks, self)
        if None in verdicts:
            return None
        return all(verdicts)

    def release(self, offset: int, nbytes: int) -> None:
        """Drop this process's page-table entries for the whole pages inside the range, once
        copied: the pages stay in the page cache, and do not count in the process's resident
        set (without this, a load would look to grow it by the file's size)."""
        # Whole pages, the edges included: a page another thread is still copying from is
        # mapped in again by its next touch (it stays in the page cache: no error).
        first = offset // _PAGE * _PAGE
        last = min(-(-(offset + nbytes) // _PAGE) * _PAGE, -(-self.size // _PAGE) * _PAGE)
        if last > first:
            with contextlib.suppress(OSError, ValueError):  # only bookkeeping is lost
                self._region.madvise(mmap.MADV_DONTNEED, first, last - first)

    def close(self) -> None:
        """Unmap (the caller's lease and file stay as they are)."""
        del self._array
        with contextlib.suppress(BufferError):  # a view still held: unmapped when it goes
            self._region.close()


@contextlib.contextmanager
def mapped(file: BinaryIO, lease: ReadLease | None) -> Iterator[FileMapping | None]:
    """A :class:`FileMapping` of ``file`` for the block, or ``None`` where there is no lease,
    nothing to map, or no mapping to be had (the caller then reads as before)."""
    mapping = None
    if lease is not None and _mincore is not None:
        try:
            size = os.fstat(file.fileno()).st_size
            if size:
                region = mmap.mmap(file.fileno(), size, access=mmap.ACCESS_READ)
                mapping = FileMapping(region, lease)
        except (OSError, ValueError, AttributeError):  # no mapping: preadv alone
            mapping = None
    try:
        yield mapping
    finally:
        if mapping is not None:
            mapping.close()
