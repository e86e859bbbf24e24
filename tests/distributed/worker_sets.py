"""Checkpoint sets of a sharded run (see ``sharded_worker.py``): every rank saves, rank 0
commits; a restore into fresh shards."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sharded_support import K, differences, snapshot
from worker_common import MINE, check, on_writer, sharded_model

import tlckpt
from tlckpt.runtime.placement.sharded_io import last_sharded_io
from tlckpt.testing.models import train


@check
def checkpoint_sets(ctx: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint set of the sharded run: every rank writes its own bytes of each member
    (the parallel path), rank 0 digests them and commits; its model member is the
    single-process file; a restore into fresh shards equals the saved run."""
    model, opt = sharded_model(ctx["mesh"], seed=0)
    counter = train(model, opt, 0, K)
    manager = tlckpt.CheckpointManager(MINE / "sets")
    folder = manager.save(K, model=model, optimizer=opt, random_counter=counter).wait()
    route = last_sharded_io().route
    dist.barrier()
    same_model = on_writer(
        lambda: (folder / "model.tlsf32").read_bytes() == (MINE / "model.tlsf32").read_bytes()
    )
    verified = on_writer(lambda: tlckpt.verify_checkpoint(folder).world_size)
    saved = torch.load(MINE / "saved.pt", weights_only=True)
    fresh, fresh_opt = sharded_model(ctx["mesh"], seed=4321)
    restored = manager.restore(model=fresh, optimizer=fresh_opt)
    after = differences(snapshot(fresh, fresh_opt), saved)
    # A background save of the sharded run (test_sharded_background.py has the rest).
    background_manager = tlckpt.CheckpointManager(MINE / "sets-background")
    background_manager.save(K + 1, model=model, optimizer=opt, blocking=False).wait()
    background = background_manager.steps()
    # Version-2 sets of a sharded model: several objects are refused on every rank before
    # any collective, nothing written; a safetensors member (the tied pair once) is written
    # by every rank and restores exactly.
    structured: dict[str, Any] = {}
    for label, kwargs, fmt in (
        ("sequence", {"model": [model], "optimizer": [opt]}, "auto"),
        ("safetensors", {"model": model, "optimizer": opt}, "safetensors"),
    ):
        other = tlckpt.CheckpointManager(MINE / f"sets-{label}", model_format=fmt)
        try:
            other.save(K, random_counter=counter, **kwargs)
            structured[label] = "accepted"
        except tlckpt.CheckpointError as exc:
            structured[label] = f"{type(exc).__name__}: {exc}"
        structured[label + "_steps"] = other.steps()
        if structured[label] == "accepted":
            again, again_opt = sharded_model(ctx["mesh"], seed=99)
            other.restore(model=again, optimizer=again_opt)
            structured[label + "_restored"] = differences(snapshot(again, again_opt), saved)
    dist.barrier()
    return {
        "structured": structured,
        "steps": manager.steps(),
        "same_model": same_model,
        "world_size": verified,
        "counter": restored.random_counter,
        "after_restore": after,
        "background": background,
        "route": route,
    }


@check
def signed_checkpoint_sets(ctx: dict[str, Any]) -> dict[str, Any]:
    """A signed set of the sharded run: every member's bytes pass through rank 0's keyed
    digesting writers, rank 0 commits the MAC'd manifest; restored with the key into fresh
    shards it equals the saved run, and without the key every rank refuses it."""
    model, opt = sharded_model(ctx["mesh"], seed=0)
    counter = train(model, opt, 0, K)
    key = bytes(range(64, 96))
    manager = tlckpt.CheckpointManager(MINE / "signed-sets", key=key)
    folder = manager.save(K, model=model, optimizer=opt, random_counter=counter).wait()
    dist.barrier()
    signed = on_writer(lambda: tlckpt.verify_checkpoint(folder, key=key).key_id is not None)
    saved = torch.load(MINE / "saved.pt", weights_only=True)
    fresh, fresh_opt = sharded_model(ctx["mesh"], seed=4321)
    try:
        tlckpt.load_checkpoint(folder, model=fresh, optimizer=fresh_opt)
        keyless = "loaded"
    except tlckpt.KeyRequiredError:
        keyless = "KeyRequiredError"
    unchanged = differences(snapshot(fresh, fresh_opt), saved) != []
    restored = manager.restore(model=fresh, optimizer=fresh_opt)
    after = differences(snapshot(fresh, fresh_opt), saved)
    dist.barrier()
    return {
        "signed": signed,
        "keyless": keyless,
        "unchanged": unchanged,
        "counter": restored.random_counter,
        "after_restore": after,
    }
