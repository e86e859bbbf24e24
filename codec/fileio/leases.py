"""Read leases: a file that nobody can change while a load reads it (Linux).

A read lease (``fcntl(fd, F_SETLEASE, F_RDLCK)``) is granted only while no one has the file
open for writing (a writable shared mapping counts: it holds a writable open), and while it
is held any ``open`` for writing or truncation of the file — by any process, through any
name — waits until the lease is released. A load that holds one can validate the file and
then read its payloads straight into live tensors: the bytes it validated are the bytes it
copies, with no staging copy. Renaming another file over the path does not wait, and need
not: the open handle still reads the leased file.

The lease cannot be had (and :func:`read_lease` gives ``None``, so the caller stages) when:
the platform has no leases; another handle has the file open for writing (``EAGAIN``); the
process neither owns the file nor has ``CAP_LEASE`` (``EACCES``); the file system does not
grant them (NFS, FUSE, ...: ``EINVAL``); leases are disabled (``fs.leases-enable = 0``); or
the kernel's ``fs.lease-break-time`` is under :data:`MIN_BREAK_SECONDS` (see below).

**Signals.** When a writer asks, the kernel *breaks* the lease: it signals the holder
(``SIGIO`` by default, whose default action ends the process) and makes the writer wait for
the release — at most ``fs.lease-break-time`` seconds (45 by default), after which it
removes the lease itself and the writer proceeds. No handler is installed (Python could
install one only in the main thread): the handle's signal is set to ``SIGURG`` (default
action: ignored) *before* the lease is requested, and right after it is granted the handle's
signal owner is cleared (``F_SETOWN 0``), so that a break sends no signal at all. A break in
the instant between the two sends ``SIGURG``, which changes nothing unless the program handles
``SIGURG`` itself (then its handler runs once).

**A break during the load.** The writer still waits, so the file is unchanged as long as the
lease has not been *removed* by the kernel's timeout. :meth:`ReadLease.intact` says whether
that is certain: the lease is still unbroken, or less than ``fs.lease-break-time`` (less a
margin) has passed since it was requested — no break can have begun before that, so none
can have timed out. A load that ran longer than that while a writer waited cannot tell, and
must say so (:class:`~tlckpt.codec.errors.PartialLoadError` for a load in place).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Iterator
from typing import BinaryIO

try:  # not on Windows
    import fcntl
except ImportError:  # pragma: no cover - platform dependent
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "MIN_BREAK_SECONDS",
    "BREAK_MARGIN_SECONDS",
    "ReadLease",
    "read_lease",
    "leased",
    "lease_possible",
]

#: Leases are not taken when the kernel lets a waiting writer through sooner than this.
MIN_BREAK_SECONDS = 2.0
#: Slack between the kernel's timer (jiffies) and this process's monotonic clock.
BREAK_MARGIN_SECONDS = 1.0

_BREAK_TIME = "/proc/sys/fs/lease-break-time"
_SUPPORTED = sys.platform.startswith("linux") and hasattr(fcntl, "F_SETLEASE")
#: The signal a lease break may send in the instant before the owner is cleared.
_QUIET_SIGNAL = getattr(signal, "SIGURG", 0)


def _break_seconds() -> float | None:
    """``fs.lease-break-time``, or ``None`` when it cannot be read."""
    try:
        with open(_BREAK_TIME, "rb") as f:
            return float(f.read().strip())
    except (OSError, ValueError):
        return None


class ReadLease:
    """A read lease held on an open file (see the module docstring).

    Args:
        fd: the file descriptor holding the lease.
        requested_at: ``time.monotonic()`` just before the lease was requested.
        break_seconds: the kernel's ``fs.lease-break-time`` then.
    """

    def __init__(self, fd: int, requested_at: float, break_seconds: float):
        self.fd = fd
        self.requested_at = requested_at
        self.break_seconds = break_seconds

    def unbroken(self) -> bool:
        """Whether the lease is held and no writer has asked for it (one ``fcntl``)."""
        try:
            return fcntl.fcntl(self.fd, fcntl.F_GETLEASE) == fcntl.F_RDLCK
        except (OSError, AttributeError):
            return False

    def intact(self) -> bool:
        """Whether the file certainly has not changed since the lease was requested.

        ``True`` while the lease is unbroken, and after a break while too little time has
        passed for the kernel to have removed the lease (a waiting writer is still waiting).
        """
        if self.unbroken():
            return True
        elapsed = time.monotonic() - self.requested_at
        return elapsed < self.break_seconds - BREAK_MARGIN_SECONDS

    def release(self) -> None:
        """Give the lease back (a waiting writer proceeds); closing the file does too."""
        # Already removed by the kernel, or the file closed: nothing held.
        with contextlib.suppress(OSError, AttributeError):
            fcntl.fcntl(self.fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)


def read_lease(f: BinaryIO) -> ReadLease | None:
    """Take a read lease on ``f`` (opened read-only by the caller), or ``None`` where none
    can be had (the reasons are in the module docstring); never raises for that.

    Args:
        f: a file object with a ``fileno()``, opened for reading only.

    Returns:
        The lease, which the caller releases (:meth:`ReadLease.release` or closing ``f``),
        or ``None``.
    """
    if not _SUPPORTED or not _QUIET_SIGNAL:
        return None
    break_seconds = _break_seconds()
    if break_seconds is None or break_seconds < MIN_BREAK_SECONDS:
        return None
    try:
        fd = f.fileno()
        # Before the request: a break in the instant before the owner is cleared then sends
        # a signal whose default action is to be ignored, never SIGIO's (the process ends).
        fcntl.fcntl(fd, fcntl.F_SETSIG, _QUIET_SIGNAL)
        requested_at = time.monotonic()
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)
    except (OSError, ValueError, AttributeError):  # no lease for this file: stage instead
        return None
    lease = ReadLease(fd, requested_at, break_seconds)
    try:
        fcntl.fcntl(fd, fcntl.F_SETOWN, 0)  # no owner: a break signals no one
    except OSError:
        lease.release()
        return None
    return lease


@contextlib.contextmanager
def leased(f: BinaryIO) -> Iterator[ReadLease | None]:
    """:func:`read_lease` for the block, released when it ends (an exception included)."""
    lease = read_lease(f)
    try:
        yield lease
    finally:
        if lease is not None:
            lease.release()


def lease_possible(path: str | os.PathLike) -> bool:
    """Whether a read lease on ``path`` could be had right now (a probe for tests and the
    benchmark: opens the file, asks, releases)."""
    with open(path, "rb") as f, leased(f) as lease:
        return lease is not None
