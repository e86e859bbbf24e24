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

With ``--exit-background``, each trial's child is an interpreter of its own
(:class:`~fuzz.kill_trial.ScriptChild`) that starts a background save
(``blocking=False``, never waited for) and then ends, at once or after a random pause, in
one of :data:`ENDINGS`: the script's end, ``sys.exit``, an uncaught exception, an uncaught
``KeyboardInterrupt``, a SIGINT (Ctrl-C) from the parent at a random moment, ``os._exit``,
or SIGKILL at a random moment. Some trials' children run under a file size limit, so that
their save fails. Besides the checks above, every trial that the interpreter's exit ended
must leave its set committed (it verifies, and restores exactly) or one ``tlckpt:`` line on
stderr naming the step, the folder and the error — or, for a Ctrl-C that landed before
``save`` returned, the ``KeyboardInterrupt`` that ``save`` raised; never both a set and
that line; a failing save never commits, and one with nothing against it (no size limit, no
Ctrl-C) never fails. ``os._exit`` and SIGKILL can only leave the set committed whole or not
at all.

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
import resource
import signal
import sys
import tempfile
import time
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .kill_trial import Child, ScriptChild

KEEP_LAST = 3

#: The models' layer width (``Linear(WIDTH, WIDTH)`` layers); ``--exit-background`` uses
#: :data:`EXIT_WIDTH`: its 1 MiB weights are hashed on the digest thread while written.
WIDTH = 256
EXIT_WIDTH = 512


def _model(size_mb: float, width: int = WIDTH) -> Any:
    import torch

    torch.manual_seed(0)
    layers = max(1, int(size_mb * (1 << 20) / 4) // (width * width + width))
    return torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])


def _objects(size_mb: float, width: int = WIDTH) -> tuple[Any, Any]:
    import torch

    model = _model(size_mb, width)
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


def _restored_digest(folder: Path, step: int, size_mb: float, width: int) -> str:
    import tlckpt

    model, opt = _objects(size_mb, width)
    restored = tlckpt.load_checkpoint(folder / f"step-{step:020d}", model=model, optimizer=opt)
    if restored.step != step or restored.random_counter != step:
        raise ValueError(f"restored step {restored.step}, counter {restored.random_counter}")
    return _digest(model, opt)


@dataclass
class FolderCheck:
    """What one trial left in the folder (see :func:`_check_folder`)."""

    committed: list[int]
    problems: list[str] = field(default_factory=list)
    restored: bool = False  # latest() was restored and compared
    cleaned: int = 0  # leftovers of earlier trials removed by this one
    leftovers: int = 0  # leftovers in the folder now


@dataclass
class Totals:
    """What the trials' folder checks add up to (the report's last four entries)."""

    problems: list[str] = field(default_factory=list)
    restores: int = 0
    max_leftovers: int = 0
    leftovers_cleaned: int = 0

    def add(self, check: FolderCheck) -> None:
        """Count one trial's check."""
        self.problems += check.problems
        self.restores += check.restored
        self.leftovers_cleaned += check.cleaned
        self.max_leftovers = max(self.max_leftovers, check.leftovers)

    def report(self) -> dict[str, Any]:
        """The report's entries for them."""
        return {
            "restores_checked": self.restores,
            "max_leftovers": self.max_leftovers,
            "leftovers_cleaned": self.leftovers_cleaned,
            "problems": self.problems,
        }


def _check_folder(
    folder: Path,
    trial: int,
    step: int,
    announced: dict[int, set[str]],
    seen: set[int],
    before: set[str],
    size_mb: float,
    done: bool,
    width: int = WIDTH,
    digest: str | None = None,
) -> FolderCheck:
    """The checks after a trial (the module docstring's list); ``seen`` gains the committed
    steps, ``before`` is the leftovers listed before it, ``done``: its save completed (then
    the set must be committed and no leftover remain). ``announced`` holds what each step's
    set may restore to (an overwrite: the old values or the new); ``digest`` is this trial's
    own values, which a completed save must restore to."""
    from tlckpt.codec.fileio.atomic import is_library_temporary
    from tlckpt.codec.sets.checkpoint_set import latest_verified, verify_checkpoint
    from tlckpt.codec.sets.set_folders import committed_steps

    check = FolderCheck(committed_steps(folder))
    committed, problems = check.committed, check.problems
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
            got = _restored_digest(folder, latest, size_mb, width)
            check.restored = True
            fresh = done and latest == step and digest is not None
            if got not in announced[latest] or (fresh and got != digest):
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
    check.cleaned = len(before - leftovers)
    check.leftovers = len(leftovers)
    if len(leftovers) > 2:
        problems.append(f"trial {trial}: {len(leftovers)} leftovers")
    if done and leftovers:
        problems.append(f"trial {trial}: leftovers after a completed save: {leftovers}")
    return check


