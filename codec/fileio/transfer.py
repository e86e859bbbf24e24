"""Payload bytes moved in bulk: positional vectored reads, gathered writes, batched copies.

A load that knows where every payload lies in the file (a checked layout) and where each
must land in memory (live tensors, staging) hands both lists to :func:`read_extents`, which
moves them with as few system calls as the kernel allows instead of one ``readinto`` per
payload:

* consecutive pieces of the file go to ``preadv`` together, up to :data:`IOV_MAX` pieces
  (records) per call: 20,000 small tensors are 40 calls, not 20,000;
* a large piece is split into chunks of :data:`CHUNK_BYTES`, read by a few threads at once
  (positional reads release the GIL and move no file offset, so they run in parallel);
* a short read means the file shrank: :class:`~.errors.TruncatedError` at the first byte
  that was not there.

The same lists drive :func:`copy_extents` (a staged load's commit: memory to memory, big
pieces in parallel) and :class:`GatherBatch` (a save: headers and payloads handed to the
output object as one vectored write).

Memory is named by address (``data_ptr()``, ``ndarray.ctypes.data``) so that tens of
thousands of tensors need no Python buffer object each; every :class:`Extents` holds the
objects that own that memory (``owners``), and every worker thread holds the
:class:`Extents` it works on, so memory cannot be freed under a read that is still running
(not even when an interrupt stops the caller's wait). File objects without a plain file
descriptor (``io.BytesIO``, wrappers) are read and written piece by piece through their own
``readinto``/``write``.
"""

from __future__ import annotations

import ctypes
import io
import itertools
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Protocol

import numpy as np

from ..errors import TruncatedError
from ..paths import field_name
from .threads import THREADS, run_parallel

__all__ = [
    "CHUNK_BYTES",
    "GAP_BYTES",
    "IOV_MAX",
    "MAPPED_MIN_PIECE",
    "MAPPED_WINDOW",
    "MappedFile",
    "PARALLEL_MIN_BYTES",
    "Extents",
    "GatherBatch",
    "address_of",
    "copy_extents",
    "plain_fd",
    "read_extents",
    "write_gather",
]

#: Most pieces one ``preadv``/``writev`` call takes (the kernel's limit, at most 1024).
IOV_MAX = min(int(os.sysconf("SC_IOV_MAX")) if hasattr(os, "sysconf") else 1024, 1024)
#: Bytes per call: large pieces are split into chunks of this size, read by several threads.
CHUNK_BYTES = 8 << 20
#: Gaps between pieces up to this size are read too (into scratch memory), so that the
#: pieces around them share one call: headers between small payloads, small payloads
#: between headers.
GAP_BYTES = 64 << 10
#: Transfers smaller than this run on the calling thread alone (threads cost ~0.1 ms).
PARALLEL_MIN_BYTES = 32 << 20
#: A read copies from a mapping (:mod:`.mapped`) only where its pieces average this much:
#: below, a ``memmove`` call per piece costs more than the kernel's slower copy.
MAPPED_MIN_PIECE = 256 << 10

# ``struct iovec`` is two machine words; the address/length table below is laid out as
# exactly that, so numpy builds it without a per-piece Python call.
_WORD = ctypes.sizeof(ctypes.c_void_p)
_IOVEC = np.dtype(f"u{_WORD}")


def _libc_function(name: str, *argtypes: Any) -> Any:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = getattr(libc, name)
    except (OSError, AttributeError):  # no such function here: the piece-by-piece path
        return None
    fn.argtypes = list(argtypes)
    fn.restype = ctypes.c_ssize_t
    return fn


_preadv = _libc_function("preadv", ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong)
_writev = _libc_function("writev", ctypes.c_int, ctypes.c_void_p, ctypes.c_int)


def address_of(array: np.ndarray) -> int:
    """The address of a numpy array's first byte."""
    return int(array.__array_interface__["data"][0])


