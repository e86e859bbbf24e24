"""The background writer threads of :class:`~.checkpoint_manager.CheckpointManager`: one
non-daemon thread per background save, at a lower scheduling priority, its outcome on a
:class:`SaveHandle`; failures nobody was told of are printed at exit.

A script that ends (normally, by ``sys.exit``, an uncaught exception or Ctrl-C) with a
background save in flight waits for it: the writer is a non-daemon thread of its own, which
the interpreter joins before it exits, and nothing on its path depends on a
``concurrent.futures`` executor (those refuse work once shutdown has begun). A failure
nobody was told of by then is printed on stderr at exit, one line naming the step, the
folder and the error (:func:`_report_at_exit`).

May import: nothing of the library (threads, futures and the standard library only).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path

__all__ = ["SaveHandle", "WRITER_NICENESS", "finished", "start_writer", "after_writers_at_exit"]

#: How much the background writer thread lowers its scheduling priority (Linux ``nice``
#: steps, per thread). Measured on two busy cores (``bench/sets.py``), a training loop kept
#: 35-45% of its steps per second during background saves at equal priority, 74% and more
#: with the writer 10 steps lower.
WRITER_NICENESS = 10


def _lower_priority() -> None:
    """Make the calling (writer) thread yield the CPU to the training threads."""
    if not sys.platform.startswith("linux"):
        return  # elsewhere setpriority's "process" would be the whole process, or another
    # A scheduling hint only: a system refusing it leaves the save correct, just not nicer.
    with contextlib.suppress(OSError):
        tid = threading.get_native_id()  # on Linux, PRIO_PROCESS of a thread id is that thread
        os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + WRITER_NICENESS)


class SaveHandle:
    """The outcome of one :meth:`CheckpointManager.save`.

    Attributes:
        step: the set's step.
    """

    def __init__(self, step: int, future: Future, directory: Path | None = None):
        self.step = step
        self._future = future
        self._reported = False
        self._directory = directory
        self._pid = os.getpid()

    def wait(self) -> Path:
        """Block until the set is committed.

        Returns:
            The committed set's folder.

        Raises:
            The save's error (``OSError``, ``CheckpointError``, ...): nothing was committed.
        """
        try:
            path = self._future.result()
        except BaseException:
            self._reported = True
            _unreported.discard(self)
            raise
        _unreported.discard(self)
        return path

    def done(self) -> bool:
        """Whether the save has ended (committed or failed)."""
        return self._future.done()

    def _unreported_error(self) -> BaseException | None:
        """The save's failure if nobody has been told of it yet (waits for the end)."""
        error = self._future.exception()
        if error is None or self._reported:
            return None
        self._reported = True
        _unreported.discard(self)
        return error


_Thread = threading.Thread  # the writer's class (a test stands in one that cannot start)
_WRITER_NAME = "tlckpt-save-"  # the writer threads' names begin so (then the step)

#: Background saves of this process whose outcome nobody may have been told of yet: a save in
#: flight, or one that failed and has not raised. A handle leaves it once it committed or its
#: failure was raised. ``set.add``/``discard``/``copy`` are atomic: no lock, which a ``fork``
#: could leave held in the child.
_unreported: set[SaveHandle] = set()


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _report_at_exit() -> None:
    """Wait for this process's background saves still in flight, and print on stderr, one
    line each, a failure nobody was told of (nothing was committed for it).

    Runs from :mod:`atexit`, after the interpreter has joined the writers (non-daemon
    threads) — unless a second Ctrl-C cut that join short: then it waits here, and a further
    Ctrl-C leaves the save unfinished, which is said too. Handles inherited by a forked
    child are its parent's business and are skipped.
    """
    for handle in sorted(_unreported.copy(), key=lambda h: h.step):
        if handle._pid != os.getpid():
            continue
        where = f"step {handle.step} in {handle._directory}"
        try:
            error = handle._unreported_error()
        except KeyboardInterrupt:
            _say(
                f"tlckpt: the background save of {where} was interrupted at exit (Ctrl-C)"
                " before it finished: the set may not be committed"
            )
            continue
        if error is not None:
            _say(
                f"tlckpt: the background save of {where} failed, nothing was committed:"
                f" {_one_line(error)}"
            )
    # Every writer gone, to its last bytecode, before the interpreter finalizes: a thread
    # still ending then is stopped where it stands, and torch aborts the process (SIGABRT).
    # A further Ctrl-C here stops the waiting; the sets are settled by now.
    with contextlib.suppress(KeyboardInterrupt):
        for thread in threading.enumerate():
            if thread.name.startswith(_WRITER_NAME) and thread is not threading.current_thread():
                thread.join()
    for release in _after_writers:
        try:
            release()
        except Exception as exc:  # the process is ending: said, then the next one runs
            _say(f"tlckpt: at exit, freeing the background saves' resources: {_one_line(exc)}")


#: Run by the exit hook once every writer has ended, in the order registered.
_after_writers: list[Callable[[], None]] = []


def after_writers_at_exit(release: Callable[[], None]) -> None:
    """Have ``release()`` run at exit once every background writer has ended (while the
    interpreter is whole, before it finalizes): for what the writers used until their end,
    such as a process group of their own. Registered once per function."""
    if release not in _after_writers:
        _after_writers.append(release)


def _say(line: str) -> None:
    # stderr may be closed or broken this late; there is nowhere else to say it then.
    with contextlib.suppress(OSError, ValueError):
        print(line, file=sys.stderr, flush=True)


atexit.register(_report_at_exit)


def start_writer(work: Callable[[], Path], handle: SaveHandle) -> None:
    """Run ``work`` for ``handle`` on a writer thread of its own (lower priority), its
    outcome set on the handle's future.

    A non-daemon thread, not an executor: the interpreter joins it before exiting, and it
    takes no work from anything that shutdown closes. Where no thread can be started (in an
    ``atexit`` hook, from Python 3.12 on), the save runs here, to the end.
    """
    future = handle._future

    def run() -> None:
        # Tracked from the moment it runs: a thread that a Ctrl-C in ``start`` kept from
        # starting leaves nothing for the exit hook to wait for.
        _unreported.add(handle)
        try:
            path = work()
        except BaseException as exc:  # the save's failure: raised by the handle, or reported
            future.set_exception(exc)
        else:
            _unreported.discard(handle)
            future.set_result(path)

    def in_thread() -> None:
        _lower_priority()  # this thread's only (the inline fallback keeps the caller's)
        run()

    writer = _Thread(target=in_thread, name=f"{_WRITER_NAME}{handle.step}", daemon=False)
    try:
        writer.start()
    except RuntimeError:  # "can't create new thread at interpreter shutdown"
        run()


def finished(step: int, path: Path) -> SaveHandle:
    """The handle of a save that has committed already (a blocking one)."""
    future: Future = Future()
    future.set_result(path)
    return SaveHandle(step, future)
