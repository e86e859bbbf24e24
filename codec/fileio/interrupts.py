"""Holding back Ctrl-C while live state is being overwritten.

A load's commit — copying checked values into live tensors, swapping an optimizer's state —
must run to its end once begun: a ``KeyboardInterrupt`` raised between two tensor copies
would leave a model holding parts of two states. :func:`deferred_interrupts` makes SIGINT
(and SIGTERM, where a Python handler turns it into an exception) only *recorded* during the
block; when the block ends, the previous handlers are put back and each recorded signal is
delivered to its handler then, so the ``KeyboardInterrupt`` arrives right after the commit.

Python runs signal handlers in the main thread only, between bytecodes. So the block needs
no guard outside the main thread (an interrupt cannot be raised there), and a signal that
arrives before the recording handler is installed is raised before the block's first
statement: before anything live was touched.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

__all__ = ["deferred_interrupts"]

_Handler = Callable[[int, FrameType | None], Any] | int | None


def _deferrable(signum: int, handler: _Handler) -> bool:
    """Whether ``signum``'s current handler is one to hold back.

    SIGINT always is, except when it is ignored or has a handler installed outside Python
    (``getsignal`` gives ``None``: it could not be put back). Another signal is held back
    only when a Python function handles it: with the default action the process ends, and
    with that its live state, so there is nothing half-done to protect.
    """
    if handler is None or handler == signal.SIG_IGN:
        return False
    if signum == signal.SIGINT:
        return True
    return callable(handler)


def _deliver(signum: int, handler: _Handler, frame: FrameType | None) -> None:
    """Hand a recorded signal to the handler that was in place before the block."""
    if callable(handler):
        handler(signum, frame)  # default_int_handler raises KeyboardInterrupt here
    elif handler == signal.SIG_DFL:
        signal.raise_signal(signum)  # the default action, as if it had arrived now


@contextlib.contextmanager
def deferred_interrupts() -> Iterator[None]:
    """Run the block with SIGINT (and Python-handled SIGTERM) recorded, not acted on.

    On the way out — an exception included — the previous handlers are restored first,
    then each recorded signal is delivered once to its previous handler; with Python's
    default SIGINT handler that raises ``KeyboardInterrupt`` (chained to an exception that
    was already propagating, if any). Outside the main thread the block runs unguarded:
    signals are only ever handled in the main thread. Blocks nest: an inner block hands
    what it recorded to the outer one's recorder.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    candidates = [signal.SIGINT]
    if hasattr(signal, "SIGTERM"):
        candidates.append(signal.SIGTERM)
    previous: dict[int, _Handler] = {}
    pending: dict[int, FrameType | None] = {}

    def record(signum: int, frame: FrameType | None) -> None:
        pending.setdefault(signum, frame)

    try:
        for signum in candidates:
            handler = signal.getsignal(signum)
            if _deferrable(signum, handler):
                # Stored before the swap: a signal landing right after it is recorded and
                # the finally below can always put this handler back.
                previous[signum] = handler
                signal.signal(signum, record)
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)  # type: ignore[arg-type]
        for signum, frame in pending.items():
            _deliver(signum, previous[signum], frame)
