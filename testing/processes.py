"""Processes on this machine for the distributed tests and benchmarks: a free port, the
environment of a gloo rank (as ``torchrun`` would set it), and resident-set figures.

:class:`PeakProbe` reads the peak resident set (``VmHWM``) since a reset through
``/proc/self/clear_refs``; nothing about the allocator is changed. Children started with
:func:`rank_env` run with ``MALLOC_MMAP_THRESHOLD_`` set, so that large freed buffers leave
the resident set and a peak measures what an operation really holds at once.
"""

from __future__ import annotations

import os
import resource
import socket

__all__ = ["PeakProbe", "current_rss", "free_port", "rank_env"]

_STATUS = "/proc/self/status"
_CLEAR_REFS = "/proc/self/clear_refs"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for ``MASTER_PORT``)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _loopback() -> str | None:
    names = {name for _, name in socket.if_nameindex()}
    return next((n for n in ("lo", "lo0") if n in names), None)


def rank_env(rank: int, world: int, port: int) -> dict[str, str]:
    """This process's environment for rank ``rank`` of a ``world``-rank group on this
    machine (127.0.0.1, ``port``), one thread each, over the loopback interface where there
    is one (no dependence on the host name resolving); the caller's
    ``GLOO_SOCKET_IFNAME`` stays."""
    env = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(world),
        "OMP_NUM_THREADS": "1",
        "MALLOC_MMAP_THRESHOLD_": "131072",  # freed buffers leave the resident set
    }
    loopback = _loopback()
    if loopback and "GLOO_SOCKET_IFNAME" not in env:
        env["GLOO_SOCKET_IFNAME"] = loopback
    return env


def _status_bytes(field: str) -> int | None:
    try:
        with open(_STATUS, encoding="ascii") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024  # the kernel reports kB
    except OSError:
        return None
    return None


def current_rss() -> int:
    """The process's resident set size now, in bytes (0 where it cannot be read)."""
    return _status_bytes("VmRSS") or 0


class PeakProbe:
    """Peak resident set size since the last :meth:`reset`.

    ``resettable`` says whether resets work; without them :meth:`peak` is the process's
    lifetime peak (``getrusage``), an upper bound on the peak of the operation.
    """

    def __init__(self) -> None:
        self.resettable = self.reset()

    def reset(self) -> bool:
        """Start a new measurement window; return whether the kernel accepted the reset."""
        try:
            with open(_CLEAR_REFS, "w", encoding="ascii") as f:
                f.write("5")
        except OSError:
            return False
        return _status_bytes("VmHWM") is not None

    def peak(self) -> int:
        """Peak resident set size in bytes since the last reset (or since start)."""
        if self.resettable:
            hwm = _status_bytes("VmHWM")
            if hwm is not None:
                return hwm
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kB on Linux
