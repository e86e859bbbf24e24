"""SIGKILL during overwrites of one S3 set (moto): a child process overwrites step 1 with
values of its own and is killed at moments spread over a measured save; after its lease
has run out, step 1 restores exactly the values of the set before or those of the child,
never neither and never a mix."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch
from remote_support import objects, outlive_lease

from tlckpt import CheckpointManager

REPO = Path(__file__).resolve().parents[2]
LEASE = 2.0
TRIALS = 5

CHILD = """
import hashlib, json, sys, torch
from tlckpt import CheckpointManager
url, options = sys.argv[1], json.loads(sys.argv[2])
seed, lease = int(sys.argv[3]), float(sys.argv[4])
torch.manual_seed(seed)
model = torch.nn.Linear(512, 2048)
h = hashlib.sha256()
for t in model.state_dict().values():
    h.update(t.detach().numpy().tobytes())
print(h.hexdigest(), flush=True)
manager = CheckpointManager(url, storage_options=options, lease_seconds=lease)
print("saving", flush=True)
manager.save(1, model=model, overwrite=True)
print("done", flush=True)
"""


def _digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for t in model.state_dict().values():
        h.update(t.detach().numpy().tobytes())
    return h.hexdigest()


def _overwrite(url: str, options: dict, seed: int, delay: float | None) -> tuple[str, float]:
    """Run a child overwriting step 1; kill it ``delay`` s after it starts saving. Its
    values' digest, and how long it ran from the start of its save."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO.parent), env.get("PYTHONPATH")]))
    env.setdefault("OMP_NUM_THREADS", "1")
    command = [sys.executable, "-c", CHILD, url, json.dumps(options), str(seed), str(LEASE)]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        digest = proc.stdout.readline().strip()
        assert proc.stdout.readline().strip() == "saving"
        started = time.monotonic()
        if delay is not None:
            time.sleep(delay)
            proc.send_signal(signal.SIGKILL)
        proc.stdout.readline()  # "done", or nothing once killed
        ended = time.monotonic() - started
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return digest, ended


def test_sigkill_during_s3_overwrites_keeps_a_whole_set(s3) -> None:
    url = s3.root("overwrite-kill")
    options = s3.storage_options
    current, took = _overwrite(url, options, 0, None)  # the first save (nothing to replace)
    current, took = _overwrite(url, options, 1, None)  # a whole overwrite: measured
    for trial in range(TRIALS):
        delay = took * (trial + 0.5) / TRIALS
        new, _ = _overwrite(url, options, 100 + trial, delay)
        # The killed save's lease runs out (S3 dates objects to the second).
        outlive_lease(f"{url}/step-00000000000000000001", LEASE, options)
        manager = CheckpointManager(url, storage_options=options, lease_seconds=LEASE)
        assert manager.latest() == 1, f"trial {trial} ({delay:.2f} s): {objects(url, options)}"
        model = torch.nn.Linear(512, 2048)
        manager.restore(model=model)
        got = _digest(model)
        assert got in (current, new), f"trial {trial}: step 1 restores other values"
        print(
            f"trial {trial}: killed after {delay:.2f} of {took:.2f} s:",
            "new" if got == new else "old",
        )
        current = got
    # The next save removes what the killed ones left.
    manager.save(2, model=torch.nn.Linear(2, 2))
    keys = objects(url, options)
    assert {k.split("/")[0] for k in keys} == {
        "step-00000000000000000001",
        "step-00000000000000000002",
    }, keys
