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
import time
from collections.abc import Callable
from dataclasses import dataclass

from tlckpt.testing.processes import PeakProbe, current_rss

__all__ = ["Way", "PeakProbe", "current_rss", "drop_cache", "fsync_path", "interleave"]


@dataclass(frozen=True)
class Way:
    """One way of doing an operation: ``run`` is timed, ``prepare`` (untimed) runs first."""

    run: Callable[[], object]
    prepare: Callable[[], object] | None = None


def interleave(
    ways: dict[str, Way], reps: int, warmup: int = 1, cpu: dict[str, list[float]] | None = None
) -> dict[str, list[float]]:
    """Seconds of ``reps`` timed calls of every way, taken in turns after ``warmup``
    untimed rounds (first-call costs: lazy imports, caches). With ``cpu``, each call's CPU
    seconds (``time.process_time``: every thread of the process, user and system) are
    appended there too, by way: on a shared machine the figure least moved by other jobs."""
    times: dict[str, list[float]] = {name: [] for name in ways}
    for round_ in range(warmup + reps):
        for name, way in ways.items():
            if way.prepare is not None:
                way.prepare()
            os.sync()
            gc.collect()
            c0 = time.process_time()
            t0 = time.perf_counter()
            way.run()
            seconds = time.perf_counter() - t0
            cpu_seconds = time.process_time() - c0
            if round_ >= warmup:
                times[name].append(seconds)
                if cpu is not None:
                    cpu.setdefault(name, []).append(cpu_seconds)
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