@dataclass
class Extents:
    """Pieces of memory, in order, and (for reads) where each lies in the file.

    Attributes:
        addresses: first byte of each piece in memory.
        lengths: bytes of each piece.
        offsets: each piece's absolute position in the file (reads only; ``None`` for a
            write, which goes where the output stands).
        owners: the objects that own the memory (tensors, arrays, mappings); held here, and
            by every thread that works on the pieces, for as long as they may be touched.
    """

    addresses: np.ndarray
    lengths: np.ndarray
    offsets: np.ndarray | None = None
    owners: list[Any] = field(default_factory=list)

    @classmethod
    def build(
        cls,
        addresses: Sequence[int] | np.ndarray,
        lengths: Sequence[int] | np.ndarray,
        offsets: Sequence[int] | np.ndarray | None,
        owners: list[Any],
    ) -> Extents:
        """Extents from sequences of numbers (converted once, with numpy)."""
        return cls(
            np.asarray(addresses, dtype=np.uint64),
            np.asarray(lengths, dtype=np.uint64),
            None if offsets is None else np.asarray(offsets, dtype=np.int64),
            owners,
        )

    def __len__(self) -> int:
        return len(self.lengths)

    @property
    def nbytes(self) -> int:
        return int(self.lengths.sum())


def plain_fd(file: Any) -> int | None:
    """The descriptor of a plain OS file (``FileIO``, or a buffered reader or writer over
    one), whose bytes are the descriptor's bytes; ``None`` for anything else (a wrapper's
    ``fileno`` may name a file whose bytes differ from what the wrapper reads)."""
    raw = file
    if type(file) in (io.BufferedReader, io.BufferedWriter, io.BufferedRandom):
        raw = file.raw
    if type(raw) is not io.FileIO or raw.closed:
        return None
    return raw.fileno()


def _buffers(addresses: np.ndarray, lengths: np.ndarray) -> Iterator[memoryview]:
    """A writable view of each non-empty piece (empty pieces are left out)."""
    for address, length in zip(addresses.tolist(), lengths.tolist()):
        if length:
            yield _view(address, length)


def _view(address: int, length: int) -> memoryview:
    return memoryview((ctypes.c_char * length).from_address(address)).cast("B")


# ------------------------------------------------------------------------------ reading


@dataclass(frozen=True)
class _Call:
    """One positional read of ``nbytes`` from ``offset`` on into a table of pieces."""

    offset: int
    table: np.ndarray  # (n, 2) words: address, length (``struct iovec``)
    nbytes: int
    through: int  # the caller's pieces this call may write: all of those before this index