def run(
    trials: int, size_mb: float, folder: Path, rng: random.Random, quiet: bool, min_killed: int = 0
) -> dict:
    """Run the trials in ``folder``; return the figures (see the module docstring), going on
    (up to 3x more, ``extra_trials``) while fewer than ``min_killed`` kills landed mid-save."""
    import torch

    from tlckpt.codec.fileio.atomic import is_library_temporary
    from tlckpt.codec.sets.set_folders import committed_steps

    torch.set_num_threads(1)  # the parent forks: no thread pool may be running
    ctx = mp.get_context("fork")
    announced: dict[int, set[str]] = {}  # what each step's set may restore to
    seen: set[int] = set()
    durations: dict[bool, list[float]] = {True: [], False: []}
    outcomes: Counter = Counter()
    totals = Totals()
    killed = 0
    calibration = 2  # one trial of each kind is never killed
    trial = -1
    while (trial := trial + 1) < trials + calibration or (
        killed < min_killed and trial < calibration + 4 * trials
    ):
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

        check = _check_folder(
            folder, trial, step, announced, seen, before, size_mb, done, digest=digest
        )
        totals.add(check)
        if not quiet and trial % 20 == 0:
            print(f"  trial {trial}: {kind} {phase}, committed {check.committed}", flush=True)
    return {
        "trials_killed": killed,
        "trials": trials,
        "extra_trials": trial - trials - calibration,
        "size_mb": size_mb,
        "save_seconds_median": {
            ("sync" if k else "async"): sorted(v)[len(v) // 2] for k, v in durations.items()
        },
        "outcomes": dict(outcomes),
        **totals.report(),
    }


#: How a child of ``--exit-background`` ends after its background save.
ENDINGS = (
    "end",
    "sys.exit",
    "exception",
    "KeyboardInterrupt",
    "SIGINT",
    "os._exit",
    "SIGKILL",
)

#: Endings by the parent's signal, at a random moment.
SIGNALLED = {"SIGINT": signal.SIGINT, "SIGKILL": signal.SIGKILL}

#: Endings that skip the interpreter's exit: nothing can finish or report the save.
ABRUPT = {"os._exit", "SIGKILL"}

#: Share of the trials ending by the interpreter's exit whose child cannot write past
#: :data:`FAILING_FILE_BYTES` per file (a full disk, as far as the save can tell).
FAILING_SHARE = 0.15
FAILING_FILE_BYTES = 64 << 10


def exit_child(args: list[str]) -> None:
    """The child of an ``--exit-background`` trial (``python -m fuzz.set_crash_kill
    --exit-child JSON``): prepare, announce, wait for "go" on stdin, start the background
    save, pause, end as told."""
    import torch

    import tlckpt

    folder, size_mb, step, ending, pause, failing = json.loads(args[0])
    torch.set_num_threads(1)
    model, opt = _objects(size_mb, EXIT_WIDTH)
    model(torch.randn(2, EXIT_WIDTH)).sum().backward()
    opt.step()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(step)  # values of this trial's own
    print(json.dumps({"ready": _digest(model, opt)}), flush=True)
    sys.stdin.readline()  # "go"
    if failing:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG)
        resource.setrlimit(resource.RLIMIT_FSIZE, (FAILING_FILE_BYTES, resource.RLIM_INFINITY))
    manager = tlckpt.CheckpointManager(folder, keep_last=KEEP_LAST)
    manager.save(step, model=model, optimizer=opt, random_counter=step, blocking=False)
    print(json.dumps({"returned": time.monotonic()}), flush=True)
    time.sleep(pause)  # the training loop goes on a while
    if ending == "sys.exit":
        sys.exit(0)
    if ending == "exception":
        raise RuntimeError("the training loop failed")
    if ending == "KeyboardInterrupt":
        raise KeyboardInterrupt
    if ending == "os._exit":
        os._exit(0)
    # "end", "SIGINT", "SIGKILL": the script ends here, unless the signal came first


def _exit_outcome(
    ending: str, failing: bool, step: int, folder: Path, returned: bool, stderr: str
) -> tuple[str, str | None]:
    """The outcome of an ``--exit-background`` trial, and a problem (``None``: none)."""
    from tlckpt.codec.sets.set_folders import committed_steps

    committed = step in committed_steps(folder)
    said = [
        line
        for line in stderr.splitlines()
        if line.startswith(f"tlckpt: the background save of step {step} in {folder} ")
    ]
    if committed and said:
        return "committed and said", f"committed, yet stderr says {said}"
    if committed:
        return "committed", "a failing save committed" if failing else None
    if said:  # a save with nothing against it (no size limit, no Ctrl-C) must not fail
        unexplained = not failing and ending != "SIGINT"
        return "said on stderr", f"failed without a cause: {said}" if unexplained else None
    if ending == "SIGINT" and not returned and "KeyboardInterrupt" in stderr:
        return "Ctrl-C before save() returned", None
    if ending in ABRUPT:
        return "not committed (no exit)", None
    return "lost", f"not committed and nothing said; stderr: {stderr[-1500:]!r}"


