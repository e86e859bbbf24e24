"""What every check module of a sharded test group's rank shares (see ``sharded_worker.py``):
the rank, world and working folders, the registry of checks (``@check``), and the sharded
model and its local state."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sharded_support import (
    local_slice,
)

from tlckpt.runtime import (
    load_module_state,
    load_optimizer,
    load_state_bits,
)
from tlckpt.runtime.binding.dtensors import local_tensor
from tlckpt.runtime.placement.sharded_io import ENV
from tlckpt.testing.bitwise import same
from tlckpt.testing.models import TiedNet, make_adam

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
WORKDIR = Path(sys.argv[1])
MINE = WORKDIR / f"w{WORLD}"
CHECKS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {}


def check(fn: Callable[[dict[str, Any]], dict[str, Any]]):
    """Register ``fn`` as the check of its name."""
    CHECKS[fn.__name__] = fn
    return fn


def sharded_model(mesh: Any, seed: int) -> tuple[TiedNet, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = TiedNet()
    fully_shard(model.mix, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, make_adam("adamw", model.parameters())


def on_writer(fn: Callable[[], Any]) -> Any:
    return fn() if RANK == 0 else None


def local_state(model: torch.nn.Module, opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Clones of this rank's own memory: local shards, buffers, optimizer state."""
    out = [local_tensor(t).clone() for t in model.state_dict(keep_vars=True).values()]
    for group in opt.param_groups:
        for p in group["params"]:
            for value in opt.state.get(p, {}).values():
                out.append(local_tensor(value).clone())
    return out


def unchanged(before: list[torch.Tensor], after: list[torch.Tensor]) -> bool:
    return len(before) == len(after) and all(same(a, b) for a, b in zip(before, after))


def load_all(model: Any, opt: Any, folder: Path, bits: bool = False) -> int | None:
    if bits:
        load_state_bits(model, folder / "state.json")
    else:
        load_module_state(model, folder / "model.tlsf32")
    return load_optimizer(opt, model, folder / "opt.tladam", restore_random_counter=True)


def shards_match(model: Any, opt: Any, expected: dict[str, Any]) -> list[str]:
    """Where this rank's shards differ from its rows of the expected full values."""
    bad = []
    for name, t in model.state_dict(keep_vars=True).items():
        want = expected["state"][name]
        want = local_slice(want, RANK, WORLD) if isinstance(t, DTensor) else want
        if not torch.equal(local_tensor(t), want):
            bad.append(name)
    names = {id(p): n for n, p in model.named_parameters()}
    for group in opt.param_groups:
        for p in group["params"]:
            for key, value in opt.state.get(p, {}).items():
                want = expected["optimizer"][names[id(p)]][key]
                if isinstance(value, DTensor):
                    want = local_slice(want, RANK, WORLD)
                if not torch.equal(local_tensor(value), want):
                    bad.append(f"{names[id(p)]}.{key}")
    return bad


@contextlib.contextmanager
def route(mode: str | None) -> Iterator[None]:
    """Sharded saves and loads inside take this path (``TLCKPT_SHARDED_IO``; ``None``: the
    probe decides)."""
    before = os.environ.pop(ENV, None)
    if mode is not None:
        os.environ[ENV] = mode
    try:
        yield
    finally:
        os.environ.pop(ENV, None)
        if before is not None:
            os.environ[ENV] = before