def _calls(extents: Extents, scratch: np.ndarray) -> list[_Call]:
    """The reads that cover the pieces: runs of pieces adjacent in the file (small gaps
    between them read into ``scratch``), at most :data:`IOV_MAX` pieces and
    :data:`CHUNK_BYTES` per call; a piece larger than a chunk in chunks of its own."""
    offsets, addresses, lengths = extents.offsets, extents.addresses, extents.lengths
    if offsets is None:
        raise ValueError("reading needs the pieces' file offsets")
    origin = np.arange(len(lengths), dtype=np.int64)  # each piece's index in the caller's
    if len(lengths) > 1:  # bridge small gaps: piece, gap, piece, gap, ..., piece
        ends = offsets[:-1] + lengths[:-1].astype(np.int64)
        gaps = offsets[1:] - ends
        bridged = np.where((gaps > 0) & (gaps <= len(scratch)), gaps, 0)
        m = 2 * len(lengths) - 1
        both = np.empty(m, dtype=np.int64)
        both[0::2], both[1::2] = offsets, ends
        offsets = both
        both = np.full(m, address_of(scratch) if len(scratch) else 0, dtype=np.uint64)
        both[0::2] = addresses
        addresses = both
        both = np.empty(m, dtype=np.uint64)
        both[0::2], both[1::2] = lengths, bridged
        lengths = both
        origin = np.arange(m, dtype=np.int64) // 2  # a gap counts with the piece before it
    keep = lengths > 0
    if not keep.all():
        offsets, addresses, lengths = offsets[keep], addresses[keep], lengths[keep]
        origin = origin[keep]
    n = len(lengths)
    if not n:
        return []
    table = np.empty((n, 2), dtype=_IOVEC)
    table[:, 0] = addresses
    table[:, 1] = lengths
    ends = offsets + lengths.astype(np.int64)
    # A new call starts where the file is not contiguous, or at a large piece.
    big = lengths > CHUNK_BYTES
    starts = np.ones(n, dtype=bool)
    starts[1:] = (offsets[1:] != ends[:-1]) | big[1:] | big[:-1]
    heads = np.flatnonzero(starts).tolist()
    heads.append(n)
    running = np.concatenate(([0], np.cumsum(lengths, dtype=np.int64)))
    calls: list[_Call] = []
    for a, b in itertools.pairwise(heads):
        if b - a == 1 and int(lengths[a]) > CHUNK_BYTES:  # one large piece: its own chunks
            address, offset, size = int(table[a, 0]), int(offsets[a]), int(lengths[a])
            for at in range(0, size, CHUNK_BYTES):
                part = min(CHUNK_BYTES, size - at)
                row = np.array([[address + at, part]], dtype=_IOVEC)
                calls.append(_Call(offset + at, row, part, int(origin[a]) + 1))
            continue
        # Split the run where it exceeds the piece or byte budget of one call.
        k = a
        while k < b:
            before = int(running[k])
            over = int(np.searchsorted(running, before + CHUNK_BYTES, side="right")) - 1
            end = max(k + 1, min(b, k + IOV_MAX, over))
            span = int(running[end]) - before
            calls.append(_Call(int(offsets[k]), table[k:end], span, int(origin[end - 1]) + 1))
            k = end
    return calls


def _advance(table: np.ndarray, n: int) -> np.ndarray:
    """What is left of an iovec table once its first ``n`` bytes have been moved."""
    full = np.cumsum(table[:, 1].astype(np.int64))
    skip = int(np.searchsorted(full, n, side="right"))
    used = n - (int(full[skip - 1]) if skip else 0)
    rest = table[skip:].copy()
    if used:
        rest[0, 0] += used
        rest[0, 1] -= used
    return rest


def _largest_gap(extents: Extents) -> int:
    """Bytes of scratch memory the gaps worth reading need (none above :data:`GAP_BYTES`)."""
    if extents.offsets is None or len(extents.lengths) < 2:
        return 0
    gaps = extents.offsets[1:] - (extents.offsets[:-1] + extents.lengths[:-1].astype(np.int64))
    gaps = gaps[(gaps > 0) & (gaps <= GAP_BYTES)]
    return int(gaps.max()) if len(gaps) else 0


def _truncated(offset: int, wanted: int, got: int, what: Any) -> TruncatedError:
    name = field_name(what)
    return TruncatedError(
        f"truncated checkpoint: {name} needs {wanted} bytes at byte {offset}, got {got}"
        " (the file shrank while it was read)",
        offset=offset + got,
        field=name,
        actual=got,
        expected=wanted,
    )


def _preadv_all(fd: int, call: _Call, what: Any) -> None:
    """Read one call's pieces completely, resuming after partial reads."""
    table, offset, left = call.table, call.offset, call.nbytes
    done = 0
    while left:
        n = _preadv(fd, table.ctypes.data, len(table), offset + done)
        if n < 0:
            err = ctypes.get_errno()
            if err == 4:  # EINTR: Python runs the signal's handler at the next bytecode
                continue
            raise OSError(err, os.strerror(err))
        if n == 0:
            raise _truncated(call.offset, call.nbytes, done, what)
        done += n
        left -= n
        if left:  # a partial read: go on with what is left
            table = _advance(table, n)


