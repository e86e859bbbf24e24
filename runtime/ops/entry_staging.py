"""A safetensors file's tensors read off to the side in one pass: the staging of the
safetensors loads (:mod:`.named_module_state`: ``load_module_state`` of a ``.safetensors``
file and a set's safetensors model member).

Measured on a 200 MB bf16 model (warm page cache): reading each tensor into its own fresh
``torch.empty`` spent ~75% of the time in page faults (one per 4 KiB of fresh memory, 130 ms)
against 30 ms for the same read into memory backed by transparent huge pages (one fault per
2 MiB). So the tensors needed are read, in file order, into one region of anonymous memory
that asks for huge pages (``MADV_HUGEPAGE``) when free ones are at hand (else ordinary memory:
see :func:`staging_region`), each run of adjacent tensors by one ``readinto`` (a plain file's
large reads go to several threads; a set member's digesting reader hashes the run as it
arrives, in order, so a set restore reads and verifies its member in one pass). Each tensor
is a view of the region; the region is freed with the last view.
"""

from __future__ import annotations

import contextlib
import mmap
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

from ...codec.fileio.source import Source
from ...codec.safetensors import Header, TensorEntry
from .tensor_files import read_entry, torch_dtype, torch_shape

__all__ = [
    "stage_entries",
    "StagingRegion",
    "free_huge_blocks",
    "HUGE_PAGE",
    "REGION_MIN_BYTES",
]

#: The huge-page size the region is aligned to (x86-64 and arm64 with 4 KiB pages).
HUGE_PAGE = 2 << 20
#: From this size on the tensors are staged in an anonymous region asking for huge pages;
#: below it, in one ordinary allocation (a fault or two either way).
REGION_MIN_BYTES = 4 << 20
#: Each run's first byte is placed at an address congruent to its file offset modulo this,
#: so that a tensor aligned in the file (every writer aligns them) is aligned in memory.
_ALIGN = 64


def free_huge_blocks() -> int:
    """Free blocks of 2 MiB the kernel holds right now (orders 9 and 10 of
    ``/proc/buddyinfo``, every zone); 0 where it cannot be read."""
    try:
        with open("/proc/buddyinfo", encoding="ascii") as f:
            lines = f.read().splitlines()
    except OSError:
        return 0
    total = 0
    for line in lines:
        counts = line.split()[4:]  # "Node 0, zone Normal" then the counts of orders 0..10
        if len(counts) == 11 and all(c.isdigit() for c in counts):
            total += int(counts[9]) + 2 * int(counts[10])
    return total


class StagingRegion:
    """``nbytes`` bytes of fresh memory, from which tensors with storages of their own are
    carved (each keeps the memory alive; it is freed with the last of them).

    From :data:`REGION_MIN_BYTES` on it is one anonymous mapping aligned to 2 MiB, backed by
    transparent huge pages (``MADV_HUGEPAGE``) when the kernel has enough free 2 MiB blocks
    to give them without compacting memory. Huge pages are asked for only then because with
    the kernel's default ``defrag`` setting (``madvise``) a fault in such a region compacts
    memory synchronously when no free block is at hand — on a machine whose page cache holds
    recent checkpoints a 512 MiB staged load was measured at 0.55 to 2.7 s that way, against
    0.63 to 0.76 s with ordinary pages (``docs/performance.md``). With free blocks at hand
    each fault takes one (30 ms against 130 ms for 200 MB here).

    Raises:
        OSError: the memory could not be mapped.
    """

    def __init__(self, nbytes: int):
        self.buffer: Any
        if nbytes < REGION_MIN_BYTES or not hasattr(mmap, "MADV_HUGEPAGE"):
            self.buffer = np.empty(nbytes + _ALIGN, dtype=np.uint8)
            self.skip = -self.buffer.ctypes.data % _ALIGN
            return
        self.buffer = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        # Twice the blocks needed: other processes may take some meanwhile.
        if free_huge_blocks() >= 2 * (nbytes // HUGE_PAGE + 1):
            with contextlib.suppress(OSError):  # a kernel without THP: ordinary pages
                self.buffer.madvise(mmap.MADV_HUGEPAGE)
        self.skip = -np.frombuffer(self.buffer, dtype=np.uint8).ctypes.data % HUGE_PAGE

    def array(self, at: int, nbytes: int) -> np.ndarray:
        """Bytes ``[at, at + nbytes)`` as a numpy array (to read into)."""
        return np.frombuffer(self.buffer, dtype=np.uint8, count=nbytes, offset=self.skip + at)

    def tensor(self, at: int, nbytes: int) -> torch.Tensor:
        """Bytes ``[at, at + nbytes)`` (``nbytes`` > 0) as a flat ``uint8`` tensor whose
        storage is exactly them."""
        return torch.frombuffer(self.buffer, dtype=torch.uint8, count=nbytes, offset=self.skip + at)


def _runs(entries: list[TensorEntry]) -> list[list[TensorEntry]]:
    """The entries (in file order) cut into runs of adjacent bytes."""
    runs: list[list[TensorEntry]] = []
    for entry in entries:
        if runs and runs[-1][-1].end == entry.begin:
            runs[-1].append(entry)
        else:
            runs.append([entry])
    return runs


def _aligned(entry: TensorEntry) -> bool:
    return entry.begin % max(1, torch_dtype(entry).itemsize) == 0


def stage_entries(src: Source, header: Header, names: Iterable[str]) -> dict[str, torch.Tensor]:
    """Read tensors ``names`` of the file (its header checked) into fresh CPU tensors.

    The reads go in file order, each run of adjacent tensors in one call (see the module
    docstring); a tensor not aligned for its dtype in the file (no writer makes one) is read
    into its own tensor.

    Returns:
        name → a tensor of the entry's torch dtype and shape holding its exact bytes, with a
        storage of its own (:meth:`StagingRegion.tensor`).

    Raises:
        ConfigError: a dtype torch has no dtype for.
        TruncatedError / FileChangedError: the file shrank or changed since its header.
        OSError: from the file system.
    """
    entries = sorted((header.entries[n] for n in dict.fromkeys(names)), key=lambda e: e.begin)
    out: dict[str, torch.Tensor] = {}
    staged = [e for e in entries if e.nbytes and _aligned(e)]
    runs = _runs(staged)
    spans = [(run[0].begin, run[-1].end) for run in runs]
    places, total = [], 0
    for begin, end in spans:
        total += (begin - total) % _ALIGN  # the run's first byte congruent to its offset
        places.append(total)
        total += end - begin
    region = StagingRegion(total)
    for run, (begin, end), place in zip(runs, spans, places):
        src.seek(src.start + header.data_start + begin)
        src.readinto(region.array(place, end - begin), f"header[{run[0].name!r}]")
        for entry in run:
            dtype = torch_dtype(entry)
            flat = region.tensor(place + entry.begin - begin, entry.nbytes).view(dtype)
            out[entry.name] = flat.reshape(torch_shape(entry, dtype))
    for entry in entries:
        if entry.name not in out:  # empty, or not aligned for its dtype
            out[entry.name] = read_entry(src, header, entry)
    return out
