"""Loads racing a second process that truncates or rewrites the file in place: never a silent mix.

Run from the repository root::

    python -m fuzz.load_races --loads 1200

The models and files of :mod:`fuzz.load_interrupts` (a 48-tensor model as ``TLSF32B``,
loaded staged and with ``staged=False``; 2,000 small tensors as exact-bits JSON). The file
exists in two versions of the same size, A and B. While this process loads it again and
again (the model reset to OLD values before each load), a racer process rewrites it in place:

* ``rewrite`` — after a random pause, overwrites the whole file with the other version, in
  64 KiB ``pwrite`` calls (same size, new bytes: the case only timestamps can reveal);
* ``truncate`` — after a random pause, truncates the file to a random length, then writes
  the other version back in place;
* ``reopen`` — after a random pause (up to four times as long), opens the file for writing,
  overwrites it with the other version as ``rewrite`` does, and closes it. Between its
  bursts nobody has the file open for writing, so the default load gets a read lease
  (``codec/fileio/leases.py``) and copies in place: the racer's ``open`` then waits until
  the load ends, and the load must complete with one whole version. A load that begins during a
  burst gets no lease and stages. The loads that held a lease are counted (``leased``).

The racers ``rewrite`` and ``truncate`` hold the file open for writing throughout, so the
default load never gets a lease against them: they race the staged path.

Pauses are drawn up to twice a load's time, so loads overlap changes, and also run between
them. The racer counts the writes it has begun and ended in a shared page; the loader reads
the counts right after the load's first ``fstat`` and right before its last one. A write that
began after the first and ended before the last lies wholly inside the load's window: the
kernel stamped it there, and the load must raise. Every load must end in one of:

* an error with the model still OLD: a ``CheckpointError`` (``FileChangedError``,
  ``TruncatedError``, any rejection of a half-written file) or an ``OSError``;
* ``staged=False`` only: a ``PartialLoadError`` (the model is partially updated, and says so);
* completed, when no write lay wholly inside the window, with the model holding the file as
  it was at one moment: all of A, all of B, or — when the racer was paused (descheduled)
  half-way through a rewrite for the whole load — the half-written file at rest, which is a
  prefix of one version followed by the rest of the other (TLSF32B has no checksum: such a
  file is as valid as any other).

A load that completes although a write lay wholly inside its window is a change the file
stamps missed (seen about once in a thousand loads on this project's machine): it is counted
as ``undetected_changes`` and must then hold one whole version, A or B. Anything else is a
failure: such a load holding the file half-way through the change, a completed load holding
anything but a snapshot above (a torn read), a
changed model after a clean error, a ``PartialLoadError`` from a staged load, another
exception class. So is a configuration in which no load overlapped a change at all (the run
would then prove nothing) — after its planned loads and up to three times as many more, run
only while none has (``extra_loads`` in its figures); the number of loads with a write wholly
inside their window is reported per configuration.

Exit status: 0 if no failure, else 1.
"""

from __future__ import annotations

import argparse
import mmap
import os
import random
import struct
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .command import add_folder_options, campaign_parser, exit_with, run_in_folder
from .live_model import LOAD_MODES, LiveModel

KINDS = LOAD_MODES
RACERS = ("rewrite", "truncate", "reopen")
CHUNK = 64 * 1024
REPO = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------ racer


class Counters:
    """Two counts in a shared file: the racer's writes begun, and ended (``ended <= begun``)."""

    def __init__(self, path: Path, write: bool = False):
        self.fd = os.open(path, os.O_RDWR if write else os.O_RDONLY)
        access = mmap.ACCESS_WRITE if write else mmap.ACCESS_READ
        self.map = mmap.mmap(self.fd, 16, access=access)

    def begun(self) -> int:
        return struct.unpack_from("<q", self.map, 0)[0]

    def ended(self) -> int:
        return struct.unpack_from("<q", self.map, 8)[0]

    def counted(self, write: Callable[[], object]) -> None:
        """Run one write, counted as begun before its system call and ended after it."""
        n = self.ended()
        struct.pack_into("<qq", self.map, 0, n + 1, n)
        write()
        struct.pack_into("<qq", self.map, 0, n + 1, n + 1)


def _racer(
    mode: str, path: Path, versions: list[Path], counts: Path, pause: float, seed: int
) -> None:
    """Change ``path`` in place, forever (the parent kills this process)."""
    rng = random.Random(seed)
    images = [v.read_bytes() for v in versions]
    size = len(images[0])
    reopen = mode == "reopen"
    fd = -1 if reopen else os.open(path, os.O_RDWR)
    counters = Counters(counts, write=True)
    k = 0
    sys.stdout.write("RACING\n")
    sys.stdout.flush()
    while True:
        # Longer pauses between reopened bursts: loads begin between them too (leased).
        time.sleep(rng.uniform(0, pause * (4 if reopen else 1)))
        k = 1 - k
        if reopen:
            fd = os.open(path, os.O_RDWR)  # waits while a load holds its read lease
        if mode == "truncate":
            length = rng.randrange(size)
            counters.counted(lambda: os.ftruncate(fd, length))  # noqa: B023 - called now
            time.sleep(rng.uniform(0, pause / 4))
        for offset in range(0, size, CHUNK):
            chunk = images[k][offset : offset + CHUNK]
            counters.counted(lambda: os.pwrite(fd, chunk, offset))  # noqa: B023 - called now
        if reopen:
            os.close(fd)  # nobody has it open for writing until the next burst


