"""One killed trial of a crash campaign: a child process that prepares, says it is ready,
waits for the parent's "go", then saves; the parent kills it with ``SIGKILL`` at a chosen
moment (or lets it finish) and collects what it said. Used by :mod:`fuzz.crash_kill` and
:mod:`fuzz.set_crash_kill` (:class:`Child`, forked); :class:`ScriptChild` is a child
interpreter of its own, for trials that end by the interpreter's exit.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
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


class ScriptChild:
    """A started child interpreter, ready: ``python -m module *args`` from ``cwd``.

    Unlike :class:`Child` (a forked process, which ends by ``os._exit``), the child runs to a
    real interpreter exit — its threads joined, its ``atexit`` hooks run — which is what a
    script's end does to a save still in flight. It speaks in JSON lines on stdout (the first
    one says it is ready, :attr:`ready`), waits for a line on stdin to go, and its stderr is
    kept in a file.

    Raises:
        RuntimeError: it did not get ready in :data:`PATIENCE_S` seconds (it is killed).
    """

    def __init__(self, module: str, args: list[str], cwd: str, env: dict[str, str]):
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - closed by release()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module, *args],
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
        )
        self._in: Any = self.proc.stdin  # both pipes: never None
        self._out: Any = self.proc.stdout
        ready, _, _ = select.select([self._out], [], [], PATIENCE_S)
        line = self._out.readline() if ready else b""
        if not line:
            self.proc.kill()
            self.proc.wait()
            raise RuntimeError(f"child never became ready: {self._read_stderr()[-2000:]}")
        self.ready = json.loads(line)

    def _read_stderr(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read().decode(errors="replace")

    def release(
        self, delay: float | None, sig: int = signal.SIGKILL
    ) -> tuple[float, list[Any], str, int]:
        """Tell it to go; send it ``sig`` ``delay`` seconds later (``None``: let it end).

        Returns:
            When it was told to go (``time.monotonic``), every message it sent after, its
            stderr and its exit status (``-signal`` when a signal ended it).

        Raises:
            RuntimeError: it did not end in :data:`PATIENCE_S` seconds (it is killed).
        """
        self._in.write(b"go\n")
        self._in.flush()
        go = time.monotonic()
        if delay is not None:
            time.sleep(max(0.0, go + delay - time.monotonic()))
            with contextlib.suppress(ProcessLookupError):  # it may have ended already
                self.proc.send_signal(sig)
        try:
            status = self.proc.wait(timeout=PATIENCE_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise RuntimeError("child did not end") from None
        messages = []
        for line in self._out.read().splitlines():
            with contextlib.suppress(ValueError):  # a kill may cut a line short
                messages.append(json.loads(line))
        self._in.close()
        self._out.close()
        stderr = self._read_stderr()
        self._stderr.close()
        return go, messages, stderr, status
