"""The local placement: the tensors are this process's own, and so is the file.

Verdicts are trivial (an error is raised where it happens), a save hands the codec the live
tensors themselves, and a load reads each payload into fresh memory that becomes the new
value (or, ``on_device``, into one reusable pinned buffer and on to the device). This is the
single place where a local load's payload memory is chosen.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import torch

from ..binding.tensors import HostBuffer
from .placement_protocol import Placement, Route, WhyNot

__all__ = ["LocalPlacement", "LocalReceiver", "LOCAL"]

_T = TypeVar("_T")


class LocalReceiver:
    """New values of local destinations, in memory of their own.

    A payload is read into a fresh CPU tensor, which is (a view of) the new value; with
    ``on_device``, a destination on an accelerator gets its payload through one reusable
    (pinned) host buffer and a synchronous copy to its device instead.
    """

    def __init__(self, destinations: list[torch.Tensor], on_device: bool):
        self.destinations = destinations
        self.on_device = on_device
        self.keeps_buffers = not on_device
        self.staging = HostBuffer(pin=on_device and any(t.is_cuda for t in destinations))
        self.parts: dict[int, torch.Tensor] = {}
        self._staged: int | None = None  # the item whose payload is in the staging buffer

    def buffer(self, item: int, count: int, dtype: torch.dtype) -> torch.Tensor:
        if self.on_device and self.destinations[item].device.type != "cpu":
            self._staged = item
            return self.staging.tensor(count, dtype)
        return torch.empty(count, dtype=dtype)

    def scratch(self, count: int, dtype: torch.dtype) -> torch.Tensor:
        return self.staging.tensor(count, dtype)

    def put(self, item: int, values: torch.Tensor) -> None:
        if item == self._staged:
            self._staged = None
            values = values.to(self.destinations[item].device, copy=True)  # frees the buffer
        self.parts[item] = values

    def received(self) -> dict[int, torch.Tensor]:
        return self.parts


class LocalPlacement(Placement):
    """See :class:`~.placement_protocol.Placement`: one process, no communication (never
    a :attr:`~.placement_protocol.Route.PARALLEL` route)."""

    touches_file = True

    def route(
        self, path: Any, operation: str, tensors: list[torch.Tensor], why_not: WhyNot = None
    ) -> Route:
        """Always :attr:`~.placement_protocol.Route.LOCAL_BULK`: the tensors are this
        process's own."""
        return Route.LOCAL_BULK

    def check(self, named: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Nothing to refuse: any local tensor can be moved."""

    def agree(self, work: Callable[[], _T], layout: Callable[[_T], bytes] | None = None) -> _T:
        return work()

    def gather(
        self,
        tensors: list[torch.Tensor],
        lanes: int | None,
        write: Callable[[Callable[[int], torch.Tensor]], _T],
    ) -> _T:
        return write(tensors.__getitem__)  # the live tensors themselves, read only

    def receiver(
        self, destinations: list[torch.Tensor], *, in_order: bool = True, on_device: bool = False
    ) -> LocalReceiver:
        return LocalReceiver(destinations, on_device)

    def transfer(self, receiver: LocalReceiver, read: Callable[[], _T]) -> _T:
        return read()

    def share(self, value: Any) -> Any:
        return value


#: The one local placement (it holds no state).
LOCAL = LocalPlacement()