# ------------------------------------------------------------------------------ loader


class _Window:
    """The racer's counts at the load's first ``fstat`` (after it) and at its last (before
    it), read by wrapping the library's :class:`~tlckpt.codec.fileio.source.Source` in this
    process."""

    def __init__(self) -> None:
        from tlckpt.codec.fileio.source import Source

        self.counters: Counters | None = None
        self.first_begun: int | None = None
        self.last_ended: int | None = None
        real_init, real_check = Source.__init__, Source.check_unchanged
        window = self

        def init(source: Any, *args: Any, **kwargs: Any) -> None:
            real_init(source, *args, **kwargs)  # its fstat is the load's first stamp
            if window.first_begun is None and window.counters is not None:
                window.first_begun = window.counters.begun()

        def check(source: Any, since: Any, when: str) -> None:
            if window.counters is not None:
                window.last_ended = window.counters.ended()
            real_check(source, since, when)  # its fstat: the last one is the load's last

        Source.__init__ = init  # type: ignore[method-assign]
        Source.check_unchanged = check  # type: ignore[method-assign]

    def reset(self) -> None:
        self.first_begun = self.last_ended = None

    def write_inside(self) -> bool:
        """Whether a write began after the first stamp and ended before the last."""
        if self.first_begun is None or self.last_ended is None:
            return False
        return self.last_ended > self.first_begun


class _LeaseCount:
    """How many loads of this process were granted a read lease (the library's
    :func:`~tlckpt.codec.fileio.leases.read_lease`, wrapped until :meth:`stop`)."""

    def __init__(self) -> None:
        from tlckpt.codec.fileio import leases

        self.count = 0
        self.module = leases
        self.real = leases.read_lease

        def counted(f: Any) -> Any:
            lease = self.real(f)
            self.count += lease is not None
            self.last = self.last or lease is not None
            return lease

        self.last = False  # whether the current load was granted one

        leases.read_lease = counted  # type: ignore[assignment]

    def stop(self) -> None:
        self.module.read_lease = self.real  # type: ignore[assignment]


def _snapshot(flat: Any, versions: dict[str, Any]) -> str | None:
    """``"A"``, ``"B"``, ``"at rest"`` (a prefix of one version, then the rest of the other,
    one element between them possibly torn: a rewrite paused mid-way), or ``None``."""
    import numpy as np

    for name in ("A", "B"):
        if np.array_equal(flat, versions[name]):
            return name
    for new, old in (("A", "B"), ("B", "A")):
        differs = np.flatnonzero(flat != versions[new])
        if np.array_equal(flat[differs[0] + 1 :], versions[old][differs[0] + 1 :]):
            return "at rest"
    return None


