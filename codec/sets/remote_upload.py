"""Uploading one object as its bytes stream: S3 multipart uploads with a part size planned
here, and a plain write elsewhere.

The part plan (:func:`part_size`): S3 takes at most 10,000 parts of 5 MiB to 5 GiB each
(the last may be smaller), and a member's size is not known while it streams. Parts start
at :data:`FIRST_PART` (32 MiB: large enough that a 70B model's upload does not run out of
parts, as 8 MiB parts did) and double every :data:`PARTS_PER_SIZE` parts up to
:data:`LARGEST_PART` (4 GiB). So a 10 GB member is 299 parts of 32 MiB; a 1 TB member is
1000 parts each of 32, 64, 128 and 256 MiB then 926 of 512 MiB (4,926 parts); S3's largest
object (5 TiB) takes 7,288 parts, the last ones of 4 GiB. An object
smaller than the first part is one ``PUT``.

Parts are uploaded while the next ones fill, on s3fs's event loop: as many at a time as fit
in :data:`BYTES_IN_FLIGHT` (256 MiB: eight 32 MiB parts), at least two, so that at most
256 MiB plus two parts are held (1 GiB with 512 MiB parts, 12 GiB with the 4 GiB parts of
an object past 3.9 TiB). A failure aborts
the multipart upload before it is raised; a killed process leaves it incomplete, and the
next save's cleaner (:mod:`.remote_set_writer`) aborts it by its key and lease.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

from .remote_store import Store, client_errors

__all__ = [
    "MIN_PART",
    "FIRST_PART",
    "LARGEST_PART",
    "MAX_PARTS",
    "PARTS_PER_SIZE",
    "PARTS_IN_FLIGHT",
    "BYTES_IN_FLIGHT",
    "part_size",
    "part_plan",
    "S3Upload",
    "upload",
]

#: S3's smallest part (all but the last).
MIN_PART = 5 << 20
#: The first parts' size.
FIRST_PART = 32 << 20
#: The part size's ceiling (S3 allows 5 GiB).
LARGEST_PART = 4 << 30
#: S3's most parts of one upload.
MAX_PARTS = 10_000
#: Parts of one size before the size doubles.
PARTS_PER_SIZE = 1000
#: Parts uploading at once while the writer fills the next: as many as fit in
#: :data:`BYTES_IN_FLIGHT`, at least 2 and at most this.
PARTS_IN_FLIGHT = 8
#: Bytes of parts uploading at once (beyond the one filling).
BYTES_IN_FLIGHT = 256 << 20


def part_size(index: int, first: int = FIRST_PART) -> int:
    """The size of part ``index`` (0-based) of a streamed upload (see the module docstring).

    Raises:
        ValueError: ``index`` is past S3's 10,000 parts, or ``first`` below 5 MiB.
    """
    if not 0 <= index < MAX_PARTS:
        raise ValueError(f"S3 uploads have at most {MAX_PARTS} parts (part {index + 1} asked)")
    if first < MIN_PART:
        raise ValueError(f"parts are at least {MIN_PART} bytes, not {first}")
    return min(first << (index // PARTS_PER_SIZE), LARGEST_PART)


def part_plan(size: int, first: int = FIRST_PART) -> list[tuple[int, int]]:
    """How an object of ``size`` bytes is cut: ``(count, part size)`` runs, in order (the last
    part may be shorter than its run's size).

    Raises:
        ValueError: ``size`` does not fit in 10,000 parts.
    """
    runs: list[tuple[int, int]] = []
    index, left = 0, size
    while left > 0:
        part = part_size(index, first)
        left -= part
        if runs and runs[-1][1] == part:
            runs[-1] = (runs[-1][0] + 1, part)
        else:
            runs.append((1, part))
        index += 1
    return runs


class S3Upload:
    """A binary sink writing one S3 object: one ``PUT`` if it ends below the first part,
    else a multipart upload (see the module docstring). Call :meth:`finish` on success and
    :meth:`abort` on failure (:func:`upload` does).
    """

    def __init__(self, store: Store, key: str, first: int | None = None):
        self.store = store
        self.bucket, _, self.name = store.path(key).partition("/")
        self.first = FIRST_PART if first is None else first
        self.buffer = bytearray()
        self.index = 0  # parts handed over so far
        self.upload_id: str | None = None
        self.inflight: list[tuple[int, Future]] = []
        self.parts: list[dict[str, Any]] = []

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        taken = 0
        while taken < view.nbytes:
            room = part_size(self.index, self.first) - len(self.buffer)
            chunk = view[taken : taken + room]
            self.buffer += chunk
            taken += chunk.nbytes
            if len(self.buffer) == part_size(self.index, self.first):
                self._send_part()
        return view.nbytes

    def writable(self) -> bool:
        return True

    def flush(self) -> None:
        """Nothing to do: parts go when full, the rest at :meth:`finish`."""

    def _call(self, method: str, **kwargs: Any) -> Any:
        return self.store.fs.call_s3(method, Bucket=self.bucket, Key=self.name, **kwargs)

    def _send_part(self) -> None:
        if self.upload_id is None:
            self.upload_id = self._call("create_multipart_upload")["UploadId"]
        size = part_size(self.index, self.first)
        while len(self.inflight) >= max(2, min(PARTS_IN_FLIGHT, BYTES_IN_FLIGHT // size)):
            self._settle_oldest()
        body, self.buffer = bytes(self.buffer), bytearray()
        self.index += 1
        fs = self.store.fs
        coro = fs._call_s3(
            "upload_part",
            Bucket=self.bucket,
            Key=self.name,
            UploadId=self.upload_id,
            PartNumber=self.index,
            Body=body,
        )
        self.inflight.append((self.index, asyncio.run_coroutine_threadsafe(coro, fs.loop)))

    def _settle_oldest(self) -> None:
        number, future = self.inflight.pop(0)
        # Each request is bounded (timeouts, attempts): the future ends.
        out = future.result()
        self.parts.append({"PartNumber": number, "ETag": out["ETag"]})

    def finish(self) -> None:
        """Send what is left and complete the object."""
        if self.upload_id is None:
            self._call("put_object", Body=bytes(self.buffer))
            return
        if self.buffer:
            self._send_part()
        while self.inflight:
            self._settle_oldest()
        self._call(
            "complete_multipart_upload",
            UploadId=self.upload_id,
            MultipartUpload={"Parts": self.parts},
        )
        self.upload_id = None

    def abort(self) -> None:
        """Abort the multipart upload, if one was begun (after its parts in flight end)."""
        for _, future in self.inflight:
            with contextlib.suppress(BaseException):  # its error is not the one to raise
                future.result()
        self.inflight.clear()
        if self.upload_id is not None:
            upload_id, self.upload_id = self.upload_id, None
            self._call("abort_multipart_upload", UploadId=upload_id)


class _PlainUpload:
    """A sink over ``fs.open(path, "wb")`` (stores without multipart of their own here)."""

    def __init__(self, store: Store, key: str):
        self.store = store
        self.key = key
        self.file = store.fs.open(store.path(key), "wb")

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self.file.write(view)
        return view.nbytes

    def writable(self) -> bool:
        return True

    def flush(self) -> None:
        """Nothing to do: the bytes go at :meth:`finish`."""

    def finish(self) -> None:
        self.file.close()

    def abort(self) -> None:
        discard = getattr(self.file, "discard", None)
        # Files that commit as they are written refuse to discard (local ones): the object
        # is removed below instead.
        with contextlib.suppress(Exception):
            if callable(discard):
                discard()
        self.file.close()
        self.store.delete([self.key])


@contextlib.contextmanager
def upload(store: Store, key: str) -> Iterator[Any]:
    """A sink for the object ``key``: complete on clean exit; on an error, the upload is
    aborted (or the partial object removed) and the error raised.

    Raises:
        OSError: from the store.
    """
    with client_errors(f"uploading {store.url_of(key)}"):
        sink: Any = S3Upload(store, key) if store.is_s3 else _PlainUpload(store, key)
    try:
        with client_errors(f"uploading {store.url_of(key)}"):
            yield sink
            sink.finish()
    except BaseException:
        # Housekeeping: the error that ended the upload is the one to raise; an upload that
        # cannot be aborted now is aborted by the next save's cleaner.
        with contextlib.suppress(Exception):
            sink.abort()
        raise
