"""Timing and memory probes shared by the benchmark's processes.

* :func:`interleave` times several ways of doing one thing in turns (A, B, C, A, B, C, ...),
  so that a busy machine's drift spreads over all of them, each call preceded by its
  untimed preparation, ``os.sync()`` (no dirty page, ours or another process's, is
  written back during a timing) and ``gc.collect()``.
* :func:`drop_cache` evicts a file from the page cache: ``echo 1 >
  /proc/sys/vm/drop_caches`` where permitted (the whole cache: a really cold read), else
  ``posix_fadvise(POSIX_FADV_DONTNEED)`` on the file; it says which one it used.
* :class:`PeakProbe` reads the peak resident set (``VmHWM``) since a reset through
  ``/proc/self/clear_refs``; nothing about the allocator is changed.
"""

from __future__ import annotations

import gc
import os
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Way", "PeakProbe", "current_rss", "drop_cache", "fsync_path", "interleave"]

_STATUS = "/proc/self/status"
_CLEAR_REFS = "/proc/self/clear_refs"


@dataclass(frozen=True)
class Way:
    """One way of doing an operation: ``run`` is timed, ``prepare`` (untimed) runs first."""

    run: Callable[[], object]
    prepare: Callable[[], object] | None = None


def interleave(ways: dict[str, Way], reps: int, warmup: int = 1) -> dict[str, list[float]]:
    """Seconds of ``reps`` timed calls of every way, taken in turns after ``warmup``
    untimed rounds (first-call costs: lazy imports, caches)."""
    times: dict[str, list[float]] = {name: [] for name in ways}
    for round_ in range(warmup + reps):
        for name, way in ways.items():
            if way.prepare is not None:
                way.prepare()
            os.sync()
            gc.collect()
            t0 = time.perf_counter()
            way.run()
            seconds = time.perf_counter() - t0
            if round_ >= warmup:
                times[name].append(seconds)
    return times


def fsync_path(path: str) -> None:
    """What a durable save does after writing: fsync the file, then its folder."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def drop_cache(paths: list[str]) -> str:
    """Evict ``paths`` from the page cache; returns how (``drop_caches`` or ``fadvise``)."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w", encoding="ascii") as f:
            f.write("1\n")
        return "drop_caches"
    except OSError:
        for path in paths:
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
        return "fadvise"


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
