"""The sharded placement: DTensors across the default process group, one file.

Where every rank sees the same file system, an operation moves its payloads in parallel,
each rank its own bytes of the file (:meth:`ShardedPlacement.route`, :mod:`.positional`);
everything below describes the other path, through rank 0, which stays for ranks without a
shared file system, file objects, exact-bits JSON and placements the parallel path does not
write.

An operation over this placement is a collective: every rank of the default process group
calls it, in the same order; rank 0 alone opens the file, the one a single process holding
the full values would write, so it loads into any number of ranks, or into one process.
Verdicts are shared (:func:`~.collectives.share_verdict`, with a fingerprint of the layout
every rank must agree on); a save gathers one full tensor at a time to rank 0
(:class:`~.collectives.GatherStream`), and a load broadcasts each value from rank 0, every
rank keeping a fresh copy of its own part, off to the side
(:class:`~.collectives.ScatterStream`). Plain tensors next to DTensors (FSDP2 leaves buffers
unsharded) are rank 0's on save and broadcast to every rank on load. Loads are therefore
always staged: live state changes only in the commit, after every rank has all of its parts
and every rank is fine.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import torch

from ..binding.tensors import HostBuffer
from .collectives import (
    GatherStream,
    ScatterStream,
    broadcast_json,
    check_mesh,
    is_writer,
    share_verdict,
    writer_runs,
)
from .io_choice import choose
from .placement_protocol import Placement, Route, WhyNot
from .positional import unsupported

__all__ = ["ShardedPlacement", "ScatterReceiver"]

_T = TypeVar("_T")


class ScatterReceiver:
    """New values from rank 0's reader, through a scatter stream, each rank keeping its part.

    The reader's payloads pass through one reusable (pinned) host buffer: rank 0 holds one
    tensor's payload at a time beyond the parts it keeps.
    """

    keeps_buffers = False

    def __init__(self, destinations: list[torch.Tensor], in_order: bool):
        self.stream = ScatterStream(destinations, in_order=in_order)
        self.staging = HostBuffer(pin=any(t.device.type == "cuda" for t in destinations))

    def buffer(self, item: int, count: int, dtype: torch.dtype) -> torch.Tensor:
        return self.staging.tensor(count, dtype)

    def scratch(self, count: int, dtype: torch.dtype) -> torch.Tensor:
        return self.staging.tensor(count, dtype)

    def put(self, item: int, values: torch.Tensor) -> None:
        self.stream.put(item, values)

    def received(self) -> dict[int, torch.Tensor]:
        return self.stream.parts  # type: ignore[return-value]  # complete once agreed


class ShardedPlacement(Placement):
    """See :class:`~.placement_protocol.Placement`: every rank of the default group, rank 0 the
    file."""

    @property
    def touches_file(self) -> bool:
        return is_writer()

    def check(self, named: Iterable[tuple[str, torch.Tensor]]) -> None:
        for name, t in named:
            check_mesh(name, t)

    def route(
        self, path: Any, operation: str, tensors: list[torch.Tensor], why_not: WhyNot = None
    ) -> Route:
        reason = why_not() if why_not is not None else None
        parallel = choose(path, operation, reason or unsupported(tensors))
        return Route.PARALLEL if parallel else Route.STREAM

    def agree(self, work: Callable[[], _T], layout: Callable[[_T], bytes] | None = None) -> _T:
        result: Any = None
        error: BaseException | None = None
        digest = b""
        try:
            result = work()
            if layout is not None:
                digest = layout(result)
        except Exception as exc:  # raised on every rank by the verdict
            error = exc
        share_verdict(error, digest)
        return result

    def gather(
        self,
        tensors: list[torch.Tensor],
        lanes: int | None,
        write: Callable[[Callable[[int], torch.Tensor]], _T],
    ) -> _T | None:
        stream = GatherStream(tensors, lanes=lanes)
        return writer_runs(stream, lambda: write(stream.take))

    def receiver(
        self, destinations: list[torch.Tensor], *, in_order: bool = True, on_device: bool = False
    ) -> ScatterReceiver:
        return ScatterReceiver(destinations, in_order)  # parts are on their devices anyway

    def transfer(self, receiver: ScatterReceiver, read: Callable[[], _T]) -> _T | None:
        return writer_runs(receiver.stream, read)

    def share(self, value: Any) -> Any:
        return broadcast_json(value)
