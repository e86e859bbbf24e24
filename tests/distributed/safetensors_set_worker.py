"""One rank of a test group of sharded sets with a safetensors model member (started by
``sharded_support.launch`` with ``script=``; see ``test_sharded_safetensors_sets.py``).

Environment: ``torchrun``-style (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), plus
``TLCKPT_TEST_WORKDIR`` (the shared folder). The model is a bf16
:class:`~tlckpt.testing.models.TiedNet` (tied pair, BatchNorm buffers, rows that shard
unevenly) under FSDP2 with AdamW and a scheduler. Each rank writes ``st-r{R}.json`` in the
folder after every check: check name → ``{"ok": bool, ...}``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sharded_support import K, N, differences, run_checks, snapshot

import tlckpt
from tlckpt.codec.sets import checkpoint_set
from tlckpt.runtime import load_module_state, save_module_state
from tlckpt.runtime.binding.dtensors import local_tensor
from tlckpt.runtime.placement.sharded_io import ENV, LOGGER
from tlckpt.testing.bitwise import same
from tlckpt.testing.models import TiedNet, make_adam, train

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
WORKDIR = Path(os.environ["TLCKPT_TEST_WORKDIR"])
CHECKS: dict[str, Callable[[Any], dict[str, Any]]] = {}


def check(fn: Callable[[Any], dict[str, Any]]) -> Callable[[Any], dict[str, Any]]:
    CHECKS[fn.__name__] = fn
    return fn


def objects(mesh: Any, seed: int) -> tuple[TiedNet, torch.optim.Optimizer, Any]:
    """A bf16 FSDP2 TiedNet (``mix`` in a group of its own), AdamW, and a StepLR."""
    torch.manual_seed(seed)
    model = TiedNet(dtype=torch.bfloat16)
    fully_shard(model.mix, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = make_adam("adamw", model.parameters())
    return model, opt, torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)


def run(model: TiedNet, opt: Any, scheduler: Any, first: int, count: int) -> int:
    counter = first
    for step in range(first, first + count):
        counter = train(model, opt, step, 1)
        scheduler.step()
    return counter


@contextlib.contextmanager
def routes_taken() -> Iterator[dict[str, str]]:
    """File name → the path its sharded save or load took (logged on rank 0 only)."""
    taken: dict[str, str] = {}

    class Handler(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            operation, path, route = record.args[:3]  # type: ignore[index,misc]
            taken[f"{operation} {Path(path).name}"] = route

    handler = Handler()
    LOGGER.addHandler(handler)
    level = LOGGER.level
    LOGGER.setLevel(logging.INFO)
    try:
        yield taken
    finally:
        LOGGER.removeHandler(handler)
        LOGGER.setLevel(level)


def local_state(model: torch.nn.Module, opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    out = [local_tensor(t).clone() for t in model.state_dict(keep_vars=True).values()]
    for group in opt.param_groups:
        for p in group["params"]:
            out += [local_tensor(v).clone() for v in opt.state.get(p, {}).values()]
    return out


def unchanged(before: list[torch.Tensor], after: list[torch.Tensor]) -> bool:
    return len(before) == len(after) and all(same(a, b) for a, b in zip(before, after))


def with_route(mode: str | None, fn: Callable[[], Any]) -> Any:
    before = os.environ.pop(ENV, None)
    if mode is not None:
        os.environ[ENV] = mode
    try:
        return fn()
    finally:
        os.environ.pop(ENV, None)
        if before is not None:
            os.environ[ENV] = before


def plain_model(full: dict[str, Any]) -> tuple[TiedNet, torch.optim.Optimizer]:
    """One process's unsharded model and AdamW holding a snapshot's full values."""
    torch.manual_seed(99)
    model = TiedNet(dtype=torch.bfloat16)
    model.load_state_dict(full["state"])
    opt = make_adam("adamw", model.parameters())
    params = dict(model.named_parameters())
    for name, entry in full["optimizer"].items():
        opt.state[params[name]] = {k: v.clone() for k, v in entry.items()}
    return model, opt


@check
def resume(mesh: Any) -> dict[str, Any]:
    """Save through CheckpointManager (model_format auto: the safetensors member), by the
    parallel path and through rank 0; the member equals one process's file of the full
    model; a restore into fresh shards then N steps equal the uninterrupted run."""
    folder = WORKDIR / f"w{WORLD}"
    if RANK == 0:
        folder.mkdir(exist_ok=True)
    dist.barrier()
    model, opt, scheduler = objects(mesh, seed=0)
    counter = run(model, opt, scheduler, 0, K)
    lr_saved = [g["lr"] for g in opt.param_groups]
    manager = tlckpt.CheckpointManager(folder / "sets")

    def save() -> Path:
        saved = manager.save(
            K, model=model, optimizer=opt, scheduler=scheduler, random_counter=counter
        ).wait()
        return saved

    with routes_taken() as routes:
        path = with_route(None, save)
    manager_rank0 = tlckpt.CheckpointManager(folder / "sets-rank0")
    path_rank0 = with_route(
        "rank0",
        lambda: manager_rank0.save(
            K, model=model, optimizer=opt, scheduler=scheduler, random_counter=counter
        ).wait(),
    )
    # A background save: each rank copies its shards, the writer threads write them.
    manager_background = tlckpt.CheckpointManager(folder / "sets-background")
    path_background = manager_background.save(
        K, model=model, optimizer=opt, scheduler=scheduler, random_counter=counter, blocking=False
    ).wait()
    saved = snapshot(model, opt)
    # The same file by save_module_state / load_module_state of the sharded model.
    save_module_state(model, folder / "direct.safetensors")
    direct, direct_opt, _ = objects(mesh, seed=55)
    load_module_state(direct, folder / "direct.safetensors")
    loaded = snapshot(direct, direct_opt)["state"]
    direct_differs = [n for n, t in saved["state"].items() if not same(t, loaded[n])]
    files: dict[str, Any] = {}
    if RANK == 0:  # one process's save of the same values, unsharded
        plain, _ = plain_model(saved)
        save_module_state(plain, folder / "plain.safetensors")
        reference = (folder / "plain.safetensors").read_bytes()
        member = path / "model.safetensors"
        files = {
            "members": sorted(p.name for p in path.iterdir()),
            "same_bytes": member.read_bytes() == reference,
            "same_bytes_rank0": (path_rank0 / "model.safetensors").read_bytes() == reference,
            "same_bytes_background": (path_background / "model.safetensors").read_bytes()
            == reference,
            "same_training_state": (path_background / "training_state.json").read_bytes()
            == (path / "training_state.json").read_bytes(),
            "same_bytes_direct": (folder / "direct.safetensors").read_bytes() == reference,
            "version": tlckpt.verify_checkpoint(path).version,
            "world_size": tlckpt.verify_checkpoint(path).world_size,
        }
        # One process restores the sharded run's set into the unsharded model.
        torch.manual_seed(5)
        one, one_opt = plain_model(saved)
        with torch.no_grad():
            for t in one.state_dict().values():
                t.zero_() if t.is_floating_point() else None
        tlckpt.load_checkpoint(path, model=one, optimizer=one_opt)
        files["one_process_restore"] = differences(snapshot(one, one_opt), saved)
    run(model, opt, scheduler, K, N)
    continued = snapshot(model, opt)
    outcomes = {}
    for label, mode in (("parallel", None), ("rank0", "rank0")):
        fresh, fresh_opt, fresh_sched = objects(mesh, seed=4321)
        with routes_taken() as route:
            restored = with_route(
                mode,
                lambda f=fresh, o=fresh_opt, s=fresh_sched: manager.restore(
                    model=f, optimizer=o, scheduler=s
                ),
            )
        after = differences(snapshot(fresh, fresh_opt), saved)
        lr = [g["lr"] for g in fresh_opt.param_groups]
        run(fresh, fresh_opt, fresh_sched, K, N)
        outcomes[label] = {
            "route": route,
            "counter": restored.random_counter,
            "after_restore": after,
            "continuation": differences(snapshot(fresh, fresh_opt), continued),
            "lr_restored": lr == lr_saved,
        }
    dist.barrier()
    return {
        "routes": routes,
        "files": files,
        "restores": outcomes,
        "direct_differs": direct_differs,
    }


@check
def damaged(mesh: Any) -> dict[str, Any]:
    """A flipped byte in the member's data (and one in its header): every rank refuses the
    set and nothing live changes; a refused structure or optimizer writes nothing."""
    folder = WORKDIR / f"w{WORLD}"
    source = next((folder / "sets").iterdir())
    outcomes: dict[str, Any] = {}
    for label, offset, inline in (
        ("data", -3, None),
        ("header", 20, None),
        # Members hashed while every rank stages its pieces (as large ones are): the digest
        # is compared after the reads, before the commit.
        ("data streamed", -3, 0),
        ("header streamed", 20, 0),
    ):
        copy = folder / f"damaged-{label.replace(' ', '-')}" / source.name
        if RANK == 0:
            shutil.copytree(source, copy)
            member = copy / "model.safetensors"
            data = bytearray(member.read_bytes())
            data[offset] ^= 0x40
            member.write_bytes(bytes(data))
        dist.barrier()
        fresh, fresh_opt, fresh_sched = objects(mesh, seed=777)
        train(fresh, fresh_opt, 0, 1)  # optimizer state present
        before = local_state(fresh, fresh_opt)
        lr = [g["lr"] for g in fresh_opt.param_groups]
        default = checkpoint_set._INLINE_BYTES
        if inline is not None:
            checkpoint_set._INLINE_BYTES = inline
        try:
            tlckpt.load_checkpoint(copy, model=fresh, optimizer=fresh_opt, scheduler=fresh_sched)
            raised = None
        except tlckpt.CheckpointError as exc:
            raised = type(exc).__name__
        finally:
            checkpoint_set._INLINE_BYTES = default
        outcomes[label] = {
            "raised": raised,
            "unchanged": unchanged(before, local_state(fresh, fresh_opt))
            and lr == [g["lr"] for g in fresh_opt.param_groups],
        }
    refused: dict[str, Any] = {}
    model, opt, _ = objects(mesh, seed=1)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for label, kwargs in (
        ("sgd", {"model": model, "optimizer": sgd}),
        ("sequence", {"model": [model], "optimizer": [opt]}),
    ):
        other = tlckpt.CheckpointManager(folder / f"refused-{label}")
        try:
            other.save(K, **kwargs)
            refused[label] = "accepted"
        except tlckpt.CheckpointError as exc:
            refused[label] = str(exc)
        refused[label + "_steps"] = other.steps()
    dist.barrier()
    return {"outcomes": outcomes, "refused": refused}


def main() -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    mesh = init_device_mesh("cpu", (WORLD,))
    try:
        run_checks(("resume", "damaged"), CHECKS, mesh, WORKDIR / f"st-r{RANK}.json")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
