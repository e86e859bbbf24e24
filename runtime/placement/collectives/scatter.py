"""The scatter stream: full tensors from the writer, each rank keeping its part (sharded loads)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

from ....codec.errors import CheckpointError, SchemaMismatchError
from ...binding.dtensors import is_dtensor, local_tensor
from .group import WRITER, as_bytes, current_group, is_writer, wire_device
from .stream import Stream

__all__ = ["ScatterStream"]

#: The announcement that ends a stream whose items come in the file's order (``in_order=False``).
_END = -1


class ScatterStream(Stream):
    """Full tensors from the writer to every rank, each keeping its own part, off to the side.

    ``destinations`` are the live tensors the values are for (the same list on every rank).
    For each item, the writer :meth:`put` s the full value (in the destination's dtype and
    shape); the other ranks take part (:meth:`~.stream.Stream.finish`). It travels as raw
    bytes (exact for every dtype) by one broadcast; each rank then keeps a fresh copy of its
    part: for a DTensor, the shard ``distribute_tensor`` assigns it under the destination's
    own mesh and placements; for a plain tensor, the whole value on the destination's device.

    Items go either in the order of ``destinations`` (``in_order=True``: every rank knows
    what comes next), or in whatever order the file holds them (``in_order=False``): the
    writer then announces each item's index before its value, and the end of the stream
    when its work is over; each item is sent at most once.

    A rank whose own part fails (an unexpected shard shape, memory) records the first error
    and goes on taking part; :attr:`error` is then passed to the verdict.
    """

    def __init__(self, destinations: Sequence[torch.Tensor], *, in_order: bool = True):
        self.destinations = list(destinations)
        self.in_order = in_order
        #: This rank's new part of each item received so far (``None`` where it failed).
        self.parts: dict[int, torch.Tensor | None] = {}
        self.error: BaseException | None = None
        self._ended = False

    @property
    def position(self) -> int:
        """How many items have travelled (in order: the index of the next one)."""
        return len(self.parts)

    def _over(self) -> bool:
        if self.in_order:
            return self.position >= len(self.destinations)
        return self._ended

    def _step(self) -> None:
        """Take part in the next transfer with nothing to send: receive it, or (the
        writer, draining) send filler or the end of the stream."""
        if self.in_order:
            self._exchange(self.position, None)
            return
        index = self._announce(_END if is_writer() else None)
        if index == _END:
            self._ended = True
        else:
            self._exchange(index, None)

    def put(self, index: int, full: torch.Tensor) -> None:
        """Writer: send item ``index``: in order, the next one; else any not sent yet."""
        if self.in_order:
            if index != self.position:
                raise CheckpointError(
                    f"internal error: item {index} sent, item {self.position} is next"
                )
        else:
            if index in self.parts or not 0 <= index < len(self.destinations):
                raise CheckpointError(f"internal error: item {index} cannot be sent now")
            if self._announce(index) != index:
                raise self.error or CheckpointError("internal error: announcement lost")
        self._exchange(index, full)

    def _announce(self, index: int | None) -> int:
        """The writer's ``index``, on every rank (a broadcast of one integer)."""
        word = torch.tensor([0 if index is None else index], dtype=torch.int64)
        word = word.to(wire_device())
        try:
            dist.broadcast(word, src=WRITER, group=current_group())
        except Exception as exc:  # no rank can know what follows: the stream ends here
            if self.error is None:
                self.error = exc
            self._ended = True
            return _END
        return int(word.item())

    def _exchange(self, index: int, full: torch.Tensor | None) -> None:
        like = self.destinations[index]
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
                dist.broadcast(as_bytes(wire), src=WRITER, group=current_group())
            if self.error is None:
                part = _part_of(wire, like)
        except Exception as exc:  # shared through the verdict, never raised alone
            if self.error is None:
                self.error = exc
        self.parts[index] = part


def _part_of(full: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """This rank's fresh copy of its part of ``full`` for the destination ``like``."""
    if not is_dtensor(like):
        return full.to(like.device, copy=True)
    from torch.distributed.tensor import distribute_tensor  # a DTensor: imported already

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
