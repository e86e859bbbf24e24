"""One rank of a sharded-checkpoint test group (started by ``sharded_support.launch``).

Usage (``torchrun``-style environment: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT):
``python sharded_worker.py WORKDIR CHECK...``. The group initialises gloo once and runs the
checks in order, all ranks together; each rank writes ``results-w{W}-r{R}.json`` in WORKDIR
after every check (check name → ``{"ok": bool, ...}``), which the tests then read.
This module holds the runs, resumes and reshards; the failure checks are in
``worker_failures.py``, the placements, dtypes and memory in ``worker_placements.py``,
tlckpt's own optimizer family in ``worker_groups.py``, checkpoint sets in ``worker_sets.py``,
the two paths of a sharded call (parallel, through rank 0) in ``worker_paths.py``.
Files are exchanged between groups (and the pytest process) through WORKDIR:
``w{W}/model.tlsf32``, ``state.json``, ``opt.tladam``, ``saved.pt`` and ``continued.pt``.
"""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sharded_support import (
    K,
    N,
    differences,
    local_slice,
    max_difference,
    plain_copy,
    run_checks,
    snapshot,
)
from worker_common import (
    CHECKS,
    MINE,
    RANK,
    WORKDIR,
    WORLD,
    check,
    load_all,
    on_writer,
    sharded_model,
    shards_match,
)

from tlckpt.runtime import (
    save_module_state,
    save_optimizer,
    save_state_bits,
    schema_of,
)
from tlckpt.runtime.binding.dtensors import local_tensor
from tlckpt.runtime.placement.sharded_io import last_sharded_io
from tlckpt.testing.models import TiedNet, train


@check
def sharded_run(ctx: dict[str, Any]) -> dict[str, Any]:
    """Train K steps sharded, save, compare with a single process holding the full values;
    then train N more steps (the original run's continuation)."""
    model, opt = sharded_model(ctx["mesh"], seed=0)
    counter = train(model, opt, 0, K)
    on_writer(lambda: MINE.mkdir(exist_ok=True))
    dist.barrier()
    save_module_state(model, MINE / "model.tlsf32")
    model_route = last_sharded_io().route
    save_state_bits(model, MINE / "state.json")
    version = save_optimizer(opt, model, MINE / "opt.tladam", random_counter=counter)
    # The parameters as a one-shot generator (deduplicated: no tied slots), and the state
    # as a mapping, work as for one process.
    by_generator = save_optimizer(opt, model.parameters(), MINE / "generator.tladam")
    save_module_state(dict(model.state_dict(keep_vars=True)), MINE / "mapping.tlsf32")
    saved = snapshot(model, opt)
    identical: dict[str, bool] = {}

    def single_process_files() -> None:
        plain, plain_opt = plain_copy(saved)
        save_module_state(plain, MINE / "plain.tlsf32")
        save_state_bits(plain, MINE / "plain.json")
        plain_version = save_optimizer(plain_opt, plain, MINE / "plain.tladam", random_counter=K)
        for ours, theirs in [("model.tlsf32", "plain.tlsf32"), ("state.json", "plain.json")]:
            identical[ours] = (MINE / ours).read_bytes() == (MINE / theirs).read_bytes()
        identical["opt.tladam"] = (MINE / "opt.tladam").read_bytes() == (
            MINE / "plain.tladam"
        ).read_bytes() and plain_version == version
        plain_by_generator = save_optimizer(plain_opt, plain.parameters(), MINE / "plain-gen")
        identical["generator.tladam"] = (
            plain_by_generator == by_generator == 2
            and (MINE / "generator.tladam").read_bytes() == (MINE / "plain-gen").read_bytes()
        )
        identical["mapping.tlsf32"] = (MINE / "mapping.tlsf32").read_bytes() == (
            MINE / "plain.tlsf32"
        ).read_bytes()
        torch.save(saved, MINE / "saved.pt")

    on_writer(single_process_files)
    train(model, opt, K, N)
    continued = snapshot(model, opt)
    on_writer(lambda: torch.save(continued, MINE / "continued.pt"))
    ctx["trained"] = (model, opt)
    dist.barrier()
    sizes = {n: tuple(local_tensor(p).shape) for n, p in model.named_parameters()}
    same_schema = schema_of(model) == schema_of(TiedNet())
    return {
        "version": version,
        "identical": identical,
        "local_shapes": sizes,
        "same_schema": same_schema,
        "model_route": model_route,
    }


