"""The collectives of a sharded checkpoint: shared verdicts and one-tensor-at-a-time streams.

Every function and method here that communicates is a collective over the default process
group: all ranks call it, in the same order, with the same sizes. Rank :data:`WRITER` (0)
is the only one that touches the file.

Call order of a sharded load, on every rank (a save is the same with the stream reversed):

1. local work that may fail (checks, and on the writer the whole first pass over the file);
2. :func:`share_verdict` with that failure (or ``None``) and a layout fingerprint: if any
   rank failed, or the ranks' layouts differ, every rank raises the same error here;
3. a :class:`ScatterStream` (or :class:`GatherStream`) of full tensors, in an order every
   rank knows; a rank that fails midway keeps taking part, so nobody waits forever;
4. :func:`share_verdict` again; only then does any rank change live state.

Control messages are small tensors on the backend's device (CPU for gloo, the current CUDA
device for NCCL), so the same code runs on either; nothing is pickled.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import orjson
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

from ..codec import errors as checkpoint_errors
from ..codec.errors import CheckpointError, SchemaMismatchError
from .dtensors import is_dtensor, local_tensor

_T = TypeVar("_T")

__all__ = [
    "WRITER",
    "writer_runs",
    "rank",
    "world_size",
    "is_writer",
    "wire_device",
    "check_mesh",
    "share_verdict",
    "broadcast_bytes",
    "broadcast_json",
    "row_shards",
    "GatherStream",
    "ScatterStream",
]

#: The rank that reads and writes the file.
WRITER = 0


def rank() -> int:
    """This process's rank in the default process group."""
    return dist.get_rank()


def world_size() -> int:
    """The number of ranks in the default process group."""
    return dist.get_world_size()


def is_writer() -> bool:
    """Whether this rank reads and writes the file."""
    return rank() == WRITER


def wire_device() -> torch.device:
    """Where tensors that travel through the default group must be: CPU when its backend
    takes CPU tensors (gloo, mpi, or a ``cpu:gloo,cuda:nccl`` pair), else the current
    accelerator (NCCL takes CUDA tensors only)."""
    backend = str(dist.get_backend()).lower()
    if "cpu" in backend or backend in ("gloo", "mpi"):
        return torch.device("cpu")
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def check_mesh(name: str, t: torch.Tensor) -> None:
    """Refuse a DTensor whose device mesh does not span every rank of the default group,
    or whose local rows are not the ones :func:`row_shards` says (then the ranks would
    not agree on what travels).

    Raises:
        CheckpointError: naming the tensor and both sizes.
    """
    if not is_dtensor(t):
        return
    if t.device_mesh.size() != world_size():
        raise CheckpointError(
            f"tensor {name!r} is sharded over {t.device_mesh.size()} rank(s) of a"
            f" {world_size()}-rank process group; a checkpoint is saved and loaded by every"
            " rank of the default group, so each sharded tensor must span all of them",
            field=name,
            actual=t.device_mesh.size(),
            expected=world_size(),
        )
    rows = row_shards(t)
    if rows is not None:
        lo, hi = rows[rank()]
        local = tuple(local_tensor(t).shape)
        if local != (hi - lo, *t.shape[1:]):
            raise SchemaMismatchError(
                f"tensor {name!r}: this rank's shard is {local}, but rows {lo}:{hi} of"
                f" {tuple(t.shape)} under {t.placements}",
                field=name,
                actual=local,
                expected=(hi - lo, *t.shape[1:]),
            )


# ----------------------------------------------------------------------------- verdicts

_ERROR_CLASSES: dict[str, type[CheckpointError]] = {
    name: cls
    for name, cls in vars(checkpoint_errors).items()
    if isinstance(cls, type) and issubclass(cls, CheckpointError)
}


def _describe(error: BaseException) -> bytes:
    fields: dict[str, Any] = {"type": type(error).__name__}
    if isinstance(error, CheckpointError):
        fields.update(
            reason=error.reason,
            path=error.path,
            offset=error.offset,
            field=error.field,
            actual=error.actual,
            expected=error.expected,
        )
    elif isinstance(error, OSError):
        fields.update(errno=error.errno, strerror=error.strerror, filename=error.filename)
    fields["text"] = str(error)
    return orjson.dumps(fields, default=repr, option=orjson.OPT_NON_STR_KEYS)


