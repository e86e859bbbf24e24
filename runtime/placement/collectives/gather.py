"""The gather stream: full tensors to the writer, one at a time (sharded saves)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

from ....codec.errors import CheckpointError
from ...binding.dtensors import is_dtensor, local_tensor
from .group import WRITER, as_bytes, current_group, is_writer, row_shards, wire_device
from .stream import Stream

__all__ = ["GatherStream"]


class GatherStream(Stream):
    """Full tensors to the writer, one at a time, in an order fixed before it starts.

    Every rank makes the same stream over its own tensors (DTensors and plain ones in the
    same places). The writer pulls items (:meth:`take`) as the codec asks for them; the
    other ranks take part in every transfer (:meth:`~.stream.Stream.finish`), and so does
    the writer for the items the codec did not ask for (the file could not be written).

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

    def _over(self) -> bool:
        return self.position >= len(self.tensors)

    def _step(self) -> None:
        self._next()

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
            if current_group() is not None:
                # full_tensor() runs over the mesh's groups: the trainer's, not ours.
                raise CheckpointError(
                    f"a DTensor placed {tuple(t.placements)} cannot be gathered to rank 0"
                    " off the trainer's process group (a background save): the parallel"
                    " path writes it where every rank sees the same file system; else"
                    " save with blocking=True"
                )
            full = _full_tensor(t)
            return full if is_writer() else None
        device = wire_device()
        local = local_tensor(t)
        if not is_writer():
            if local.numel():
                dist.send(
                    as_bytes(local.to(device).contiguous()), dst=WRITER, group=current_group()
                )
            return None
        full = self._buffer(lane, t, device)
        for source, (lo, hi) in enumerate(rows):
            if hi <= lo:
                continue
            if source == WRITER:
                full[lo:hi].copy_(local)
            else:
                dist.recv(as_bytes(full[lo:hi]), src=source, group=current_group())
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
        from torch.distributed.tensor import DTensor  # a DTensor: imported already

        words = DTensor.from_local(
            local, t.device_mesh, t.placements, run_check=False, shape=shape, stride=tuple(stride)
        )
        return words.full_tensor().view(t.dtype).reshape(t.shape)
