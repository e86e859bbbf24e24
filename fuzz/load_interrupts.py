"""SIGINT at random moments of model loads: the model is never left holding a mix.

Run from the repository root::

    python -m fuzz.load_interrupts --trials 600

A child process loads the same file into a model again and again; for each trial the parent
sends it one SIGINT after a random delay. Three configurations share the trials:

* ``tlsf32-staged`` — ``load_module_state`` (the default, staged) of a 48-tensor model
  (Linear and BatchNorm layers, an int64 buffer among them), about 9 MiB;
* ``tlsf32-in-place`` — the same with ``staged=False``;
* ``json`` — ``load_state_bits`` of 2,000 small tensors.

Before each trial the child resets the model to its OLD values; the file holds NEW ones.
Delays are drawn, alternately, over the whole load and over the commit alone (its window is
measured by uninterrupted calibration loads), so that many interrupts land while live tensors
are being written. After each trial the child compares every tensor bit for bit with OLD and
NEW and reports where the ``KeyboardInterrupt`` surfaced:

* ``before``: inside the load, before the commit began — the model must be OLD;
* ``during``: held back by the commit and raised when it ended — the model must be NEW;
* ``after``: after the commit (inside the call, or once it had returned) — NEW.

Any other state — a *mix* of OLD and NEW tensors, or a tensor that is neither — is a failure,
and so is a configuration in which no interrupt landed during the commit (the run would then
prove nothing about it).

Exit status: 0 if no trial left a mix or a wrong state and every configuration had
interrupts during its commit, else 1.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from .command import add_folder_options, campaign_parser, exit_with, run_in_folder
from .live_model import LOAD_MODES, LiveModel

CONFIGS = LOAD_MODES
REPO = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------ child


class _Watch:
    """Wraps the library's ``deferred_interrupts``: when the commit ran, and whether a
    ``KeyboardInterrupt`` came out of it (it was held back, then delivered)."""

    def __init__(self, real: Callable[[], Any]):
        self.real = real
        self.reset()

    def reset(self) -> None:
        self.deferred = False
        self.enter = self.exit = None

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        entered = False
        try:
            with self.real():
                entered = True
                self.enter = time.perf_counter()
                yield
                self.exit = time.perf_counter()
        except KeyboardInterrupt:
            self.deferred = entered
            raise


def _say(*words: Any) -> None:
    sys.stdout.write(" ".join(map(str, words)) + "\n")
    sys.stdout.flush()


def _config_trials(config: str, count: int, work: Path, watch: _Watch) -> None:
    """Calibrate, then run ``count`` trials of one configuration (see the module docstring)."""
    live = LiveModel(config, work / f"{config}.ckpt", {"old": 1, "new": 2})
    live.save("new")
    load = live.load

    def reset() -> None:
        live.set("old")

    def state() -> str:
        now = live.holds()
        return "other" if now == "mix" and not live.whole_tensors() else now

    spans = []
    for k in range(7):  # calibration: the commit's window within an uninterrupted load
        reset()
        watch.reset()
        start = time.perf_counter()
        load()
        end = time.perf_counter()
        if k >= 2:  # after two warm-up loads
            spans.append((end - start, watch.enter - start, watch.exit - start))
    total, enter, leave = (statistics.median(s[k] for s in spans) for k in range(3))
    _say("CAL", config, f"{total:.6f}", f"{enter:.6f}", f"{leave:.6f}")
    for _ in range(count):
        reset()
        watch.reset()
        start = time.perf_counter()
        try:
            _say("GO")
            load()
            try:
                deadline = time.monotonic() + 5.0
                while time.monotonic() < deadline:  # the signal lands here, after the load
                    pass
                where = "none"
            except KeyboardInterrupt:
                where = "after"
        except KeyboardInterrupt:
            where = "during" if watch.deferred else "inside"
        now = state()
        if where == "inside":  # before the commit, or after it but still inside the call
            where = "after" if now == "new" else "before"
        # When the commit ran in this trial (it ran to its end even when interrupted), so
        # that the parent can aim at it; -1 when it never began.
        enter = -1.0 if watch.enter is None else watch.enter - start
        leave = -1.0 if watch.exit is None else watch.exit - start
        _say("RESULT", where, now, f"{enter:.6f}", f"{leave:.6f}")


def _child(work: Path, trials: dict[str, int]) -> None:
    import torch

    from tlckpt.runtime.commit import plans

    torch.set_num_threads(1)
    watch = _Watch(plans.deferred_interrupts)
    plans.deferred_interrupts = watch  # type: ignore[assignment]
    for config, count in trials.items():
        _config_trials(config, count, work, watch)
    _say("DONE")


# ------------------------------------------------------------------------------ parent


def run(trials: int, rng: random.Random, work: Path, quiet: bool = False) -> dict:
    """Run ``trials`` interrupted loads, split over :data:`CONFIGS`; return the figures."""
    split = {c: trials // len(CONFIGS) + (i < trials % len(CONFIGS)) for i, c in enumerate(CONFIGS)}
    env = dict(os.environ, OMP_NUM_THREADS="1")
    child = subprocess.Popen(
        [sys.executable, "-m", "fuzz.load_interrupts", "--child", json.dumps(split), str(work)],
        cwd=REPO,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    report: dict[str, Any] = {"trials": 0, "configs": {}, "failures": []}
    try:
        for config in CONFIGS:
            words = child.stdout.readline().split()
            if words[:2] != ["CAL", config]:
                raise RuntimeError(f"unexpected line from the child: {words}")
            total, enter, leave = map(float, words[2:])
            windows = [(enter, leave)]  # the commit's recent windows, to aim at
            outcomes: Counter = Counter()
            for trial in range(split[config]):
                line = child.stdout.readline().split()
                if line != ["GO"]:
                    raise RuntimeError(f"unexpected line from the child: {line}")
                # Alternately anywhere in the load and inside the commit's window (its
                # median over the last trials: load times drift on a busy machine).
                if trial % 2:
                    delay = rng.uniform(0, total * 1.1)
                else:
                    recent = windows[-9:]
                    aim = statistics.median(a for a, _ in recent)
                    delay = rng.uniform(aim, statistics.median(b for _, b in recent))
                time.sleep(delay)
                child.send_signal(signal.SIGINT)
                _, where, state, began, ended = child.stdout.readline().split()
                if float(began) >= 0 and float(ended) >= 0:
                    windows.append((float(began), float(ended)))
                outcomes[where] += 1
                expected = {"before": "old", "during": "new", "after": "new"}.get(where)
                if state != expected:
                    report["failures"].append(
                        {"config": config, "trial": trial, "where": where, "state": state}
                    )
                outcomes[f"state {state}"] += 1
            report["configs"][config] = {
                "trials": split[config],
                "load_ms": round(total * 1e3, 2),
                "commit_ms": [round(enter * 1e3, 2), round(leave * 1e3, 2)],
                **dict(sorted(outcomes.items())),
            }
            report["trials"] += split[config]
            if not outcomes["during"]:
                report["failures"].append({"config": config, "no interrupt during the commit": 1})
            if not quiet:
                print(config, dict(outcomes), file=sys.stderr)
        if child.stdout.readline().strip() != "DONE":
            raise RuntimeError("the child did not finish")
    finally:
        child.kill()
        child.wait()
    report["mixes"] = sum(
        c.get("state mix", 0) + c.get("state other", 0) for c in report["configs"].values()
    )
    return report


def main(argv: list[str] | None = None) -> int:
    parser = campaign_parser("load_interrupts", __doc__, seed=11)
    parser.add_argument("--trials", type=int, default=600)
    add_folder_options(parser)
    parser.add_argument("--child", nargs=2, metavar=("SPLIT", "DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(Path(args.child[1]), json.loads(args.child[0]))
        return 0
    rng = random.Random(args.seed)
    report = run_in_folder(
        "tlckpt-sigint-", args.dir, lambda folder: run(args.trials, rng, folder, quiet=args.quiet)
    )
    failures = len(report["failures"])
    print(f"SIGINT trials: {report['trials']}, mixes: {report['mixes']}, failures: {failures}")
    return 1 if report["failures"] else 0


if __name__ == "__main__":
    exit_with(main)