@check
def resume_same_world(ctx: dict[str, Any]) -> dict[str, Any]:
    """Load this world's files into fresh sharded objects; continue; compare bit for bit."""
    saved = torch.load(MINE / "saved.pt", weights_only=True)
    continued = torch.load(MINE / "continued.pt", weights_only=True)
    model, opt = sharded_model(ctx["mesh"], seed=1234)
    fresh_differs = bool(differences(snapshot(model, opt), saved))
    counter = load_all(model, opt, MINE)
    after_load = differences(snapshot(model, opt), saved)
    slices = shards_match(model, opt, saved)
    train(model, opt, K, N)
    after_training = differences(snapshot(model, opt), continued)
    tied = model.head.weight is model.emb.weight
    bits_model, bits_opt = sharded_model(ctx["mesh"], seed=99)
    load_all(bits_model, bits_opt, MINE, bits=True)
    after_bits = differences(snapshot(bits_model, bits_opt), saved)
    return {
        "fresh_differs": fresh_differs,
        "counter": counter,
        "after_load": after_load,
        "slices": slices,
        "after_training": after_training,
        "tied": tied,
        "after_bits_load": after_bits,
    }


@check
def single_process_file_into_shards(ctx: dict[str, Any]) -> dict[str, Any]:
    """Files written by one process load into W shards: each shard is its rows."""
    folder = WORKDIR / "w1"
    saved = torch.load(folder / "saved.pt", weights_only=True)
    model, opt = sharded_model(ctx["mesh"], seed=77)
    load_all(model, opt, folder)
    slices = shards_match(model, opt, saved)
    gathered = differences(snapshot(model, opt), saved)
    bits_model, bits_opt = sharded_model(ctx["mesh"], seed=78)
    load_all(bits_model, bits_opt, folder, bits=True)
    return {
        "slices": slices,
        "gathered": gathered,
        "bits_slices": shards_match(bits_model, bits_opt, saved),
    }


@check
def other_world_into_shards(ctx: dict[str, Any]) -> dict[str, Any]:
    """The world-2 run's files load into this world; continue and compare with world 2."""
    folder = WORKDIR / "w2"
    saved = torch.load(folder / "saved.pt", weights_only=True)
    continued = torch.load(folder / "continued.pt", weights_only=True)
    model, opt = sharded_model(ctx["mesh"], seed=55)
    counter = load_all(model, opt, folder)
    after_load = differences(snapshot(model, opt), saved)
    slices = shards_match(model, opt, saved)
    train(model, opt, K, N)
    now = snapshot(model, opt)
    # The same arithmetic: this world's run from the same values, installed by hand.
    twin, twin_opt = sharded_model(ctx["mesh"], seed=56)
    install_by_hand(twin, twin_opt, saved)
    train(twin, twin_opt, K, N)
    return {
        "counter": counter,
        "after_load": after_load,
        "slices": slices,
        "matches_same_arithmetic": differences(now, snapshot(twin, twin_opt)),
        "continuation_bit_exact": not differences(now, continued),
        "continuation_max_difference": max_difference(now, continued),
    }


def install_by_hand(model: Any, opt: Any, values: dict[str, Any]) -> None:
    """Full values into sharded objects with ``torch.chunk`` rows (no tlckpt involved)."""
    from tlckpt.runtime.binding.dtensors import like_dtensor

    with torch.no_grad():
        for name, t in model.state_dict(keep_vars=True).items():
            want = values["state"][name]
            if isinstance(t, DTensor):
                want = local_slice(want, RANK, WORLD)
            local_tensor(t).copy_(want)
    params = dict(model.named_parameters())
    for name, entry in values["optimizer"].items():
        p = params[name]
        opt.state[p] = {
            "step": entry["step"].clone(),
            "exp_avg": like_dtensor(local_slice(entry["exp_avg"], RANK, WORLD).clone(), p),
            "exp_avg_sq": like_dtensor(local_slice(entry["exp_avg_sq"], RANK, WORLD).clone(), p),
        }


def main() -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    ctx: dict[str, Any] = {"mesh": init_device_mesh("cpu", (WORLD,))}
    try:
        run_checks(sys.argv[2:], CHECKS, ctx, WORKDIR / f"results-w{WORLD}-r{RANK}.json")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    # The other check modules register their checks when imported.
    import worker_failures  # noqa: F401
    import worker_groups  # noqa: F401
    import worker_paths  # noqa: F401
    import worker_placements  # noqa: F401
    import worker_sets  # noqa: F401

    main()
