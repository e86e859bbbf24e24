"""One killed trial of a crash campaign: a child process that prepares, says it is ready,
waits for the parent's "go", then saves; the parent kills it with ``SIGKILL`` at a chosen
moment (or lets it finish) and collects what it said. Used by :mod:`fuzz.crash_kill` and
:mod:`fuzz.set_crash_kill`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from typing import Any

#: Seconds a child may take to get ready, or to end once told to go.
PATIENCE_S = 300


class Child:
    """A started child, ready: :attr:`ready` is the message it announced that with.

    Args:
        ctx: the multiprocessing context.
        target: the child's function; called with its end of the pipe, then ``args``.
        args: the rest of its arguments.

    Raises:
        RuntimeError: it did not get ready in :data:`PATIENCE_S` seconds (it is killed).
    """

    def __init__(self, ctx: Any, target: Callable[..., None], args: tuple):
        self.conn, child_conn = ctx.Pipe()
        self.proc = ctx.Process(target=target, args=(child_conn, *args))
        self.proc.start()
        child_conn.close()
        if not self.conn.poll(PATIENCE_S):
            self.proc.kill()
            raise RuntimeError("child never became ready")
        self.ready = self.conn.recv()

    def release(self, delay: float | None) -> tuple[float, list[Any]]:
        """Tell it to go; ``SIGKILL`` it ``delay`` seconds later (``None``: let it finish).

        Returns:
            When it was told to go (``time.monotonic``), and every message it sent after.
        """
        self.conn.send("go")
        go = time.monotonic()
        if delay is not None:
            time.sleep(max(0.0, go + delay - time.monotonic()))
            with contextlib.suppress(ProcessLookupError):  # it may have finished already
                os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.join(timeout=PATIENCE_S)
        messages = []
        while self.conn.poll():
            try:
                messages.append(self.conn.recv())
            except (EOFError, OSError):  # the kill cut a message short
                break
        self.conn.close()
        return go, messages
