"""Fresh memory for a load's new values, cheap to fault in.

Memory a load reads into for the first time costs a page fault per 4 KiB page (measured
~2 µs each on a virtual machine: half a second for 1 GiB, five times the read itself).
Large buffers therefore come from their own private anonymous mapping marked for
transparent huge pages (``madvise(MADV_HUGEPAGE)``, honoured by kernels whose THP mode is
``always`` or ``madvise``): one fault per 2 MiB instead of 512 (measured 512 MiB: 48 ms
instead of 270 ms). The mapping is returned to the system when the last array or tensor
over it is freed. Small buffers come from the ordinary allocator.
"""

from __future__ import annotations

import contextlib
import mmap

import numpy as np

__all__ = ["HUGE_MIN_BYTES", "fresh_bytes"]

#: Buffers from this size on get a mapping of their own with huge pages.
HUGE_MIN_BYTES = 4 << 20

_FLAGS = getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0)
_HUGEPAGE = getattr(mmap, "MADV_HUGEPAGE", None)


def fresh_bytes(nbytes: int) -> np.ndarray:
    """A writable uint8 array of ``nbytes`` (contents undefined; zero for a fresh mapping).

    Arrays of :data:`HUGE_MIN_BYTES` or more own a private anonymous mapping advised to use
    huge pages; views of the array (numpy or ``torch.from_numpy``) keep it alive.
    """
    if nbytes < HUGE_MIN_BYTES or not _FLAGS:
        return np.empty(nbytes, dtype=np.uint8)
    region = mmap.mmap(-1, nbytes, flags=_FLAGS)
    if _HUGEPAGE is not None:
        with contextlib.suppress(OSError):  # a kernel without THP: ordinary pages
            region.madvise(_HUGEPAGE)
    return np.frombuffer(region, dtype=np.uint8)
