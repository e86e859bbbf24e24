"""The two paths of a sharded call, checked on each rank of a test group (see
``sharded_worker.py``): parallel (every rank its own bytes of the file; chosen by the probe,
or forced) and through rank 0 (forced): byte identity, exact loads, resharding from the files
of the other worlds, the probe's verdict, placements, and a failure injected on any one rank
at each phase of a parallel save or load."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sharded_support import K, differences, plain_copy, snapshot
from worker_common import (
    RANK,
    WORKDIR,
    WORLD,
    check,
    local_state,
    on_writer,
    route,
    sharded_model,
    unchanged,
)
from worker_failures import attempt

from tlckpt.runtime import load_module_state, save_module_state
from tlckpt.runtime.binding.dtensors import local_tensor
from tlckpt.runtime.placement.sharded_io import last_sharded_io
from tlckpt.testing.models import TiedNet, train


def state_only(snap: dict[str, Any]) -> dict[str, Any]:
    return {"state": snap["state"], "optimizer": {}}


def saved_state(folder: Path) -> dict[str, Any]:
    return state_only(torch.load(folder / "saved.pt", weights_only=True))


def fresh_model(mesh: Any, seed: int) -> TiedNet:
    return sharded_model(mesh, seed)[0]


def model_state(model: TiedNet) -> dict[str, Any]:
    """The full state of a sharded model (a collective)."""
    return state_only(snapshot(model, torch.optim.SGD(model.parameters())))


def leftovers(folder: Path) -> list[str]:
    """Temporaries and probe files in ``folder`` (once every rank is done with it)."""
    from tlckpt.codec.fileio.atomic import is_temporary

    dist.barrier()
    return [n for n in os.listdir(folder) if is_temporary(n) or n.startswith(".tlckpt-probe-")]


@check
def both_paths(ctx: dict[str, Any]) -> dict[str, Any]:
    """The parallel path (chosen by the probe, or forced) and the streaming path (forced):
    each file equals a single process's; each loads back into fresh shards; the files of
    every world present (1, 2, 3) load by both paths; a rank that cannot see rank 0's probe
    (or sees another file) sends the call through rank 0; a bad setting is refused."""
    import tlckpt.runtime.placement.io_choice as io_choice

    mesh = ctx["mesh"]
    folder = WORKDIR / f"paths-w{WORLD}"
    on_writer(lambda: folder.mkdir(exist_ok=True))
    dist.barrier()
    model, opt = sharded_model(mesh, seed=0)
    train(model, opt, 0, K)
    saved = model_state(model)
    everything = snapshot(model, opt)
    on_writer(lambda: save_module_state(plain_copy(everything)[0], folder / "plain"))
    dist.barrier()
    routes: dict[str, Any] = {}
    identical: dict[str, bool] = {}
    loaded: dict[str, list[str]] = {}
    for mode in [None, "rank0", "parallel"]:
        key = mode or "auto"
        with route(mode):
            save_module_state(model, folder / f"{key}.tlsf32")
            routes[f"save {key}"] = last_sharded_io().route
            fresh = fresh_model(mesh, seed=7)
            load_module_state(fresh, folder / f"{key}.tlsf32")
            routes[f"load {key}"] = last_sharded_io().route
        loaded[key] = differences(model_state(fresh), saved)
        identical[key] = (folder / f"{key}.tlsf32").read_bytes() == (folder / "plain").read_bytes()
    foreign: dict[str, Any] = {}
    for world in (1, 2, 3):
        source = WORKDIR / f"w{world}"
        if world == WORLD or not (source / "saved.pt").exists():
            continue
        expected = saved_state(source)
        for mode in ["auto", "rank0"]:
            with route(None if mode == "auto" else mode):
                fresh = fresh_model(mesh, seed=11)
                load_module_state(fresh, source / "model.tlsf32")
                taken = last_sharded_io().route
            foreign[f"{world}->{WORLD} {mode}"] = {
                "route": taken,
                "differences": differences(model_state(fresh), expected),
            }
    # A rank that does not see rank 0's probe file, or sees another file at the path.
    seen, fingerprinted = io_choice._sees, io_choice._fingerprint
    if RANK == WORLD - 1:
        io_choice._sees = lambda probe, token: False
        io_choice._fingerprint = lambda path: b"another file" if WORLD > 1 else b""
    try:
        save_module_state(model, folder / "blind.tlsf32")
        blind_save = last_sharded_io()
        fresh = fresh_model(mesh, seed=13)
        load_module_state(fresh, folder / "blind.tlsf32")
        blind_load = last_sharded_io()
    finally:
        io_choice._sees, io_choice._fingerprint = seen, fingerprinted
    identical["blind"] = (folder / "blind.tlsf32").read_bytes() == (folder / "plain").read_bytes()
    loaded["blind"] = differences(model_state(fresh), saved)
    with route("sideways"):
        bad_setting = attempt(lambda: save_module_state(model, folder / "never.tlsf32"))
    # A placement the parallel path does not write (Partial: a sum the save reduces).
    from torch.distributed.tensor import Partial

    partial = DTensor.from_local(torch.ones(3), mesh, [Partial()], run_check=False)
    save_module_state([partial], folder / "partial.tlsf32")
    partial_save = last_sharded_io()
    on_writer(lambda: save_module_state([torch.full((3,), float(WORLD))], folder / "summed"))
    dist.barrier()
    return {
        "partial": [
            partial_save.route,
            partial_save.reason,
            (folder / "partial.tlsf32").read_bytes() == (folder / "summed").read_bytes(),
        ],
        "placements": placements_by_both_paths(mesh, folder),
        "routes": routes,
        "identical": identical,
        "loaded": loaded,
        "foreign": foreign,
        "blind": [blind_save.route, blind_save.reason, blind_load.route, blind_load.reason],
        "bad_setting": bad_setting,
        "never_written": not (folder / "never.tlsf32").exists(),
        "leftovers": leftovers(folder),
    }


def placements_by_both_paths(mesh: Any, folder: Path) -> dict[str, Any]:
    """DTensors placed ``Shard(0)`` (uneven), ``Shard(1)``, ``Shard(2)``, ``Replicate()``
    next to a plain tensor, as TLSF32B by both paths: the single process's bytes, and each
    rank's shards exact after a load."""
    g = torch.Generator().manual_seed(21)
    shapes = [(5, 3), (3, 7), (2, 5, 3), (2, 3, 5), (4,)]
    layouts = [[Shard(0)], [Shard(1)], [Shard(1)], [Shard(2)], [Replicate()]]
    values = [torch.randn(shape, generator=g) for shape in shapes]

    def build(full_values: list[torch.Tensor]) -> list[torch.Tensor]:
        made = [
            distribute_tensor(v, mesh, p, src_data_rank=None) for v, p in zip(full_values, layouts)
        ]
        return [*made, torch.arange(3.0)]

    on_writer(lambda: save_module_state([*values, torch.arange(3.0)], folder / "placed-plain"))
    dist.barrier()
    out = {}
    for mode in ["auto", "rank0"]:
        path = folder / f"placed-{mode}.tlsf32"
        with route(None if mode == "auto" else mode):
            save_module_state(build(values), path)
            saved_by = last_sharded_io().route
            fresh = build([torch.zeros_like(v) for v in values])
            load_module_state(fresh, path)
            loaded_by = last_sharded_io().route
        expected = build(values)
        out[mode] = {
            "routes": [saved_by, loaded_by],
            "identical": path.read_bytes() == (folder / "placed-plain").read_bytes(),
            "loaded": all(
                torch.equal(local_tensor(a), local_tensor(b)) for a, b in zip(fresh, expected)
            ),
        }
    return out