def _rebuild(description: bytes, source: int) -> BaseException:
    """The error another rank raised, as this rank raises it: the same class and message."""
    fields = orjson.loads(description)
    name = fields["type"]
    if name in _ERROR_CLASSES:
        return _ERROR_CLASSES[name](
            fields["reason"],
            path=fields["path"],
            offset=fields["offset"],
            field=fields["field"],
            actual=fields["actual"],
            expected=fields["expected"],
        )
    cls = getattr(builtins, name, None)
    if isinstance(cls, type) and issubclass(cls, OSError) and "strerror" in fields:
        if fields["errno"] is None:
            return cls(fields["text"])
        return cls(fields["errno"], fields["strerror"], fields["filename"])
    return CheckpointError(f"rank {source} failed: {name}: {fields['text']}")


def writer_runs(stream: Any, work: Callable[[], _T]) -> _T | None:
    """Collective: rank 0 runs ``work`` (which feeds or drains ``stream``) while every other
    rank serves ``stream``; then all ranks agree — the same error is raised on every rank,
    or all go on.

    Returns:
        ``work``'s result on rank 0, ``None`` on the others.
    """
    error: BaseException | None = None
    result: _T | None = None
    if is_writer():
        try:
            result = work()
        except Exception as exc:  # reported to every rank by the verdict below
            error = exc
        stream.drain()
    else:
        stream.serve()
    share_verdict(error or stream.error)
    return result


def share_verdict(error: BaseException | None, layout: bytes = b"") -> None:
    """Collective: go on together, or raise the same error on every rank.

    Args:
        error: what this rank's local work raised, or ``None``.
        layout: this rank's layout fingerprint (:func:`~.dtensors.fingerprint`); all ranks
            must pass equal bytes (or all pass nothing).

    Raises:
        CheckpointError: on every rank, the same subclass and message: the lowest failing
            rank's own error; or, when that was something else, one that names the rank
            and the error (``raise ... from`` it on that rank); or a
            ``SchemaMismatchError`` when the ranks' layouts differ.
        OSError: on every rank (the same class, errno, message and file name), when the
            lowest failing rank failed with one: the file system's errors stay what the
            single-process functions raise.
    """
    device = wire_device()
    digest = layout.ljust(32, b"\0")[:32]
    mine = torch.tensor([error is not None, *digest], dtype=torch.uint8, device=device)
    everyone = [torch.empty_like(mine) for _ in range(world_size())]
    dist.all_gather(everyone, mine)
    rows = [bytes(t.cpu().tolist()) for t in everyone]
    failed = [r for r, row in enumerate(rows) if row[0]]
    if not failed:
        differing = [r for r, row in enumerate(rows) if row[1:] != rows[WRITER][1:]]
        if differing:
            raise SchemaMismatchError(
                f"rank(s) {differing} hold a different model, optimizer or layout than rank"
                f" {WRITER} (names, shapes, dtypes, placements, tied weights or config);"
                " every rank must pass its part of the same sharded objects",
                actual=differing,
            )
        return
    source = failed[0]
    description = broadcast_bytes(_describe(error) if rank() == source else None, source)
    rebuilt = _rebuild(description, source)
    if rank() == source:
        if type(rebuilt) is type(error):
            raise error  # type: ignore[misc]  # this rank's own error, with its traceback
        raise rebuilt from error
    if hasattr(rebuilt, "add_note"):
        rebuilt.add_note(f"(raised on rank {source}; every rank raises it)")
    raise rebuilt


def broadcast_bytes(data: bytes | None, source: int = WRITER) -> bytes:
    """Collective: ``source``'s bytes on every rank."""
    device = wire_device()
    size = torch.tensor([len(data) if rank() == source else 0], dtype=torch.int64, device=device)
    dist.broadcast(size, src=source)
    if rank() == source:
        payload = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device)
    else:
        payload = torch.empty(int(size.item()), dtype=torch.uint8, device=device)
    if payload.numel():
        dist.broadcast(payload, src=source)
    return bytes(payload.cpu().tolist()) if rank() != source else data


def broadcast_json(value: Any, source: int = WRITER) -> Any:
    """Collective: ``source``'s JSON value (ints up to 2^64 - 1, lists, strings) everywhere."""
    data = orjson.dumps(value) if rank() == source else None
    return orjson.loads(broadcast_bytes(data, source))


# ----------------------------------------------------------------------------- streams


