"""Crash safety of checkpoint sets: SIGKILL a process at random moments of set saves.

Run from the repository root::

    python -m fuzz.set_crash_kill --trials 250 --size-mb 16

Each trial forks a child that builds a model (about ``--size-mb`` MiB of float32 parameters)
with values of its own, takes an AdamW step, announces a digest of what it is about to save
(computed from its live tensors, independently of the library's writer), and saves the set
of the trial's step through a ``CheckpointManager(keep_last=3)`` — blocking on even trials,
in the background (``blocking=False``, then ``wait``) on odd ones — over the sets earlier
trials left. Every third trial instead saves new values over the newest committed set
(``overwrite=True``): killed, that step must hold the old set or the new one, never nothing.
The parent kills it with SIGKILL after a random delay drawn over the whole save
(calibrated by the first trials of each kind, which are not killed).

After every trial the parent checks:

* every committed set (a ``step-…`` folder whose manifest parses) verifies
  (``verify_checkpoint``); one that does not is *damaged*;
* ``latest()`` is the newest committed set, and restoring it into fresh objects gives exactly
  the values its child announced;
* every set committed earlier is still there, unless retention removed it (only when at
  least ``keep_last`` newer sets were committed): otherwise it was *lost*;
* what else is in the folder is a leftover of a killed save or removal (a library
  temporary folder), at most two of them, and none after a save that completed (the
  manager removes stale leftovers after each commit).

Exit status: 0 if nothing was damaged or lost, ``latest()`` always restored the right
values and leftovers stayed bounded and were cleaned; else 1.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing as mp
import os
import random
import sys
import tempfile
import time
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

from .kill_trial import Child

KEEP_LAST = 3


def _model(size_mb: float) -> Any:
    import torch

    torch.manual_seed(0)
    width = 256
    layers = max(1, int(size_mb * (1 << 20) / 4) // (width * width + width))
    return torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])


def _objects(size_mb: float) -> tuple[Any, Any]:
    import torch

    model = _model(size_mb)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return model, opt


def _digest(model: Any, opt: Any) -> str:
    h = hashlib.sha256()
    for t in model.state_dict().values():
        h.update(t.detach().numpy().tobytes())
    for p in model.parameters():
        state = opt.state.get(p, {})
        for key in ("step", "exp_avg", "exp_avg_sq"):
            if key in state:
                h.update(state[key].detach().numpy().tobytes())
    return h.hexdigest()


def _child(
    conn: Any, folder: str, size_mb: float, step: int, blocking: bool, values: int, overwrite: bool
) -> None:
    import torch

    import tlckpt

    torch.set_num_threads(1)
    model, opt = _objects(size_mb)
    model(torch.randn(2, 256)).sum().backward()
    opt.step()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(values)  # values of this trial's own
    conn.send(("ready", _digest(model, opt)))
    conn.recv()  # "go": the parent's clock for the kill delay starts now
    manager = tlckpt.CheckpointManager(folder, keep_last=KEEP_LAST)
    handle = manager.save(
        step,
        model=model,
        optimizer=opt,
        random_counter=step,
        blocking=blocking,
        overwrite=overwrite,
    )
    conn.send(("returned", time.monotonic()))
    handle.wait()
    conn.send(("done", time.monotonic()))
    conn.close()


def _restored_digest(folder: Path, step: int, size_mb: float) -> str:
    import tlckpt

    model, opt = _objects(size_mb)
    restored = tlckpt.load_checkpoint(folder / f"step-{step:020d}", model=model, optimizer=opt)
    if restored.step != step or restored.random_counter != step:
        raise ValueError(f"restored step {restored.step}, counter {restored.random_counter}")
    return _digest(model, opt)


def run(trials: int, size_mb: float, folder: Path, rng: random.Random, quiet: bool) -> dict:
    """Run the trials in ``folder``; return the figures (see the module docstring)."""
    import torch

    from tlckpt.codec.fileio.atomic import is_library_temporary
    from tlckpt.codec.sets.checkpoint_set import latest_verified, verify_checkpoint
    from tlckpt.codec.sets.set_folders import committed_steps

    torch.set_num_threads(1)  # the parent forks: no thread pool may be running
    ctx = mp.get_context("fork")
    announced: dict[int, set[str]] = {}  # what each step's set may restore to
    seen: set[int] = set()
    durations: dict[bool, list[float]] = {True: [], False: []}
    outcomes: Counter = Counter()
    problems: list[str] = []
    max_leftovers = 0
    leftovers_cleaned = 0
    killed = 0
    restores = 0
    calibration = 2  # one trial of each kind is never killed
    for trial in range(trials + calibration):
        step = trial + 1
        blocking = trial % 2 == 0
        newest = committed_steps(folder)
        overwrite = trial >= calibration and trial % 3 == 2 and bool(newest)
        if overwrite:
            step = newest[-1]  # new values over the newest set: old or new, never nothing
        # Listed before the child starts: it writes nothing until "go".
        before = {e for e in os.listdir(folder) if is_library_temporary(e)}
        child = Child(ctx, _child, (str(folder), size_mb, step, blocking, trial + 1, overwrite))
        digest = child.ready[1]
        announced[step] = announced.get(step, set()) | {digest} if overwrite else {digest}
        delay = None
        if trial >= calibration:
            estimate = sorted(durations[blocking])[len(durations[blocking]) // 2]
            delay = rng.uniform(0.0, estimate)
        go, said = child.release(delay)
        messages = [m[0] for m in said]
        done = "done" in messages
        if done:
            durations[blocking].append(time.monotonic() - go)
        elif trial < calibration:
            raise RuntimeError("a calibration trial did not finish")
        else:
            killed += 1
        kind = ("sync" if blocking else "async") + (" overwrite" if overwrite else "")
        phase = "completed" if done else ("killed after return" if messages else "killed")
        outcomes[f"{kind} {phase}"] += 1

        committed = committed_steps(folder)
        for s in committed:
            try:
                verify_checkpoint(folder / f"step-{s:020d}")
            except Exception as exc:  # recorded: any failure is a damaged set
                problems.append(f"trial {trial}: set {s} damaged: {type(exc).__name__}: {exc}")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            latest = latest_verified(folder)
        if committed and latest != committed[-1]:
            problems.append(f"trial {trial}: latest() is {latest}, newest committed {committed}")
        if latest is not None:
            try:
                got = _restored_digest(folder, latest, size_mb)
                restores += 1
                if got not in announced[latest] or (done and latest == step and got != digest):
                    problems.append(f"trial {trial}: set {latest} restores other values")
                announced[latest] = {got}
            except Exception as exc:  # recorded
                problems.append(f"trial {trial}: restoring {latest}: {type(exc).__name__}: {exc}")
        if done and step not in committed:
            problems.append(f"trial {trial}: a completed save of {step} is not committed")
        for s in sorted(seen - set(committed)):
            newer = [c for c in committed if c > s]
            if len(newer) < KEEP_LAST:
                problems.append(f"trial {trial}: set {s} lost ({len(newer)} newer sets)")
        seen.update(committed)
        entries = set(os.listdir(folder))
        leftovers = {e for e in entries if is_library_temporary(e)}
        strays = entries - leftovers - {f"step-{s:020d}" for s in committed}
        if strays:
            problems.append(f"trial {trial}: strays {sorted(strays)}")
        leftovers_cleaned += len(before - leftovers)
        max_leftovers = max(max_leftovers, len(leftovers))
        if len(leftovers) > 2:
            problems.append(f"trial {trial}: {len(leftovers)} leftovers")
        if done and leftovers:
            problems.append(f"trial {trial}: leftovers after a completed save: {leftovers}")
        if not quiet and trial % 20 == 0:
            print(f"  trial {trial}: {kind} {phase}, committed {committed}", flush=True)
    return {
        "trials_killed": killed,
        "trials": trials,
        "size_mb": size_mb,
        "save_seconds_median": {
            ("sync" if k else "async"): sorted(v)[len(v) // 2] for k, v in durations.items()
        },
        "outcomes": dict(outcomes),
        "restores_checked": restores,
        "max_leftovers": max_leftovers,
        "leftovers_cleaned": leftovers_cleaned,
        "problems": problems,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m fuzz.set_crash_kill",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--trials", type=int, default=250)
    parser.add_argument("--size-mb", type=float, default=16.0)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--dir", default=None, help="working folder (default: a temporary one)")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="tlckpt-set-crash-", dir=args.dir) as tmp:
        start = time.monotonic()
        report = run(args.trials, args.size_mb, Path(tmp), rng, args.quiet)
        report["seconds"] = round(time.monotonic() - start, 1)
    print(json.dumps(report, indent=1))
    print(
        f"SIGKILL trials: {report['trials']} ({report['trials_killed']} killed mid-save),"
        f" restores checked: {report['restores_checked']}, problems: {len(report['problems'])},"
        f" most leftovers at once: {report['max_leftovers']}, leftovers cleaned by later"
        f" saves: {report['leftovers_cleaned']}"
    )
    return 1 if report["problems"] else 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
