"""Parallel sharded I/O: every rank writes and reads its own bytes of the one file.

Every byte offset of a binary checkpoint follows from its metadata
(:mod:`tlckpt.codec.spec.layout`), and a DTensor's local piece (its rows under ``Shard(0)``,
FSDP2's layout) is a known set of element ranges of the tensor's payload. So each rank
computes where its own bytes go and writes them with ``os.pwrite`` into the one file, or
reads them with ``os.preadv``: the file is the one a single process writes, at the ranks'
aggregate bandwidth, and rank 0 holds no other rank's bytes.

Which rank writes which bytes:

* a plain tensor (FSDP2 leaves buffers unsharded; every rank holds the same values): rank 0;
* a DTensor whose placements are ``Shard(d)`` and ``Replicate()`` only, over any mesh
  (FSDP2 ``Shard(0)``, ``Shard(1)``, HSDP's ``(Replicate(), Shard(0))``): the ranks whose
  coordinate on every ``Replicate`` mesh dimension is 0, each its own piece. A piece is
  written as runs of contiguous elements: one run for rows (``Shard(0)``), one run per
  leading index otherwise (``Shard(1)`` of a matrix: one per row);
* any other placement (``Partial``, strided shards): the parallel path is not taken for
  the call (:func:`unsupported`), which then streams through rank 0.

A save (:func:`save_pieces`): rank 0 creates the temporary (:func:`~tlckpt.codec.fileio.atomic.
create_temporary`: the atomic writes' naming and lock, so that a killed save's leftover is
cleaned as any other), sizes it and writes the headers; verdict; every rank opens the
temporary by name, writes its pieces and ``fsync`` s them; verdict (a failure anywhere: rank
0 removes the temporary, the previous file untouched, every rank raises the same error);
rank 0 renames it over the destination and ``fsync`` s the folder; verdict. Within
:func:`when_written` (a set's members), a verdict after the writes hands rank 0 the
temporary's path while the ranks ``fsync``: its digest is read back meanwhile.

A load (:func:`read_pieces`): every rank has validated the file itself (the headers are small
reads) and reads its own pieces into fresh memory; the file is checked not to have changed
since its validation began, on every rank; verdict. Live state changes only in the plan's
commit, as on every other path.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np
import torch

from ...codec.errors import SchemaMismatchError, TruncatedError
from ...codec.fileio.atomic import (
    Temporary,
    commit_temporary,
    create_temporary,
    discard_temporary,
    is_temporary,
)
from ...codec.fileio.source import FileStamp, open_source
from ...codec.spec.layout import FileLayout
from ..binding.dtensors import is_dtensor, local_tensor
from .collectives import broadcast_json, is_writer, share_verdict

__all__ = [
    "Piece",
    "piece_of",
    "unsupported",
    "save_pieces",
    "read_pieces",
    "when_written",
]

_written: contextvars.ContextVar[Callable[[str], None] | None] = contextvars.ContextVar(
    "tlckpt_written", default=None
)


@contextlib.contextmanager
def when_written(hook: Callable[[str], None]) -> Iterator[None]:
    """Within the block, :func:`save_pieces` calls ``hook(path)`` on rank 0 with the
    temporary's path once every rank's bytes are in it, before the ranks' ``fsync`` s (one
    verdict more): the bytes are final, and reading them back overlaps the syncs. Must be
    entered on every rank alike; ``hook`` must not raise."""
    token = _written.set(hook)
    try:
        yield
    finally:
        _written.reset(token)


@dataclass(frozen=True)
class Piece:
    """This rank's part of one tensor, as element runs of the tensor's payload.

    Attributes:
        shape: the local piece's shape (a DTensor's local shard; a plain tensor's own).
        starts: each run's first element in the full tensor (row-major), in the piece's
            own row-major order.
        run: the elements of every run.
        owner: whether this rank writes the piece on a save (replicas: the first only).
    """

    shape: tuple[int, ...]
    starts: np.ndarray
    run: int
    owner: bool


def _runs(
    shape: Sequence[int], local: Sequence[int], offset: Sequence[int]
) -> tuple[np.ndarray, int]:
    """Runs of a box ``local`` at ``offset`` in a row-major tensor of ``shape``: the start of
    each and their common length (elements)."""
    n = len(shape)
    if n == 0:
        return np.zeros(1, dtype=np.int64), 1
    if any(d == 0 for d in local):
        return np.zeros(0, dtype=np.int64), 0
    strides = [1] * n
    for d in range(n - 2, -1, -1):
        strides[d] = strides[d + 1] * shape[d + 1]
    # The last dimension the box does not span: everything after it is whole, so each run
    # covers that dimension's part times the whole trailing block.
    k = max((d for d in range(n) if local[d] != shape[d]), default=0)
    starts = np.zeros(1, dtype=np.int64)
    for d in range(k):
        index = (offset[d] + np.arange(local[d], dtype=np.int64)) * strides[d]
        starts = (starts[:, None] + index[None, :]).reshape(-1)
    return starts + offset[k] * strides[k], local[k] * strides[k]


def unsupported(tensors: Sequence[torch.Tensor]) -> str | None:
    """Why the parallel path cannot move these tensors (a placement other than ``Shard``
    and ``Replicate``), or ``None``. The same answer on every rank."""
    from torch.distributed.tensor import Replicate, Shard

    try:  # where DTensor's own rules say each rank's piece lies
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset  # noqa: F401
    except ImportError:
        return "this torch's DTensor has no compute_local_shape_and_global_offset"
    for t in tensors:
        if is_dtensor(t):
            for p in t.placements:
                if type(p) not in (Shard, Replicate):
                    return f"a {type(p).__name__} placement ({p})"
    return None


def piece_of(t: torch.Tensor) -> Piece:
    """This rank's piece of ``t`` (see :class:`Piece`); ``t`` passed :func:`unsupported`.

    Raises:
        SchemaMismatchError: the local shard is not the one DTensor's rules give this rank.
    """
    if not is_dtensor(t):
        starts, run = _runs(t.shape, t.shape, [0] * t.ndim)
        return Piece(tuple(t.shape), starts, run, is_writer())
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    mesh, placements = t.device_mesh, t.placements
    local, offset = compute_local_shape_and_global_offset(t.shape, mesh, placements)
    have = tuple(local_tensor(t).shape)
    if tuple(local) != have:
        raise SchemaMismatchError(
            f"this rank's shard of a {tuple(t.shape)} tensor placed {placements} is {have},"
            f" but {tuple(local)} by DTensor's rules",
            actual=have,
            expected=tuple(local),
        )
    coordinate = mesh.get_coordinate() or []
    owner = all(c == 0 for c, p in zip(coordinate, placements) if p.is_replicate())
    starts, run = _runs(t.shape, local, offset)
    return Piece(have, starts, run, owner)


# The steps a save takes on each rank, as functions of their own (tests make one fail).


def _create(path: Any, layout: FileLayout) -> Temporary:
    """Rank 0: the temporary at its final size, headers written."""
    temporary = create_temporary(path)
    try:
        os.ftruncate(temporary.fd, layout.size)
        for offset, data in layout.headers:
            _pwrite(temporary.fd, memoryview(data), offset)
    except BaseException as exc:
        discard_temporary(temporary, exc)
        raise
    return temporary


def _open(folder: str, name: str) -> int:
    """Another rank: the temporary rank 0 created, open for writing (never created here)."""
    return os.open(os.path.join(folder, name), os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW)


def _pwrite(fd: int, data: memoryview, offset: int) -> None:
    """All of ``data`` at ``offset`` (``pwrite`` may write less than asked)."""
    while data.nbytes:
        n = os.pwrite(fd, data, offset)
        data, offset = data[n:], offset + n


def _fsync(fd: int) -> None:
    os.fsync(fd)


def _commit(temporary: Temporary) -> None:
    """Rank 0: ``fsync``, rename over the destination, ``fsync`` the folder."""
    commit_temporary(temporary)


def _write_piece(fd: int, array: np.ndarray, piece: Piece, offset: int) -> None:
    raw = memoryview(np.ascontiguousarray(array)).cast("B")
    width = array.itemsize * piece.run
    for j, start in enumerate(piece.starts.tolist()):
        _pwrite(fd, raw[j * width : (j + 1) * width], offset + start * array.itemsize)


def save_pieces(
    path: str | os.PathLike,
    layout: FileLayout,
    tensors: Sequence[torch.Tensor],
    encode: Callable[[int, torch.Tensor], np.ndarray],
    offsets: Sequence[int] | None = None,
) -> None:
    """Collective: write the file of ``layout`` at ``path``, each rank its own pieces.

    Args:
        path: the destination (every rank's name for the same file).
        layout: the file's layout.
        tensors: the tensors whose values are the payloads (the same list on every rank).
        encode: ``encode(i, local)``: this rank's piece of tensor ``i`` (its local shard) as
            a contiguous CPU array of the file's element type, in the piece's shape.
        offsets: where each tensor's payload starts (default: ``layout.payloads[i]``'s).

    Raises:
        CheckpointError, OSError: on every rank, the lowest failing rank's error; the
            previous file at ``path`` is untouched and no temporary is left.
    """
    if offsets is None:
        offsets = [place.offset for place in layout.payloads]
    temporary: Temporary | None = None
    error: BaseException | None = None
    try:
        if is_writer():
            try:
                temporary = _create(path, layout)
            except Exception as exc:  # raised on every rank by the verdict
                error = exc
        share_verdict(error)
        name = broadcast_json(None if temporary is None else os.path.basename(temporary.path))
        error = None
        written = _written.get()
        fd: int | None = None
        try:
            folder = os.path.dirname(os.path.abspath(os.fsdecode(path)))
            fd = temporary.fd if temporary is not None else _open(folder, name)
            for i, t in enumerate(tensors):
                piece = piece_of(t)
                if piece.owner and piece.run:
                    array = encode(i, local_tensor(t))
                    _write_piece(fd, array, piece, offsets[i])
        except Exception as exc:
            error = exc
        try:
            if written is not None:  # on every rank alike (see when_written)
                share_verdict(error)  # every rank's bytes are in the file (or all raise)
                if temporary is not None:
                    written(temporary.path)
            if error is None and fd is not None and temporary is None:
                try:
                    _fsync(fd)  # rank 0's own writes are synced by the commit
                except Exception as exc:
                    error = exc
        finally:
            if fd is not None and temporary is None:
                os.close(fd)
        share_verdict(error)
        if temporary is not None:
            done, temporary = temporary, None  # the commit removes it itself if it fails
            try:
                _commit(done)
            except Exception as exc:
                error = exc
        share_verdict(error)
    except BaseException as exc:
        if temporary is not None:
            discard_temporary(temporary, exc)
        # As a single process's save says: an error of the writing (raised on any rank)
        # names the destination, not a temporary or nothing; the same on every rank.
        if isinstance(exc, OSError) and (exc.filename is None or is_temporary(exc.filename)):
            exc.filename = os.path.abspath(os.fsdecode(path))
        raise


def _preadv(fd: int, buffer: memoryview, offset: int) -> None:
    while buffer.nbytes:
        n = os.preadv(fd, [buffer], offset)
        if n == 0:
            raise TruncatedError(f"the file ends at byte {offset}, inside a payload", offset=offset)
        buffer, offset = buffer[n:], offset + n


def read_piece(fd: int, piece: Piece, offset: int, dtype: np.dtype) -> np.ndarray:
    """This rank's piece of a payload at ``offset``, in fresh memory of the piece's shape."""
    array = np.empty(piece.shape, dtype=dtype)
    raw = memoryview(array).cast("B") if array.size else memoryview(b"")
    width = dtype.itemsize * piece.run
    for j, start in enumerate(piece.starts.tolist()):
        _preadv(fd, raw[j * width : (j + 1) * width], offset + start * dtype.itemsize)
    return array


def read_pieces(
    file: BinaryIO,
    stamp: FileStamp,
    offsets: Sequence[int],
    tensors: Sequence[torch.Tensor],
    dtype: np.dtype,
    keep: Callable[[int, np.ndarray], None],
) -> None:
    """Read this rank's piece of every payload of a validated file into fresh memory.

    Args:
        file: the open file every rank validated (its own handle).
        stamp: the file's stamp from before its validation: the file must still match it
            before the first and after the last read.
        offsets: each tensor's payload offset.
        tensors: the destinations in file order.
        dtype: the payloads' element type.
        keep: ``keep(i, piece)``: checks and keeps tensor ``i``'s piece (may raise).

    Raises:
        FileChangedError, TruncatedError, OSError: raised here, on this rank only (the
            caller shares the verdict).
    """
    with open_source(file, since=stamp):
        fd = file.fileno()
        for i, t in enumerate(tensors):
            keep(i, read_piece(fd, piece_of(t), offsets[i], dtype))