def _os_error(what: str) -> OSError:
    import errno

    return OSError(errno.EIO, f"injected: {what} failed")


def _fail_on(calls: int, what: str, real: Callable[..., Any]) -> Callable[..., Any]:
    """``real``, except that call number ``calls`` raises an injected ``OSError``."""
    count = {"n": 0}

    def failing(*args: Any, **kwargs: Any) -> Any:
        count["n"] += 1
        if count["n"] == calls:
            raise _os_error(what)
        return real(*args, **kwargs)

    return failing


@contextlib.contextmanager
def injected(module: Any, name: str, victim: int, calls: int, what: str) -> Iterator[None]:
    """On rank ``victim``, ``module.name`` fails at call number ``calls``."""
    real = getattr(module, name)
    if victim == RANK:
        setattr(module, name, _fail_on(calls, what, real))
    try:
        yield
    finally:
        setattr(module, name, real)


@check
def injected_failures(ctx: dict[str, Any]) -> dict[str, Any]:
    """Parallel saves and loads with one rank failing at each phase: every rank raises the
    same error, the previous file is intact, no temporary is left, nothing live changes."""
    import tlckpt.codec.fileio.atomic as atomic
    import tlckpt.runtime.ops.float32_files as float32_files
    import tlckpt.runtime.placement.positional as positional

    mesh = ctx["mesh"]
    folder = WORKDIR / f"failures-w{WORLD}"
    on_writer(lambda: folder.mkdir(exist_ok=True))
    dist.barrier()
    model, opt = sharded_model(mesh, seed=0)
    train(model, opt, 0, 1)
    target = folder / "model.tlsf32"
    save_module_state(model, target)
    previous = target.read_bytes()
    train(model, opt, 1, 2)  # the model differs from the file now
    phases: list[tuple[str, Any, str, int, int]] = [
        ("create", positional, "_create", 0, 1),
        ("headers", positional, "_pwrite", 0, 1),  # rank 0's first positional write
        ("fsync", atomic.os, "fsync", 0, 1),  # rank 0's fsync is the commit's first step
        ("rename", atomic.os, "replace", 0, 1),
    ]
    for victim in range(WORLD):
        phases.append((f"pwrite rank {victim}", positional, "_write_piece", victim, 1))
        if victim:
            phases.append((f"fsync rank {victim}", positional, "_fsync", victim, 1))
    saves = {}
    for label, module, name, victim, calls in phases:
        with route("parallel"), injected(module, name, victim, calls, label):
            result = attempt(lambda: save_module_state(model, target))
        result["route"] = last_sharded_io().route
        result["previous_intact"] = target.read_bytes() == previous
        result["leftovers"] = leftovers(folder)
        saves[label] = result
    loads = {}
    load_phases: list[tuple[str, Any, str, int, int]] = []
    for victim in range(WORLD):
        load_phases.append(
            (f"validate rank {victim}", float32_files, "validate_float32_state", victim, 1)
        )
        load_phases.append((f"pread rank {victim}", positional, "_preadv", victim, 3))
    for label, module, name, victim, calls in load_phases:
        before = local_state(model, opt)
        with route("parallel"), injected(module, name, victim, calls, label):
            result = attempt(lambda: load_module_state(model, target))
        result["route"] = last_sharded_io().route
        result["unchanged"] = unchanged(before, local_state(model, opt))
        loads[label] = result
    return {"saves": saves, "loads": loads}