def _one_config(
    kind: str, racer: str, loads: int, work: Path, seed: int, window: _Window
) -> dict[str, Any]:
    import torch

    import tlckpt
    from tlckpt.codec import PartialLoadError

    path = work / f"{kind}-{racer}.ckpt"
    model = LiveModel(kind, path, {"old": 1, "A": 2, "B": 3})
    live = model.live
    flat = {
        k: torch.cat([t.double().reshape(-1) for t in v]).numpy() for k, v in model.versions.items()
    }
    images = [work / f"{kind}-{racer}.{name}" for name in ("A", "B")]
    for name, image in zip(("A", "B"), images):
        model.save(name, image)
    if images[0].stat().st_size != images[1].stat().st_size:
        raise RuntimeError("versions A and B must have the same size")
    path.write_bytes(images[0].read_bytes())
    counts = work / f"{kind}-{racer}.counts"
    counts.write_bytes(bytes(16))
    load = model.load

    def reset() -> None:
        model.set("old")

    def unchanged() -> bool:
        return model.holds() == "old"

    reset()
    start = time.perf_counter()
    load()
    pause = 2 * (time.perf_counter() - start)
    proc = subprocess.Popen(
        [sys.executable, "-m", "fuzz.load_races", "--racer", racer, str(path)]
        + [str(i) for i in images]
        + [str(counts), f"{pause:.6f}", str(seed)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    outcomes: Counter = Counter()
    failures: list[dict[str, Any]] = []
    inside = 0
    leased = _LeaseCount()
    try:
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != "RACING":
            raise RuntimeError("the racer did not start")
        window.counters = Counters(counts)
        # The planned loads, then — for a configuration none of whose loads has yet
        # overlapped a change (a busy machine can shift the racer's bursts between them) —
        # more, up to three times as many, so that the guard below judges the race, not the
        # timing.
        needs_overlap = not (racer == "reopen" and kind == "tlsf32-staged")
        n = -1
        while True:
            n += 1
            if n >= loads and (
                not needs_overlap or n >= 4 * loads or _raised(outcomes) or not loads
            ):
                break
            reset()
            window.reset()
            leased.last = False
            try:
                load()
                outcome = "completed"
            except PartialLoadError:
                outcome = "PartialLoadError"
            except (tlckpt.CheckpointError, OSError) as exc:
                outcome = type(exc).__name__
            except Exception as exc:  # counted as a failure below, never swallowed
                outcome = f"escape {type(exc).__name__}: {exc}"
            must_raise = window.write_inside()
            inside += must_raise
            if outcome == "completed":
                loaded = torch.cat([t.double().reshape(-1) for t in live]).numpy()
                snapshot = _snapshot(loaded, flat)
                outcome = f"completed {snapshot or 'torn'}"
                # A write inside the window that the stamps missed: the load must then hold
                # one whole version (A or B), never a file half-way through the change.
                ok = snapshot in ("A", "B") if must_raise else snapshot is not None
                if must_raise:
                    outcome += ", despite a write inside its window"
            elif outcome == "PartialLoadError":
                ok = kind == "tlsf32-in-place"
            else:
                ok = not outcome.startswith("escape") and unchanged()
            if leased.last:  # the file could not change: one whole version, always
                ok = ok and outcome in ("completed A", "completed B")
                outcome += " (leased)"
            outcomes[outcome] += 1
            if not ok:
                failures.append({"load": n, "outcome": outcome, "write inside": must_raise})
    finally:
        window.counters = None
        leased.stop()
        proc.kill()
        proc.wait()
    raised = _raised(outcomes)
    if racer == "reopen" and kind == "tlsf32-staged":
        # Leased loads make the racer wait: they need not overlap a change, they must exist.
        if not leased.count:
            failures.append({"no load held a lease": loads})
    elif not raised:
        failures.append({"no load overlapped a change": loads})
    return {
        "loads": loads,
        "extra_loads": n - loads,
        "pause_ms": round(pause * 1e3, 2),
        "writes_inside_a_load": inside,
        "leased": leased.count,
        "outcomes": dict(sorted(outcomes.items())),
        "failures": failures,
    }


def _raised(outcomes: Counter) -> int:
    """How many loads so far were refused (a change overlapped them)."""
    return sum(v for k, v in outcomes.items() if not k.startswith("completed"))


def run(loads: int, work: Path, seed: int, quiet: bool = False) -> dict[str, Any]:
    """``loads`` loads split over every kind and racer; the figures (see the docstring)."""
    configs = [(k, r) for k in KINDS for r in RACERS]
    report: dict[str, Any] = {"loads": 0, "configs": {}, "failures": []}
    window = _Window()
    for i, (kind, racer) in enumerate(configs):
        count = loads // len(configs) + (i < loads % len(configs))
        result = _one_config(kind, racer, count, work, seed + i, window)
        report["configs"][f"{kind} {racer}"] = result
        report["loads"] += count
        report["failures"] += [{"config": f"{kind} {racer}", **f} for f in result["failures"]]
        if not quiet:
            print(kind, racer, result["outcomes"], file=sys.stderr)
    completions = [(k, v) for c in report["configs"].values() for k, v in c["outcomes"].items()]
    report["silent_mixes"] = sum(
        v
        for k, v in completions
        if k.startswith("completed") and ("torn" in k or ("despite" in k and "at rest" in k))
    )
    report["undetected_changes"] = sum(
        v for k, v in completions if k.startswith(("completed A,", "completed B,"))
    )
    return report


def main(argv: list[str] | None = None) -> int:
    parser = campaign_parser("load_races", __doc__, seed=5)
    parser.add_argument("--loads", type=int, default=1200)
    add_folder_options(parser)
    parser.add_argument("--racer", nargs=7, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.racer:
        mode, path, a, b, counts, pause, seed = args.racer
        _racer(mode, Path(path), [Path(a), Path(b)], Path(counts), float(pause), int(seed))
        return 0
    import torch

    torch.set_num_threads(1)
    report = run_in_folder(
        "tlckpt-races-", args.dir, lambda folder: run(args.loads, folder, args.seed, args.quiet)
    )
    failures = len(report["failures"])
    print(f"loads: {report['loads']}, silent mixes: {report['silent_mixes']}, failures: {failures}")
    return 1 if report["failures"] else 0


if __name__ == "__main__":
    exit_with(main)