class GatherStream:
    """Full tensors to the writer, one at a time, in an order fixed before it starts.

    Every rank makes the same stream over its own tensors (DTensors and plain ones in the
    same places). The writer pulls items (:meth:`take`) as the codec asks for them; the
    other ranks call :meth:`serve`. If the writer stops early (the file could not be
    written), :meth:`drain` takes part in the transfers that are left, so that nobody waits.

    A DTensor sharded by rows over a one-dimensional mesh (FSDP2's ``Shard(0)``) travels
    point to point: each rank sends its rows, and the writer receives them straight into
    their place in a reusable buffer (one per *lane*: item ``i`` uses lane ``i % lanes``),
    so it holds no more than ``lanes`` full tensors, and the others hold nothing extra.
    Any other DTensor is gathered with ``full_tensor()``, as bytes so that every dtype
    travels (every rank holds the full tensor for a moment). A plain tensor is the
    writer's own, with no communication. A transfer that fails (on any rank) is recorded
    in :attr:`error` and the stream goes on, so that every rank stays in step.

    Args:
        tensors: the tensors, in the order the writer will take them.
        lanes: how many taken values the writer's consumer holds at once (the codec writes
            each before asking for the next: 1; Adam's ``m`` and ``v``: 2); ``None`` gives
            every value fresh memory of its own.
    """

    def __init__(self, tensors: Sequence[torch.Tensor], lanes: int | None = 1):
        self.tensors = list(tensors)
        self.lanes = lanes
        self.position = 0
        self.error: BaseException | None = None
        self._buffers: dict[int, torch.Tensor] = {}

    def _buffer(self, lane: int, like: torch.Tensor, device: torch.device) -> torch.Tensor:
        """An uninitialised tensor shaped like ``like``, over the lane's reusable memory."""
        nbytes = like.numel() * like.element_size()
        if self.lanes is None:
            raw = torch.empty(nbytes, dtype=torch.uint8, device=device)
        else:
            raw = self._buffers.get(lane)
            if raw is None or raw.numel() < nbytes or raw.device != device:
                self._buffers.pop(lane, None)  # free the smaller one before growing
                raw = torch.empty(nbytes, dtype=torch.uint8, device=device)
                self._buffers[lane] = raw
            raw = raw[:nbytes]
        return raw.view(like.dtype).view(like.shape)

    def _next(self) -> torch.Tensor | None:
        t = self.tensors[self.position]
        lane = self.position % (self.lanes or 1)
        self.position += 1
        try:
            return self._transfer(t, lane)
        except Exception as exc:  # e.g. a dtype the backend refuses: every rank sees it
            if self.error is None:
                self.error = exc
            return None

    def _transfer(self, t: torch.Tensor, lane: int) -> torch.Tensor | None:
        if not is_dtensor(t):
            return t.detach() if is_writer() else None
        rows = row_shards(t)
        if rows is None:
            full = _full_tensor(t)
            return full if is_writer() else None
        device = wire_device()
        local = local_tensor(t)
        if not is_writer():
            if local.numel():
                dist.send(_as_bytes(local.to(device).contiguous()), dst=WRITER)
            return None
        full = self._buffer(lane, t, device)
        for source, (lo, hi) in enumerate(rows):
            if hi <= lo:
                continue
            if source == WRITER:
                full[lo:hi].copy_(local)
            else:
                dist.recv(_as_bytes(full[lo:hi]), src=source)
        return full

    def take(self, index: int) -> torch.Tensor:
        """Writer: the full value of item ``index`` (the next one), valid until the item
        ``lanes`` further on is taken."""
        if index != self.position:
            raise CheckpointError(
                f"internal error: item {index} requested, item {self.position} is next"
            )
        full = self._next()
        if full is None:
            raise self.error or CheckpointError("internal error: only the writer takes items")
        return full

    def serve(self) -> None:
        """Non-writers: take part in every transfer, in order."""
        while self.position < len(self.tensors):
            self._next()

    def drain(self) -> None:
        """Writer: take part in the transfers the codec did not ask for."""
        while self.position < len(self.tensors):
            self._next()


def _full_tensor(t: torch.Tensor) -> torch.Tensor:
    """``t.full_tensor()``, moving the bits as bytes where that is exact (no ``Partial``
    placement to reduce): backends refuse some dtypes (gloo: float8, int16).

    The bytes of each element form a new last dimension, so the placements (which never
    name it) split the bytes exactly as they split the elements.
    """
    with torch.no_grad():
        if any(p.is_partial() for p in t.placements):
            return t.full_tensor()
        local = local_tensor(t).contiguous().unsqueeze(-1).view(torch.uint8)
        shape = (*t.shape, t.element_size())
        stride = [1] * len(shape)
        for d in range(len(shape) - 2, -1, -1):
            stride[d] = stride[d + 1] * shape[d + 1]
        words = DTensor.from_local(
            local, t.device_mesh, t.placements, run_check=False, shape=shape, stride=tuple(stride)
        )
        return words.full_tensor().view(t.dtype).reshape(t.shape)


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor's memory as flat bytes (what travels: exact for every dtype)."""
    return t.reshape(-1).view(torch.uint8)