def run_exit(trials: int, size_mb: float, folder: Path, rng: random.Random, quiet: bool) -> dict:
    """``--exit-background``: the trials in ``folder``; return the figures."""
    from tlckpt.codec.fileio.atomic import is_library_temporary

    root = str(Path(__file__).resolve().parents[1])  # ``fuzz`` is importable from here
    env = dict(os.environ, OMP_NUM_THREADS="1")
    announced: dict[int, set[str]] = {}
    seen: set[int] = set()
    durations: list[float] = []
    outcomes: Counter = Counter()
    totals = Totals()
    calibration = 1  # one trial that ends at once, never failing: how long a save takes
    for trial in range(trials + calibration):
        step = trial + 1
        ending, pause, failing, delay = "end", 0.0, False, None
        if trial >= calibration:
            estimate = sorted(durations)[len(durations) // 2]
            ending = rng.choice(ENDINGS)
            pause = 0.0 if rng.random() < 0.5 else rng.uniform(0.0, estimate)
            failing = ending not in SIGNALLED and rng.random() < FAILING_SHARE
            delay = rng.uniform(0.0, estimate) if ending in SIGNALLED else None
        before = {e for e in os.listdir(folder) if is_library_temporary(e)}
        spec = json.dumps([str(folder), size_mb, step, ending, pause, failing])
        child = ScriptChild("fuzz.set_crash_kill", ["--exit-child", spec], root, env)
        announced[step] = {child.ready["ready"]}
        go, said, stderr, status = child.release(delay, SIGNALLED.get(ending, signal.SIGKILL))
        if trial < calibration and status != 0:
            raise RuntimeError(f"the calibration trial ended {status}: {stderr[-2000:]}")
        if ending in ("end", "sys.exit") and pause == 0.0 and not failing:
            durations.append(time.monotonic() - go)  # a save and an exit: the median aims
        returned = any("returned" in m for m in said)
        outcome, problem = _exit_outcome(ending, failing, step, folder, returned, stderr)
        outcomes[f"{ending}{' failing' if failing else ''}: {outcome}"] += 1
        if problem:
            totals.problems.append(f"trial {trial} ({ending}, exit status {status}): {problem}")
        done = outcome == "committed" and ending not in ABRUPT  # retention ran to its end
        check = _check_folder(
            folder, trial, step, announced, seen, before, size_mb, done, EXIT_WIDTH
        )
        totals.add(check)
        if not quiet and trial % 20 == 0:
            print(f"  trial {trial}: {ending}: {outcome}, committed {check.committed}", flush=True)
    return {
        "mode": "exit-background",
        "trials": trials,
        "size_mb": size_mb,
        "save_and_exit_seconds_median": round(sorted(durations)[len(durations) // 2], 3),
        "outcomes": dict(sorted(outcomes.items())),
        **totals.report(),
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
    parser.add_argument("--min-killed", type=int, default=0)  # SIGKILL mode: see run()
    parser.add_argument("--exit-background", action="store_true", help="see above")
    parser.add_argument("--exit-child", metavar="JSON", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.exit_child is not None:
        exit_child([args.exit_child])
        return 0
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="tlckpt-set-crash-", dir=args.dir) as tmp:
        start = time.monotonic()
        if args.exit_background:
            report = run_exit(args.trials, args.size_mb, Path(tmp), rng, args.quiet)
        else:
            report = run(args.trials, args.size_mb, Path(tmp), rng, args.quiet, args.min_killed)
        report["seconds"] = round(time.monotonic() - start, 1)
    print(json.dumps(report, indent=1))
    if args.exit_background:
        print(
            f"exit trials: {report['trials']}, outcomes: {report['outcomes']},"
            f" restores checked: {report['restores_checked']},"
            f" problems: {len(report['problems'])}"
        )
        return 1 if report["problems"] else 0
    print(
        f"SIGKILL trials: {report['trials']} ({report['trials_killed']} killed mid-save),"
        f" restores checked: {report['restores_checked']}, problems: {len(report['problems'])},"
        f" most leftovers at once: {report['max_leftovers']}, leftovers cleaned by later"
        f" saves: {report['leftovers_cleaned']}"
    )
    return 1 if report["problems"] else 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    status = main()
    if status:  # else the script just ends: an --exit-child's "end" is a script's end
        sys.exit(status)
