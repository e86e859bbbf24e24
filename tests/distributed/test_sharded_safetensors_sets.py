"""Sharded (FSDP2) models in checkpoint sets with a safetensors model member: a bf16 model
with AdamW and a scheduler through ``CheckpointManager``, worlds 2 and 3 (gloo on 127.0.0.1).

The member's header is written once by rank 0 and every rank writes its own shards' bytes
(the parallel path), or full tensors stream through rank 0 (``TLCKPT_SHARDED_IO=rank0``);
either way it is byte for byte one process's file of the unsharded model. Each group runs
its checks in one go (``safetensors_set_worker.py``) within a time limit, so a hang fails.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from sharded_support import K, launch

pytestmark = pytest.mark.distributed

HERE = Path(__file__).resolve().parent
CHECKS = ("resume", "damaged")


@pytest.fixture(scope="module", params=[2, 3], ids=lambda w: f"world{w}")
def world(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("safetensors-sets")
    exits, _, output = launch(
        request.param,
        folder,
        [],
        timeout=180.0,
        script=HERE / "safetensors_set_worker.py",
        extra_env={"TLCKPT_TEST_WORKDIR": str(folder)},
    )
    results: list[dict[str, Any]] = []
    for rank in range(request.param):
        path = folder / f"st-r{rank}.json"
        results.append(orjson.loads(path.read_bytes()) if path.exists() else {})
    for name in CHECKS:
        if any(not r.get(name, {}).get("ok") for r in results):
            errors = [r.get(name, {}).get("error", "missing") for r in results]
            pytest.fail(f"{name} in world {request.param}, exits {exits}: {errors}\n{output}")
    return request.param, results


def test_the_member_is_one_process_file_of_the_unsharded_model(world):
    size, results = world
    files = results[0]["resume"]["files"]
    assert files["members"] == [
        "manifest.json",
        "model.safetensors",
        "optimizer.tladam",
        "training_state.json",
    ]
    assert files["same_bytes"] is True, "parallel path"
    assert files["same_bytes_rank0"] is True, "through rank 0"
    assert files["same_bytes_background"] is True, "a background save"
    assert files["same_training_state"] is True
    assert files["same_bytes_direct"] is True, "save_module_state of the sharded model"
    for r in results:
        assert r["resume"]["direct_differs"] == [], "load_module_state into fresh shards"
    assert files["version"] == 2 and files["world_size"] == size
    assert results[0]["resume"]["routes"]["save model.safetensors"] == "parallel"
    # One process restores the sharded run's set into the unsharded model, exactly.
    assert files["one_process_restore"] == []


def test_a_bf16_fsdp2_run_resumes_bit_exactly(world):
    _, results = world
    for r in results:
        for label, outcome in r["resume"]["restores"].items():
            assert outcome["counter"] == K, label
            assert outcome["after_restore"] == [], label
            assert outcome["continuation"] == [], label
            assert outcome["lr_restored"] is True, label
    routes = results[0]["resume"]["restores"]
    assert routes["parallel"]["route"]["load model.safetensors"] == "parallel"
    assert routes["rank0"]["route"]["load model.safetensors"] == "rank0"


def test_a_flipped_byte_is_refused_on_every_rank_with_nothing_changed(world):
    _, results = world
    for r in results:
        outcomes = r["damaged"]["outcomes"]
        for label in ("data", "header", "data streamed"):
            assert outcomes[label] == {"raised": "IntegrityError", "unchanged": True}, label
        assert outcomes["header streamed"]["raised"] is not None
        assert outcomes["header streamed"]["unchanged"] is True
    kinds = {str(r["damaged"]["outcomes"]) for r in results}
    assert len(kinds) == 1, kinds


def test_other_optimizers_and_structures_of_a_sharded_model_are_refused(world):
    _, results = world
    for r in results:
        refused = r["damaged"]["refused"]
        assert "must be Adam or AdamW, not SGD" in refused["sgd"]
        assert "one model, one Adam/AdamW optimizer" in refused["sequence"]
        assert refused["sgd_steps"] == [] and refused["sequence_steps"] == []
