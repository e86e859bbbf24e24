"""Background saves of sharded (FSDP2) models: ``CheckpointManager.save(blocking=False)`` on
every rank copies each rank's shards and returns; the set is written by a thread whose
collectives run over the manager's own process group, committed once every rank's part is
durable. Worlds 2 and 3 (gloo on 127.0.0.1); CUDA (a one-rank NCCL group) where a GPU is.
Also the sharded restore's reads by path (every rank its own pieces of the verified members).

Each group runs every check in one go (``background_worker.py``) within a time limit, so a
hang fails the test instead of blocking the run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
import torch
from sharded_support import K, launch

pytestmark = pytest.mark.distributed

HERE = Path(__file__).resolve().parent
CHECKS = [
    "background_saves",
    "background_through_rank0",
    "background_failures",
    "restore_by_path",
    "saving_group_released",
    "digest_before_the_sync",
]


def _run(workdir: Path, world: int, device: str) -> list[dict[str, Any]]:
    folder = workdir / f"{device}-w{world}"
    folder.mkdir()
    env = {
        "TLCKPT_TEST_WORKDIR": str(folder),
        "TLCKPT_TEST_CHECKS": ",".join(CHECKS),
        "TLCKPT_TEST_DEVICE": device,
    }
    exits, _, output = launch(
        world, folder, [], timeout=180.0, script=HERE / "background_worker.py", extra_env=env
    )
    results = []
    for rank in range(world):
        path = folder / f"bg-r{rank}.json"
        results.append(orjson.loads(path.read_bytes()) if path.exists() else {})
    for name in CHECKS:
        if any(not r.get(name, {}).get("ok") for r in results):
            errors = [r.get(name, {}).get("error", "missing") for r in results]
            pytest.fail(f"{name} in world {world} ({device}), exits {exits}: {errors}\n{output}")
    return results


@pytest.fixture(scope="module", params=[2, 3], ids=lambda w: f"world{w}")
def cpu_world(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    return _run(tmp_path_factory.mktemp("background"), request.param, "cpu")


def _assert_saves(results: list[dict[str, Any]]) -> None:
    assert results[0]["background_saves"]["same_bytes"] is True
    for r in results:
        saves = r["background_saves"]
        assert saves["counter"] == K
        assert saves["exact"] == [], "the set holds values changed after the call"
        assert saves["continuation"] == []
        assert saves["steps"] == [K + 2]  # keep_last=1 after the second save
        assert saves["second_exact"] == []


def test_background_save_holds_the_values_of_the_call_and_resumes_exactly(cpu_world):
    _assert_saves(cpu_world)


def test_background_save_through_rank0_over_the_managers_group(cpu_world):
    assert cpu_world[0]["background_through_rank0"]["same_bytes"] is True
    for r in cpu_world:
        outcome = r["background_through_rank0"]
        assert outcome["route"] == "rank0" and outcome["exact"] == [], outcome


def test_a_failure_on_any_rank_is_raised_by_every_rank_and_nothing_is_committed(cpu_world):
    for r in cpu_world:
        outcomes = r["background_failures"]["outcomes"]
        assert outcomes["last rank"]["raised"]["type"] == "OSError"
        assert "injected: no space" in outcomes["last rank"]["raised"]["text"]
        assert outcomes["rank 0"]["raised"]["type"] == "OSError"
        assert "injected: no space" in outcomes["rank 0"]["raised"]["text"]
        assert outcomes["rank 0 digest"]["raised"]["type"] == "OSError"
        assert "injected: the disk failed" in outcomes["rank 0 digest"]["raised"]["text"]
        for outcome in outcomes.values():
            assert outcome["steps"] == [] and outcome["left"] == [], outcome
        assert r["background_failures"]["steps_after"] == [K]
    for label in ("last rank", "rank 0", "rank 0 digest"):
        texts = {r["background_failures"]["outcomes"][label]["raised"]["text"] for r in cpu_world}
        assert len(texts) == 1, texts


def test_a_sharded_restore_reads_by_path_and_refuses_damaged_or_replaced_members(
    cpu_world,
):
    for r in cpu_world:
        outcome = r["restore_by_path"]
        assert outcome["route"] == "parallel" and outcome["exact"] == []
        assert outcome["raised"] == "FileChangedError" and outcome["unchanged"], outcome
        assert outcome["damaged"] == "IntegrityError", outcome


def test_the_saving_group_is_destroyed_and_its_threads_joined_at_exit(cpu_world):
    for r in cpu_world:
        outcome = r["saving_group_released"]
        assert outcome["registered"] and outcome["released"], outcome
        before, during, after = outcome["threads"]
        assert during > before and after < during, outcome  # gloo's workers came and went
        assert outcome["steps"] == [1, 2], outcome


def test_members_are_digested_before_the_sync_on_one_machine_only(cpu_world):
    early = [["model", True], ["optimizer", True]]
    late = [["model", False], ["optimizer", False]]
    assert cpu_world[0]["digest_before_the_sync"]["adopted"] == early + late
    for r in cpu_world:
        assert r["digest_before_the_sync"]["exact"] == [[], []]
        if r is not cpu_world[0]:
            assert r["digest_before_the_sync"]["adopted"] == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_background_save_of_a_sharded_model_on_cuda(tmp_path):
    """Shards on the GPU: copied into the pinned arena on a side stream; the training
    stream's later writes do not reach the set (a one-rank NCCL group)."""
    results = _run(tmp_path, 1, "cuda")
    _assert_saves(results)
