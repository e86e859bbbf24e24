"""``TlckptTrainer`` in a 2-rank DDP run (gloo on 127.0.0.1, CPU; the real Trainer and
accelerate): every rank's random states go into the set (gathered as bytes, nothing pickled)
and come back to their own rank, so the run stopped after step 4 and resumed to 8 is
bit-identical, on each rank, to the run that went straight to 8 (:mod:`trainer_ddp_worker`).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("accelerate")
pytest.importorskip("transformers")

from tlckpt import verify_checkpoint
from tlckpt.codec.sets.checkpoint_set import VerifiedSet
from tlckpt.testing.processes import free_port, rank_env

WORKER = Path(__file__).with_name("trainer_ddp_worker.py")
WORLD = 2


def test_two_ranks_resume_bit_exactly_with_their_own_random_states(tmp_path: Path) -> None:
    port = free_port()
    ranks = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(tmp_path), str(tmp_path / f"rank{r}.json")],
            env=rank_env(r, WORLD, port),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(WORLD)
    ]
    outputs = [p.communicate(timeout=540)[0] for p in ranks]
    for p, out in zip(ranks, outputs):
        assert p.returncode == 0, out[-4000:]
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]
    for report in reports:
        assert report["straight"].startswith("8:")
        assert report["resumed"] == report["straight"]
    set_4 = tmp_path / "b" / "checkpoint-4"
    verify_checkpoint(set_4)
    with VerifiedSet.open(set_4) as verified:
        recorded = verified.training_state().extra["rng"]
    assert len(recorded) == WORLD and recorded[0]["torch"] != recorded[1]["torch"]
