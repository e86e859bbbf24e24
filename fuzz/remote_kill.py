"""Crash safety of checkpoint sets on S3: SIGKILL a saving process at random moments.

Run from the repository root::

    python -m fuzz.remote_kill --trials 24 --size-mb 24

A moto S3 server runs on 127.0.0.1 (this process's threads). Each trial starts a child
interpreter that builds a model of about ``--size-mb`` MiB of float32 parameters with values
of its own, takes an AdamW step, announces a digest of its live tensors (computed here,
independently of the library's writer), and saves the set of the trial's step through a
``CheckpointManager(keep_last=3)`` to ``s3://…`` — members in 5 MiB multipart parts, so that
kills land between parts, inside parts, between members, around the manifest. The first
trial is not killed: it measures a save; every later one is killed with SIGKILL after a
delay drawn uniformly over that time (from the moment the child says it starts saving).

After every trial the parent checks:

* every set ``steps()`` lists (a prefix with a manifest) verifies (``verify_checkpoint``):
  no set without its manifest is listed, none is damaged;
* ``latest()`` is the newest listed set, and restoring it gives exactly the values its
  child announced; every set committed earlier is still listed unless retention removed it;
* after the lease of the killed save has run out, the next successful save (the parent's
  own) leaves no incomplete multipart upload and no object that is not a committed set's
  member or manifest.

Exit status: 0 if every check held in every trial; else 1 (each failure printed).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
import warnings
from typing import Any

LEASE_SECONDS = 2.0
_PART = 5 << 20
_SMALL_MB = 0.01


def _model(size_mb: float, seed: int) -> tuple[Any, Any]:
    import torch

    width = 1024
    rows = max(1, int(size_mb * (1 << 20) / 4 / width))
    torch.manual_seed(seed)
    model = torch.nn.Linear(width, rows)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, width)).sum().backward()
    opt.step()
    return model, opt


def _digest(model: Any, opt: Any) -> str:
    h = hashlib.sha256()
    for t in model.state_dict().values():
        h.update(t.detach().contiguous().numpy().tobytes())
    for state in opt.state.values():
        for name in sorted(state):
            h.update(state[name].detach().reshape(-1).numpy().tobytes())
    return h.hexdigest()


def _manager(url: str, options: dict[str, Any]) -> Any:
    from tlckpt import CheckpointManager

    return CheckpointManager(url, keep_last=3, storage_options=options, lease_seconds=LEASE_SECONDS)


def child(args: argparse.Namespace) -> None:
    """The saving process: announce the values, save, say done."""
    from tlckpt.codec.sets import remote_upload

    remote_upload.FIRST_PART = _PART
    options = json.loads(args.options)
    model, opt = _model(args.size_mb, args.step)
    manager = _manager(args.url, options)
    print(json.dumps({"digest": _digest(model, opt)}), flush=True)
    print("saving", flush=True)
    manager.save(args.step, model=model, optimizer=opt)
    print("done", flush=True)


def _spawn(url: str, options: dict[str, Any], step: int, size_mb: float) -> subprocess.Popen:
    command = [sys.executable, "-m", "fuzz.remote_kill", "--child", "--url", url]
    command += ["--options", json.dumps(options), "--step", str(step), "--size-mb", str(size_mb)]
    return subprocess.Popen(command, stdout=subprocess.PIPE, text=True)


def _objects_ok(manager: Any, root: Any) -> list[str]:
    """What is wrong with the objects and uploads under the root (nothing: ``[]``)."""
    from tlckpt.codec.sets.remote_set_reading import read_remote_manifest

    problems = []
    if root.uploads(""):
        problems.append(f"incomplete multipart uploads remain: {root.uploads('')}")
    committed = {f"step-{s:020d}" for s in manager.steps()}
    for key in root.object_keys():
        prefix, _, name = key.partition("/")
        if prefix not in committed:
            problems.append(f"orphan object {key}")
            continue
        manifest, _ = read_remote_manifest(root.child(prefix), authenticate=False)
        if name != "manifest.json" and name not in {m.file for m in manifest.members.values()}:
            problems.append(f"object {key} is no member of its set")
    return problems


def _kill_at_upload(proc: subprocess.Popen, root: Any, seconds: float = 120.0) -> float | None:
    """Kill ``proc`` as soon as a multipart upload of it is in flight; returns when (or
    ``None`` if it ended first)."""
    started = time.monotonic()
    while proc.poll() is None and time.monotonic() - started < seconds:
        if root.uploads(""):
            proc.send_signal(signal.SIGKILL)
            return time.monotonic() - started
        time.sleep(0.02)
    return None


def campaign(
    url: str,
    options: dict[str, Any],
    trials: int,
    size_mb: float,
    seed: int,
    at_upload: bool = False,
) -> list[str]:
    """Run the trials against ``url``; returns the failures (none: ``[]``). With
    ``at_upload``, no save is measured: each child is killed once a multipart upload of
    it is in flight (the CI's short version)."""
    from tlckpt import verify_checkpoint
    from tlckpt.codec.sets import remote_upload
    from tlckpt.codec.sets.remote_store import open_store
    from tlckpt.codec.sets.set_folders import SkippedCheckpointWarning

    remote_upload.FIRST_PART = _PART
    rng = random.Random(seed)
    manager = _manager(url, options)
    root = open_store(url, options)
    announced: dict[int, str] = {}
    ever: set[int] = set()
    failures: list[str] = []
    save_time = None
    interrupted = 0  # children killed before their save returned
    for trial in range(trials):
        step = 10 * (trial + 1)
        proc = _spawn(url, options, step, size_mb)
        assert proc.stdout is not None
        announced[step] = json.loads(proc.stdout.readline())["digest"]
        assert proc.stdout.readline().strip() == "saving"
        started = time.monotonic()
        delay = None if save_time is None else rng.uniform(0, save_time)
        if at_upload:
            delay = _kill_at_upload(proc, root)
            save_time = save_time or 0.0
        elif delay is not None:
            time.sleep(delay)
            proc.send_signal(signal.SIGKILL)
        # The save's end is its "done" line (the interpreter's exit takes longer).
        finished = proc.stdout.readline().strip() == "done"
        ended = time.monotonic() - started
        proc.stdout.read()
        proc.wait()
        if save_time is None:
            save_time = ended
            if not finished:
                failures.append(f"trial {trial}: the calibration save did not finish")
        else:
            interrupted += not finished
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SkippedCheckpointWarning)
            steps = manager.steps()
            for s in steps:
                try:
                    verify_checkpoint(f"{url}/step-{s:020d}", storage_options=options)
                except Exception as exc:  # reported: a listed set must verify
                    failures.append(f"trial {trial}: listed set {s} does not verify: {exc}")
            latest = manager.latest()
        if steps and latest != steps[-1]:
            failures.append(f"trial {trial}: latest() is {latest}, newest listed {steps[-1]}")
        lost = {s for s in ever if s not in steps and len([n for n in steps if n > s]) < 3}
        if lost:
            failures.append(f"trial {trial}: committed sets lost: {sorted(lost)}")
        ever |= set(steps)
        if latest is not None:
            # The parent's own saves (steps ending in 5) are of a small model.
            model, opt = _model(size_mb if latest % 10 == 0 else _SMALL_MB, 10_000 + trial)
            manager.restore(model=model, optimizer=opt)
            if _digest(model, opt) != announced[latest]:
                failures.append(f"trial {trial}: set {latest} restores other values")
        # The killed save's lease runs out; then a save of the parent's must clean up.
        time.sleep(LEASE_SECONDS + 1.5)
        small, small_opt = _model(_SMALL_MB, trial)
        clean_step = step + 5
        manager.save(clean_step, model=small, optimizer=small_opt)
        announced[clean_step] = _digest(small, small_opt)
        ever.add(clean_step)
        failures.extend(f"trial {trial}: {p}" for p in _objects_ok(manager, root))
        print(
            f"trial {trial}: killed after {delay if delay is None else round(delay, 2)} s"
            f" ({'before' if not finished else 'after'} its save returned), sets"
            f" {manager.steps()}",
            flush=True,
        )
    print(f"{interrupted} of {trials - (not at_upload)} killed children were mid-save")
    return failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=24)
    parser.add_argument("--size-mb", type=float, default=24.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--at-upload", action="store_true", help="kill once a multipart upload is in flight"
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--options", help=argparse.SUPPRESS)
    parser.add_argument("--step", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args)
        return 0
    from tlckpt.testing.s3_server import local_s3

    with local_s3() as endpoint:
        os.environ.update(endpoint.env)
        url = endpoint.root(f"kill-{args.seed}")
        failures = campaign(
            url, endpoint.storage_options, args.trials, args.size_mb, args.seed, args.at_upload
        )
    for failure in failures:
        print("FAILED", failure)
    print(f"{args.trials} trials, {len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
