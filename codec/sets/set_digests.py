"""Digests of checkpoint-set members as their bytes stream: :class:`DigestingWriter` (size
and digest of what a save writes, one pass) and :class:`DigestingReader` (the digest of what a
load reads, the rest hashed once at the end). The digest is ``xxh3_128`` for an unsigned set,
BLAKE3 keyed with the set's member key for a signed one (``key``, a
:class:`~.set_keys.SetKey`).
"""

from __future__ import annotations

import errno
import os
import queue
import threading
from typing import Any, BinaryIO

from ..fileio.transfer import plain_fd
from ..fileio.writeback import Writeback
from ..sniffing import HEAD_BYTES
from .set_keys import SetKey, member_hash

__all__ = [
    "HASH_CHUNK",
    "PARALLEL_DIGEST_BYTES",
    "GAP_BYTES",
    "PIPELINED_READ_BYTES",
    "DigestingWriter",
    "DigestingReader",
    "hash_file",
]

#: Bytes read per call while hashing a member.
HASH_CHUNK = 16 << 20


#: Buffers from this size on are hashed by the digest thread while the calling thread writes
#: them (both release the GIL, so the two run on two cores); smaller ones are hashed inline.
PARALLEL_DIGEST_BYTES = 1 << 20
_ABSORB_CHUNK = 8 << 20  # bytes read back per chunk by DigestingWriter.absorb


class _DigestJob:
    """One ``update(data)`` handed to the digest thread; :meth:`result` waits for it."""

    __slots__ = ("data", "done", "error", "update")

    def __init__(self, update: Any, data: memoryview):
        self.update = update
        self.data: memoryview | None = data
        self.done = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.update(self.data)
        except BaseException as exc:  # handed to the waiting writer, which raises it
            self.error = exc
        finally:
            self.data = None
            self.done.set()

    def result(self) -> None:
        self.done.wait()
        if self.error is not None:
            raise self.error


class _DigestThread:
    """The digest thread of one process: a worker thread and its queue of jobs, in order.

    Not a ``concurrent.futures`` executor: those refuse work once interpreter shutdown has
    begun (``concurrent.futures`` sets its flag before the non-daemon threads are joined),
    and a background save that the end of a script leaves running must still hash its
    members. The thread is a daemon: it holds nothing between jobs, and every job's writer
    waits for it, so whatever a writer finishes, its hashing finished too.
    """

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.jobs: queue.SimpleQueue[_DigestJob] = queue.SimpleQueue()
        threading.Thread(target=self._serve, name="tlckpt-digest", daemon=True).start()

    def _serve(self) -> None:
        while True:
            self.jobs.get().run()

    def submit(self, update: Any, data: memoryview) -> _DigestJob:
        job = _DigestJob(update, data)
        self.jobs.put(job)
        return job


_digest_worker: _DigestThread | None = None


def _digest_thread() -> _DigestThread | None:
    """The digest thread of this process (a forked child gets its own: the parent's thread
    does not exist in it), or ``None`` where no thread can be started (Python 3.12 and later
    refuse new threads once shutdown has begun): the caller then hashes inline.

    No lock: two threads racing here at most start one spare thread, which stays idle; a
    lock could be held by another thread at a ``fork`` and never released in the child.
    """
    global _digest_worker
    worker = _digest_worker
    if worker is None or worker.pid != os.getpid():
        try:
            worker = _digest_worker = _DigestThread()
        except RuntimeError:  # "can't create new thread at interpreter shutdown", or none left
            return None
    return worker