def _readinto_all(file: BinaryIO, extents: Extents, what: Any) -> None:
    """The piece-by-piece path of file objects without a plain descriptor."""
    if extents.offsets is None:
        raise ValueError("reading needs the pieces' file offsets")
    pieces = zip(extents.offsets.tolist(), extents.addresses.tolist(), extents.lengths.tolist())
    for offset, address, length in pieces:
        if not length:
            continue
        view = _view(address, length)
        file.seek(offset)
        got = 0
        while got < length:
            n = file.readinto(view[got:])
            if not n:
                raise _truncated(offset, length, got, what)
            got += n


class MappedFile(Protocol):
    """A mapping of the file read (:class:`~.mapped.FileMapping`), as reads use it."""

    address: int

    def usable(self, offset: int, nbytes: int) -> bool: ...

    def populate(self, offset: int, nbytes: int) -> bool: ...

    def release(self, offset: int, nbytes: int) -> None: ...


#: Bytes of a mapped copy mapped in, copied and dropped from the page tables at once
#: (:mod:`.mapped`): a window per thread in flight is what a load adds to the resident set.
#: 512 MiB / GPT-2 small warm: 8 MiB windows 18-21 MiB and 49 / 56 ms; 4 MiB 12.5 MiB and
#: 49 / 63 ms; 2 MiB 9 MiB and 55 / 70 ms (safetensors: 40 / 49 ms). GPT-2's load holds
#: ~10 MiB besides, and grew by 14-22 MiB with 4 MiB windows (docs/performance.md).
MAPPED_WINDOW = 2 << 20


def _copy_mapped(mapping: MappedFile, call: _Call) -> bool:
    """One call's pieces copied from a mapping of the file, a window at a time; ``False``
    where its pieces are too small to gain, :meth:`~.mapped.FileMapping.usable` says no, or a
    window cannot be mapped in (the caller then reads the whole call: what was copied is
    overwritten with the same bytes)."""
    if call.nbytes < MAPPED_MIN_PIECE * len(call.table):
        return False
    if not mapping.usable(call.offset, call.nbytes):
        return False
    rows = call.table.tolist()
    firsts = [0, *itertools.accumulate(length for _, length in rows)]  # row k: [firsts[k], +1)
    source, k = mapping.address + call.offset, 0
    for w0 in range(0, call.nbytes, MAPPED_WINDOW):
        w1 = min(w0 + MAPPED_WINDOW, call.nbytes)
        if not mapping.populate(call.offset + w0, w1 - w0):
            return False
        while k < len(rows) and firsts[k] < w1:
            a, b = max(firsts[k], w0), min(firsts[k + 1], w1)
            ctypes.memmove(rows[k][0] + a - firsts[k], source + a, b - a)
            if firsts[k + 1] > w1:
                break  # the row goes on in the next window
            k += 1
        mapping.release(call.offset + w0, w1 - w0)
    return True


def read_extents(
    file: BinaryIO,
    extents: Extents,
    what: Any = "payload",
    progress: Callable[[int], None] | None = None,
    mapping: MappedFile | None = None,
) -> None:
    """Fill every piece of memory from its place in the file.

    Args:
        file: the open file (its position does not move where it has a plain descriptor).
        extents: the pieces, with their file offsets (in increasing order).
        what: the field named by a :class:`TruncatedError`.
        progress: called before each read with the number of pieces (counted from the
            first) that may have been written into once it is done: a caller that must say
            how much memory a failed read touched counts up to there.
        mapping: a mapping of the same file under a read lease (:mod:`.mapped`): large
            pieces whose pages are in memory are copied from it, the rest read.

    Raises:
        TruncatedError: the file ended before a piece was complete.
        OSError: from the file system.
    """
    fd = plain_fd(file)
    if fd is None or _preadv is None:
        if progress is not None:
            progress(len(extents))
        _readinto_all(file, extents, what)
        return
    scratch = np.empty(_largest_gap(extents), dtype=np.uint8)
    extents = Extents(extents.addresses, extents.lengths, extents.offsets, [extents, scratch])
    calls = _calls(extents, scratch)
    total = sum(c.nbytes for c in calls)

    def read(call: _Call) -> None:
        if mapping is None or not _copy_mapped(mapping, call):
            _preadv_all(fd, call, what)

    if total >= PARALLEL_MIN_BYTES and len(calls) > 1 and THREADS > 1:
        if progress is not None:
            progress(len(extents))
        run_parallel(read, calls, extents)
        return
    for call in calls:
        if progress is not None:
            progress(call.through)
        read(call)


