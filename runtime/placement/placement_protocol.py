"""The placement protocol: what every save and load asks of where its tensors live.

:mod:`.choice` explains the call order and picks a placement for a call; the
implementations (:mod:`.local_placement`, :mod:`.sharded_placement`) subclass
:class:`Placement` here.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from typing import Any, Protocol, TypeVar

import torch

__all__ = ["Placement", "Receiver", "Route", "Take", "WhyNot"]

_T = TypeVar("_T")

#: What a save's writer is given: the full value of item ``i``.
Take = Callable[[int], torch.Tensor]

#: Asked why this rank's file cannot take the parallel path, or ``None`` if it can.
WhyNot = Callable[[], str | None] | None


class Route(enum.Enum):
    """How a call's payloads move between the file and the tensors: decided once per call
    (:meth:`Placement.route`), and the operation dispatches on it."""

    #: One process, its own tensors: payloads moved by address (vectored reads and writes
    #: straight to and from tensor memory, or one staging buffer).
    LOCAL_BULK = "local bulk"
    #: Sharded, every rank seeing the same file system: each rank reads and writes its own
    #: bytes of the file (:mod:`.positional`).
    PARALLEL = "parallel"
    #: Sharded, through rank 0: full tensors streamed to or from it
    #: (:meth:`Placement.gather`; :meth:`Placement.receiver` and :meth:`Placement.transfer`).
    STREAM = "stream"


class Receiver(Protocol):
    """Where a load's new values land on this rank (made by :meth:`Placement.receiver`).

    Items are the load's destinations, by index. The reader asks for a buffer for each
    payload, reads the file's values into it, converts and checks them, and puts the item's
    full new value (the destination's dtype and shape).
    """

    #: Whether a buffer handed out stays untouched after its item is put (fresh memory per
    #: item), so that a tied copy can be compared with it directly.
    keeps_buffers: bool

    def buffer(self, item: int, count: int, dtype: torch.dtype) -> torch.Tensor:
        """A flat CPU tensor for the file's ``count`` values of ``item`` (contents undefined)."""
        ...

    def scratch(self, count: int, dtype: torch.dtype) -> torch.Tensor:
        """A reusable flat CPU tensor for a payload that is only checked, never kept."""
        ...

    def put(self, item: int, values: torch.Tensor) -> None:
        """The full new value of ``item``; this rank keeps its part of it."""
        ...

    def received(self) -> dict[int, torch.Tensor]:
        """Item → this rank's new part, once the transfer has ended agreed."""
        ...


class Placement(Protocol):
    """How an operation's checks, verdicts and payloads go (see :mod:`.placement` for the
    call order). An implementation subclasses it, inheriting what it does not override."""

    @property
    def touches_file(self) -> bool:
        """Whether this process reads or writes the file."""
        ...

    def check(self, named: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Refuse tensors this placement cannot move (a mesh that does not span the group)."""
        ...

    def route(
        self, path: Any, operation: str, tensors: list[torch.Tensor], why_not: WhyNot = None
    ) -> Route:
        """How this call's payloads move (asked once per call; collective where the
        placement is: :func:`~.io_choice.choose`).

        Args:
            path: the caller's path or file object.
            operation: ``"save"`` or ``"load"``.
            tensors: the operation's tensors, in file order.
            why_not: asked (where the choice is made) why this rank's file cannot take the
                parallel path (a family without a positional layout), or ``None`` if it can;
                any rank's reason sends every rank through rank 0.
        """
        ...

    def agree(self, work: Callable[[], _T], layout: Callable[[_T], bytes] | None = None) -> _T:
        """Run ``work``; go on together, or raise the same error on every rank.

        Args:
            work: the local work that may fail.
            layout: the fingerprint of what every rank must agree on, from ``work``'s
                result (computed only where ranks compare it).

        Returns:
            ``work``'s result.
        """
        ...

    def gather(
        self, tensors: list[torch.Tensor], lanes: int | None, write: Callable[[Take], _T]
    ) -> _T | None:
        """Run ``write`` where the file is written, with ``take(i)``: the full value of
        ``tensors[i]`` (perhaps the live tensor itself: read it only), in order, valid until
        ``lanes`` further items are taken (``None``: for good). Ends agreed.

        Returns:
            ``write``'s result where it ran, else ``None``.
        """
        ...

    def receiver(
        self, destinations: list[torch.Tensor], *, in_order: bool = True, on_device: bool = False
    ) -> Receiver:
        """A receiver for new values of ``destinations`` (the same list on every rank).

        Args:
            destinations: the live tensors, by item.
            in_order: whether items are put in the order of ``destinations``; else in any
                order, each at most once.
            on_device: whether each new value must end on its destination's device (else it
                may stay in host memory: the commit copies it over).
        """
        ...

    def transfer(self, receiver: Receiver, read: Callable[[], _T]) -> _T | None:
        """Run ``read`` (which feeds ``receiver``) where the file is read. Ends agreed.

        Returns:
            ``read``'s result where it ran, else ``None``.
        """
        ...

    def share(self, value: Any) -> Any:
        """The file-touching process's JSON-able ``value``, on every rank."""
        ...