class DigestingWriter:
    """A binary file object that hashes and counts every byte on its way to ``file``.

    The digest is of the bytes in the order written (``xxh3_128``, or the keyed BLAKE3 of
    ``key``: :func:`~.set_keys.member_hash`); one pass over the data,
    never a second one over the file. A large buffer is hashed by a worker thread while this
    thread writes it (both release the GIL), and :meth:`write` returns once both are done,
    so the caller may reuse its buffer at once and updates stay in order. The first
    :data:`~..sniffing.HEAD_BYTES` are kept, to name the family. Seeking is not offered: a
    writer that needs it fails (``AttributeError``) rather than digest bytes out of order.
    With ``writeback``, the disk is asked to start writing the file as the bytes arrive
    (:class:`~..fileio.writeback.Writeback`: the durable member's ``fsync`` then has little
    left to wait for).
    """

    def __init__(
        self, file: BinaryIO, key: SetKey | None = None, *, writeback: bool = False
    ) -> None:
        self.file = file
        self.hash = member_hash(key)
        self.size = 0
        self.head = bytearray()
        self.writeback = Writeback(plain_fd(file) if writeback else None)

    def write(self, data: Any) -> int:
        view = memoryview(data)
        if not view.c_contiguous:
            raise ValueError("write() needs a contiguous buffer")
        view = view.cast("B") if view.ndim != 1 or view.format != "B" else view
        worker = _digest_thread() if view.nbytes >= PARALLEL_DIGEST_BYTES else None
        if worker is not None:
            hashing = worker.submit(self.hash.update, view)
            try:
                written = self.file.write(view)
            finally:
                hashing.result()  # the caller may reuse the buffer once we return
        else:
            written = self.file.write(view)
            self.hash.update(view)
        if written is not None and written != view.nbytes:  # a raw file's short write
            raise OSError(errno.EIO, f"short write: {written} of {view.nbytes} bytes")
        self.writeback.wrote(view.nbytes)
        if len(self.head) < HEAD_BYTES:
            self.head += view[: HEAD_BYTES - len(self.head)]
        self.size += view.nbytes
        return view.nbytes

    def absorb(self, fd: int) -> None:
        """Digest the rest of the open file ``fd`` (from its position) as if it had been
        written here, without writing it anywhere: a member that several processes wrote
        in place (a sharded set's parallel path), read back once. Each chunk is hashed by
        the digest thread while the next one is read.

        Raises:
            OSError: from reading.
        """
        buffers = [bytearray(_ABSORB_CHUNK), bytearray(_ABSORB_CHUNK)]
        worker = _digest_thread()
        pending = None
        k = 0
        while True:
            view = memoryview(buffers[k])
            n = os.readv(fd, [view])
            if pending is not None:
                pending.result()  # the other buffer is free again
                pending = None
            if not n:
                return
            view = view[:n]
            if worker is not None:
                pending = worker.submit(self.hash.update, view)
            else:
                self.hash.update(view)
            if len(self.head) < HEAD_BYTES:
                self.head += view[: HEAD_BYTES - len(self.head)]
            self.size += n
            k ^= 1

    def flush(self) -> None:
        self.file.flush()

    def writable(self) -> bool:
        return True

    def hexdigest(self) -> str:
        """The digest of everything written so far."""
        return self.hash.hexdigest()


def _hash_range(fd: int, h: Any, start: int, stop: int, buffer: bytearray) -> int:
    """Feed bytes ``[start, stop)`` of ``fd`` to ``h`` (``pread``: the handle's position is
    left alone); returns where it stopped (before ``stop`` at the end of the file)."""
    view = memoryview(buffer)
    pos = start
    while pos < stop:
        n = os.preadv(fd, [view[: min(len(view), stop - pos)]], pos)
        if not n:
            break
        h.update(view[:n])
        pos += n
    return pos


def hash_file(file: BinaryIO, size: int, key: SetKey | None = None) -> tuple[str, int]:
    """The digest (:func:`~.set_keys.member_hash` of ``key``) and length of ``file``'s bytes
    from the start (one sequential pass), reading at most ``size + 1`` bytes.

    Args:
        file: an open file with a descriptor.
        size: the length expected (the manifest's): one byte more is read, so a file that
            grew shows in the length, and a file that never ends (a device) is not read on.
        key: the set's key (keyed BLAKE3), or ``None`` (XXH3-128).

    Returns:
        The digest of the bytes read and their number (``size + 1`` for a longer file).
    """
    h = member_hash(key)
    buffer = bytearray(min(HASH_CHUNK, size + 1))
    length = _hash_range(file.fileno(), h, 0, size + 1, buffer)
    return h.hexdigest(), length


#: From this size on a read through :class:`DigestingReader` is pipelined with its hashing.
PIPELINED_READ_BYTES = 2 * HASH_CHUNK

#: A read this close past the hashed prefix first hashes the bytes in between (a record's
#: header between two payloads); a longer jump is left for :meth:`DigestingReader.finish`,
#: where it is hashed once (a checking pass that skips payloads would otherwise hash them
#: all a second time by ``pread`` before the payload pass reads them).
GAP_BYTES = 64 << 10