# ------------------------------------------------------------------------------ copying


def copy_extents(destinations: Extents, sources: Extents) -> None:
    """Copy each source piece over its destination piece (same lengths, in order).

    Small pieces are copied one ``memmove`` each on the calling thread; with a large total,
    pieces are cut into chunks copied by :data:`THREADS` threads.
    """
    if len(destinations) != len(sources) or not np.array_equal(
        destinations.lengths, sources.lengths
    ):
        raise ValueError("copy_extents: the pieces differ in number or length")
    dst = destinations.addresses.tolist()
    src = sources.addresses.tolist()
    sizes = sources.lengths.tolist()
    total = sum(sizes)
    move = ctypes.memmove
    if total < PARALLEL_MIN_BYTES or THREADS == 1:
        for d, s, n in zip(dst, src, sizes):
            move(d, s, n)
        return
    chunks = []
    for d, s, n in zip(dst, src, sizes):
        for at in range(0, n, CHUNK_BYTES):
            chunks.append((d + at, s + at, min(CHUNK_BYTES, n - at)))
    both = Extents(destinations.addresses, destinations.lengths, None, [destinations, sources])
    run_parallel(lambda c: move(*c), chunks, both)


# ------------------------------------------------------------------------------ writing


class GatherBatch:
    """Buffers to be written one after the other, as one vectored write.

    The contract with output objects: a writer calls ``out.writev(batch)`` when ``out`` has
    a ``writev`` method, and that method must write the batch's bytes, in order, where the
    output stands — a wrapper that digests every byte written iterates the batch (each
    item a read-only ``memoryview``; the bytes of the batch in order) and then passes it on
    with :func:`write_gather`. Outputs without ``writev`` receive ``write(view)`` per
    buffer; plain OS files receive one ``writev(2)`` per :data:`IOV_MAX` buffers.
    """

    def __init__(self, extents: Extents):
        self.extents = extents

    def __iter__(self) -> Iterator[memoryview]:
        for view in _buffers(self.extents.addresses, self.extents.lengths):
            yield view.toreadonly()

    @property
    def nbytes(self) -> int:
        return self.extents.nbytes


def _writev_fd(fd: int, extents: Extents) -> None:
    lengths = extents.lengths
    keep = lengths > 0
    table = np.empty((int(keep.sum()), 2), dtype=_IOVEC)
    table[:, 0] = extents.addresses[keep]
    table[:, 1] = lengths[keep]
    k = 0
    while k < len(table):
        part = table[k : k + IOV_MAX].copy()
        left = int(part[:, 1].sum())
        while left:
            n = _writev(fd, part.ctypes.data, len(part))
            if n < 0:
                err = ctypes.get_errno()
                if err == 4:  # EINTR
                    continue
                raise OSError(err, os.strerror(err))
            left -= n
            if left:  # a partial write: go on with what is left
                part = _advance(part, n)
        k += IOV_MAX


def write_gather(out: BinaryIO, batch: GatherBatch) -> None:
    """Write ``batch`` to ``out`` where it stands (see :class:`GatherBatch`)."""
    writev = getattr(out, "writev", None)
    if writev is not None:
        writev(batch)
        return
    fd = plain_fd(out)
    if fd is None or _writev is None or (hasattr(out, "mode") and "a" in out.mode):
        for view in batch:
            out.write(view)
        return
    out.flush()  # what the buffered object holds goes first
    _writev_fd(fd, batch.extents)
    if out is not getattr(out, "raw", out):
        # The buffered object caches its position: make it ask the descriptor again.
        out.seek(0, io.SEEK_CUR)