def row_shards(t: torch.Tensor) -> list[tuple[int, int]] | None:
    """Each rank's rows ``[lo, hi)`` of a DTensor sharded by rows over a one-dimensional
    mesh of all ranks in rank order (``Shard(0)``: ``torch.chunk`` rows, the last ranks
    possibly empty); ``None`` for any other layout."""
    mesh = t.device_mesh
    placements = t.placements
    if (
        mesh.ndim != 1
        or len(placements) != 1
        or type(placements[0]) is not Shard
        or placements[0].dim not in (0, -t.ndim)
        or t.ndim == 0
        or mesh.mesh.tolist() != list(range(world_size()))
    ):
        return None
    size = t.shape[0]
    chunk = -(-size // world_size()) if size else 0
    return [(min(r * chunk, size), min((r + 1) * chunk, size)) for r in range(world_size())]


class ScatterStream:
    """Full tensors from the writer to every rank, each keeping its own part, off to the side.

    ``destinations`` are the live tensors the values are for, in stream order (the same on
    every rank). For each, the writer :meth:`put` s the full value (in the destination's
    dtype and shape); the other ranks :meth:`take` it. It travels as raw bytes (exact for
    every dtype) by one broadcast; each rank then keeps a fresh copy of its part: for a
    DTensor, the shard ``distribute_tensor`` assigns it under the destination's own mesh and
    placements; for a plain tensor, the whole value on the destination's device.

    A rank whose own part fails (an unexpected shard shape, memory) records the first error
    and goes on taking part; :attr:`error` is then passed to :func:`share_verdict`.
    """

    def __init__(self, destinations: Sequence[torch.Tensor]):
        self.destinations = list(destinations)
        self.parts: list[torch.Tensor | None] = []
        self.error: BaseException | None = None

    @property
    def position(self) -> int:
        """The index of the next item."""
        return len(self.parts)

    def put(self, index: int, full: torch.Tensor | None) -> None:
        """Writer: send item ``index`` (the next one); ``None`` sends filler (draining)."""
        if index != self.position:
            raise CheckpointError(
                f"internal error: item {index} sent, item {self.position} is next"
            )
        self._exchange(full)

    def take(self) -> None:
        """Non-writers: receive the next item."""
        self._exchange(None)

    def serve(self) -> None:
        """Non-writers: receive every item."""
        while self.position < len(self.destinations):
            self.take()

    def drain(self) -> None:
        """Writer: send filler for the items not sent (the read failed midway)."""
        while self.position < len(self.destinations):
            self._exchange(None)

    def _exchange(self, full: torch.Tensor | None) -> None:
        like = self.destinations[self.position]
        device = wire_device()
        if is_writer() and full is not None:
            if full.dtype != like.dtype:
                raise CheckpointError(
                    f"internal error: a {full.dtype} value sent for a {like.dtype} tensor"
                )
            wire = full.detach().reshape(like.shape).to(device).contiguous()
        else:
            wire = torch.empty(tuple(like.shape), dtype=like.dtype, device=device)
        part = None
        try:
            if wire.numel():
                dist.broadcast(_as_bytes(wire), src=WRITER)
            if self.error is None:
                part = _part_of(wire, like)
        except Exception as exc:  # shared through the verdict, never raised alone
            if self.error is None:
                self.error = exc
        self.parts.append(part)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor | None]]:
        """``(destination, this rank's new part)`` pairs, once every item has arrived."""
        return iter(zip(self.destinations, self.parts))


def _part_of(full: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """This rank's fresh copy of its part of ``full`` for the destination ``like``."""
    if not is_dtensor(like):
        return full.to(like.device, copy=True)
    mesh = like.device_mesh
    # src_data_rank=None: every rank has the full value already; no second transfer.
    placed = distribute_tensor(full.to(mesh.device_type), mesh, like.placements, src_data_rank=None)
    part = placed.to_local()
    want = local_tensor(like)
    if part.shape != want.shape:
        raise SchemaMismatchError(
            f"this rank's shard of a {tuple(like.shape)} tensor placed {like.placements} is"
            f" {tuple(part.shape)} by DTensor's rules but {tuple(want.shape)} in the live"
            " tensor",
            actual=tuple(part.shape),
            expected=tuple(want.shape),
        )
    return part.clone(memory_format=torch.contiguous_format)  # not a view of the full value