class DigestingReader:
    """A read-only view of an open member file that hashes its bytes as a load reads them
    (:func:`~.set_keys.member_hash` of ``key``: keyed BLAKE3 for a signed set).

    The digest is of the file's bytes in order. A read that starts inside, at, or just past
    (:data:`GAP_BYTES`) the prefix hashed so far extends it with the very bytes the caller
    receives — hashed before they are handed over, so what was loaded is what was hashed.
    Bytes the caller never reads, or reads out of order, are hashed by :meth:`finish` (one
    ``pread`` pass over what is left). A load that reads its file front to back is thus
    verified without a second pass; any other pattern stays correct and costs the rest.

    The position is tracked here (every read goes through this object); ``fileno`` is
    offered for ``fstat`` only — bytes read through the descriptor directly are hashed by
    :meth:`finish` like any unread ones. Given the ``size`` expected, :meth:`finish` reads
    at most one byte past it.
    """

    def __init__(
        self,
        file: BinaryIO,
        name: Any = None,
        key: SetKey | None = None,
        size: int | None = None,
    ):
        self.file = file
        self.name = name
        # The length expected: :meth:`finish` reads at most one byte past it.
        self.limit = 2**63 - 1 if size is None else size + 1
        self.hash = member_hash(key)
        self.hashed = 0  # bytes [0, hashed) went into the hash
        self.pos = file.seek(0)

    def _consume(self, start: int, view: memoryview) -> None:
        if self.hashed < start <= self.hashed + GAP_BYTES:
            self.hashed = _hash_range(
                self.file.fileno(), self.hash, self.hashed, start, bytearray(start - self.hashed)
            )
        end = start + view.nbytes
        if start <= self.hashed < end:
            self.hash.update(view[self.hashed - start :])
            self.hashed = end

    def read(self, size: int | None = -1) -> bytes:
        data = self.file.read(size)
        self._consume(self.pos, memoryview(data))
        self.pos += len(data)
        return data

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        fd = plain_fd(self.file)
        if view.nbytes >= PIPELINED_READ_BYTES and fd is not None and self.pos == self.hashed:
            return self._pipelined(fd, view)
        n = self.file.readinto(view) or 0
        self._consume(self.pos, view[:n])
        self.pos += n
        return n

    def _pipelined(self, fd: int, view: memoryview) -> int:
        """A large read that extends the hashed prefix: chunk ``k`` is hashed by the digest
        thread while this thread reads chunk ``k + 1`` (both release the GIL), updates in
        order; it returns once every byte read is hashed (a safetensors member's one read
        of its data region: the hash costs no time where a second core is free)."""
        got, pending = 0, None
        try:
            while got < view.nbytes:
                part = view[got : got + HASH_CHUNK]
                n = os.preadv(fd, [part], self.pos + got)
                if pending is not None:
                    pending.result()
                    pending = None
                    self.hashed = self.pos + got
                if not n:
                    break
                worker = _digest_thread()
                if worker is None:
                    self.hash.update(part[:n])
                    self.hashed = self.pos + got + n
                else:
                    pending = worker.submit(self.hash.update, part[:n])
                got += n
            if pending is not None:
                pending.result()
                pending = None
                self.hashed = self.pos + got
        finally:
            if pending is not None:  # an error in this thread: the job still ends first
                pending.done.wait()
        self.pos += got
        self.file.seek(self.pos)
        return got

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        self.pos = self.file.seek(offset, whence)
        return self.pos

    def tell(self) -> int:
        return self.pos

    def fileno(self) -> int:
        return self.file.fileno()

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def finish(self) -> tuple[str, int]:
        """Hash whatever was not read in order, up to the end of the file.

        Returns:
            The digest of the whole file and its length (as found now; at most one byte
            past the ``size`` given, if any).
        """
        fd = self.file.fileno()
        left = min(os.fstat(fd).st_size, self.limit) - self.hashed
        end = _hash_range(
            fd, self.hash, self.hashed, self.limit, bytearray(min(HASH_CHUNK, max(left, 1)))
        )
        self.hashed = end
        return self.hash.hexdigest(), end
