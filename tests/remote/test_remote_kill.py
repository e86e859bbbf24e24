"""Kill -9 during an S3 save: the CI's short version of ``python -m fuzz.remote_kill``.

A child saving a set in 5 MiB multipart parts to a moto server on 127.0.0.1 is killed with
SIGKILL once an upload of it is in flight: no set without its manifest is listed, the
previous set restores exactly, and after the killed save's lease has run out, the next save
leaves no incomplete multipart upload and no orphan object (the campaign checks all three
and exits 1 otherwise).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_killed_s3_saves_leave_nothing_behind() -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO.parent), env.get("PYTHONPATH")]))
    env.setdefault("OMP_NUM_THREADS", "1")
    command = [sys.executable, "-m", "fuzz.remote_kill", "--trials", "1", "--at-upload"]
    try:
        proc = subprocess.run(
            [*command, "--size-mb", "12"],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:  # a hang is a failure
        pytest.fail(f"the campaign did not finish in 240 s: {exc.stdout!r}")
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert "1 trials, 0 failure(s)" in proc.stdout
    assert proc.stdout.count("killed after None") == 0, proc.stdout  # every child was killed
