"""What the gather and scatter streams share: the loop that keeps every rank in step.

A stream moves one item at a time between the writer and every rank. The writer drives it
from its work (the codec asking for the next tensor, or handing over the next payload);
every other rank only takes part, transfer after transfer, until the stream is over. If the
writer's work stops early (the file could not be written or read), the writer takes part in
the transfers that are left in the same way, so that nobody waits forever.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from .group import is_writer
from .verdicts import share_verdict

__all__ = ["Stream", "writer_runs"]

_T = TypeVar("_T")


class Stream:
    """Base of :class:`~.gather.GatherStream` and :class:`~.scatter.ScatterStream`.

    Subclasses say when the stream is over (:meth:`_over`) and how this rank takes part in
    the next transfer with nothing of its own to give (:meth:`_step`). A transfer that fails
    on this rank is recorded in :attr:`error` (the first one) and the stream goes on.
    """

    error: BaseException | None = None

    def _over(self) -> bool:
        raise NotImplementedError

    def _step(self) -> None:
        raise NotImplementedError

    def finish(self) -> None:
        """Take part in every transfer that is left: a rank serving the writer, or the
        writer once its work has ended (early, when it failed)."""
        while not self._over():
            self._step()


def writer_runs(stream: Stream, work: Callable[[], _T]) -> _T | None:
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
    stream.finish()
    share_verdict(error or stream.error)
    return result
