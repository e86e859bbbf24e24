"""tlckpt's own optimizer family sharded (see ``sharded_worker.py``): two param groups, one
with amsgrad, under FSDP2 — the file a single process writes, and a bit-exact resume."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sharded_support import K, N, differences, snapshot
from worker_common import MINE, check, on_writer

from tlckpt.runtime import load_module_state, load_optimizer, save_module_state, save_optimizer
from tlckpt.testing.models import TiedNet, train


def _two_groups(model: torch.nn.Module) -> torch.optim.Optimizer:
    """Weight decay for matrices only (the Hugging Face / timm split), amsgrad in the
    no-decay group: a state only tlckpt's own family (TLCKOPT) holds."""
    named = [(n, p) for n, p in model.named_parameters()]
    return torch.optim.AdamW(
        [
            {"params": [p for _, p in named if p.ndim > 1], "weight_decay": 0.05},
            {"params": [p for _, p in named if p.ndim <= 1], "weight_decay": 0.0, "amsgrad": True},
        ],
        lr=0.02,
        betas=(0.8, 0.95),
        eps=1e-7,
    )


@check
def own_family_groups(ctx: dict[str, Any]) -> dict[str, Any]:
    """Two param groups (one with amsgrad), sharded: the TLCKOPT file equals a single
    process's with the full values; loaded into fresh shards, the run continues bit for bit."""
    folder = MINE / "groups"
    on_writer(lambda: folder.mkdir(exist_ok=True))
    dist.barrier()
    torch.manual_seed(0)
    model = TiedNet()
    fully_shard(model.mix, mesh=ctx["mesh"])
    fully_shard(model, mesh=ctx["mesh"])
    opt = _two_groups(model)
    train(model, opt, 0, K)
    save_module_state(model, folder / "model.tlsf32")
    version = save_optimizer(opt, model, folder / "opt.tlckopt", random_counter=K)
    saved = snapshot(model, opt)
    identical: list[bool] = []

    def single_process_file() -> None:
        torch.manual_seed(4321)
        plain = TiedNet()
        plain.load_state_dict(saved["state"])
        plain_opt = _two_groups(plain)
        params = dict(plain.named_parameters())
        for name, entry in saved["optimizer"].items():
            plain_opt.state[params[name]] = {k: v.clone() for k, v in entry.items()}
        save_optimizer(plain_opt, plain, folder / "plain.tlckopt", random_counter=K)
        identical.append(
            (folder / "opt.tlckopt").read_bytes() == (folder / "plain.tlckopt").read_bytes()
        )

    on_writer(single_process_file)
    train(model, opt, K, N)
    continued = snapshot(model, opt)
    torch.manual_seed(99)
    fresh = TiedNet()
    fully_shard(fresh.mix, mesh=ctx["mesh"])
    fully_shard(fresh, mesh=ctx["mesh"])
    fresh_opt = _two_groups(fresh)
    load_module_state(fresh, folder / "model.tlsf32")
    counter = load_optimizer(fresh_opt, fresh, folder / "opt.tlckopt", restore_random_counter=True)
    after_load = differences(snapshot(fresh, fresh_opt), saved)
    train(fresh, fresh_opt, K, N)
    amsgrad = all(
        "max_exp_avg_sq" in s
        for g in fresh_opt.param_groups[1:]
        for p in g["params"]
        if (s := fresh_opt.state.get(p))
    )
    return {
        "version": version,
        "identical": identical,
        "counter": counter,
        "after_load": after_load,
        "after_training": differences(snapshot(fresh, fresh_opt), continued),
        "amsgrad": amsgrad,
    }
