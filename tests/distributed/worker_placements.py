"""Placement checks of a sharded test group's rank (see ``sharded_worker.py``):
``distribute_tensor`` and float64, exact bits of dtypes the backend does not carry, 2-D
(HSDP) meshes, and rank 0's memory while saving."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sharded_support import (
    K,
    N,
    differences,
    snapshot,
)
from worker_common import (
    MINE,
    RANK,
    WORKDIR,
    WORLD,
    check,
    on_writer,
    route,
    sharded_model,
)

from tlckpt import runtime
from tlckpt.runtime.binding.dtensors import local_tensor
from tlckpt.runtime.placement.sharded_io import last_sharded_io
from tlckpt.testing.models import train


@check
def distribute_tensor_float64(ctx: dict[str, Any]) -> dict[str, Any]:
    """DTensors made by ``distribute_tensor`` (Shard(0), Shard(1), Replicate; a tied repeat;
    a frozen one), float64: exact-bits JSON and an Adam v5 file, equal to a single
    process's, and loaded back."""
    mesh = ctx["mesh"]
    g = torch.Generator().manual_seed(5)

    def values() -> list[torch.Tensor]:
        return [
            torch.randn(shape, generator=g, dtype=torch.float64)
            for shape in [(5, 3), (3, 7), (4,), (2, 2)]
        ]

    def build(full_values: list[torch.Tensor]) -> list[torch.Tensor]:
        placements = [[Shard(0)], [Shard(1)], [Replicate()], [Shard(0)]]
        made = []
        for value, placement in zip(full_values, placements):
            made.append(torch.nn.Parameter(distribute_tensor(value, mesh, placement)))
        made[3].requires_grad_(False)
        return [made[0], made[1], made[0], made[2], made[3]]  # slot 2 is tied to slot 0

    full_values = values()
    params = build(full_values)
    opt = torch.optim.AdamW([params[0], params[1], params[3]], lr=0.1, weight_decay=0.01)
    grads = values()
    for step in range(2):
        for p, grad in zip([params[0], params[1], params[3]], grads[:3]):
            p.grad = distribute_tensor(grad * (step + 1), mesh, p.placements)
        opt.step()
    folder = MINE / "dt64"
    on_writer(lambda: folder.mkdir(exist_ok=True))
    dist.barrier()
    runtime.save_state_bits(params, folder / "state.json")
    version = runtime.save_optimizer(opt, params, folder / "opt.tladam")
    gathered = [p.full_tensor().detach() for p in params]
    moments = {
        i: {
            k: (v.full_tensor() if isinstance(v, DTensor) else v).clone()
            for k, v in opt.state[params[i]].items()
        }
        for i in (0, 1, 3)
    }
    identical = {}

    def single_process() -> None:
        plain = [torch.nn.Parameter(t.clone()) for t in gathered[:2]] + [None, None, None]
        plain[2] = plain[0]
        plain[3] = torch.nn.Parameter(gathered[3].clone())
        plain[4] = torch.nn.Parameter(gathered[4].clone(), requires_grad=False)
        plain_opt = torch.optim.AdamW([plain[0], plain[1], plain[3]], lr=0.1, weight_decay=0.01)
        for i in (0, 1, 3):
            plain_opt.state[plain[i]] = {k: v.clone() for k, v in moments[i].items()}
        runtime.save_state_bits(plain, folder / "plain.json")
        plain_version = runtime.save_optimizer(plain_opt, plain, folder / "plain.tladam")
        identical["state.json"] = (folder / "state.json").read_bytes() == (
            folder / "plain.json"
        ).read_bytes()
        identical["opt.tladam"] = (
            plain_version == version
            and (folder / "opt.tladam").read_bytes() == (folder / "plain.tladam").read_bytes()
        )

    on_writer(single_process)
    fresh = build([torch.zeros_like(t) for t in full_values])
    fresh_opt = torch.optim.AdamW([fresh[0], fresh[1], fresh[3]], lr=0.1, weight_decay=0.01)
    runtime.load_state_bits(fresh, folder / "state.json")
    runtime.load_optimizer(fresh_opt, fresh, folder / "opt.tladam")
    loaded_equal = all(torch.equal(a.full_tensor(), b) for a, b in zip(fresh, gathered))
    moments_equal = all(
        torch.equal(fresh_opt.state[fresh[i]][k].full_tensor(), moments[i][k])
        if k != "step"
        else torch.equal(fresh_opt.state[fresh[i]][k], moments[i][k])
        for i in (0, 1, 3)
        for k in moments[i]
    )
    placements_kept = all(
        fresh_opt.state[fresh[i]]["exp_avg"].placements == fresh[i].placements for i in (0, 1, 3)
    )
    dist.barrier()
    return {
        "version": version,
        "identical": identical,
        "loaded_equal": loaded_equal,
        "moments_equal": moments_equal,
        "placements_kept": placements_kept,
    }


def word_view(t: torch.Tensor) -> torch.Tensor:
    """The storage words of ``t``, to compare bit for bit in any dtype."""
    if t.dtype == torch.complex32:
        t = t.to(torch.complex64)  # exact; torch compares no complex32
    if t.is_complex():
        t = torch.view_as_real(t)
    return t.view(
        {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    )


@check
def exact_bits_dtypes(ctx: dict[str, Any]) -> dict[str, Any]:
    """Exact-bits JSON of DTensors in every dtype family a backend may not carry as such
    (float8, complex32, bfloat16, complex128), row-sharded, column-sharded and replicated,
    next to a plain integer tensor: the file equals a single process's; it loads back."""
    mesh = ctx["mesh"]
    out = {}
    layouts = [[Shard(0)], [Shard(1)], [Replicate()]]
    for dtype in [
        torch.float8_e4m3fn,
        torch.bfloat16,
        torch.complex32,
        torch.complex128,
    ]:
        g = torch.Generator().manual_seed(11)
        full_values = []
        for shape in [(5, 3), (3, 5), (4,)]:
            real = torch.randn(shape, generator=g, dtype=torch.float64)
            value = torch.complex(real, -real) if dtype.is_complex else real
            full_values.append(value.to(dtype))

        def build(values: list[torch.Tensor]) -> list[torch.Tensor]:
            made = [
                distribute_tensor(v, mesh, p, src_data_rank=None) for v, p in zip(values, layouts)
            ]
            return [*made, torch.arange(3)]

        name = str(dtype).removeprefix("torch.")
        path = MINE / f"bits-{name}.json"
        runtime.save_state_bits(build(full_values), path)
        identical = None
        if RANK == 0:
            runtime.save_state_bits([*full_values, torch.arange(3)], MINE / f"plain-{name}.json")
            identical = path.read_bytes() == (MINE / f"plain-{name}.json").read_bytes()
        fresh = build([torch.zeros_like(v) for v in full_values])
        runtime.load_state_bits(fresh, path)
        # Each rank's shard against DTensor's own split of the expected values (no
        # communication: gloo carries no float8).
        expected = build(full_values)
        loaded = [
            torch.equal(word_view(local_tensor(t)), word_view(local_tensor(want)))
            for t, want in zip(fresh, expected)
        ]
        out[name] = {"identical": identical, "loaded": all(loaded)}
    return out


@check
def hsdp_meshes(ctx: dict[str, Any]) -> dict[str, Any]:
    """FSDP2 over two-dimensional meshes (HSDP: ``(Replicate(), Shard(0))``), both ways
    round, by both paths: save, load into fresh objects, train on; bit for bit with the
    uninterrupted run."""
    out = {}
    for shape, mode in [(s, m) for s in [(WORLD, 1), (1, WORLD)] for m in ["auto", "rank0"]]:
        mesh = init_device_mesh("cpu", shape, mesh_dim_names=("replicate", "shard"))
        model, opt = sharded_model(mesh, seed=0)
        train(model, opt, 0, K)
        folder = MINE / f"hsdp-{shape[0]}x{shape[1]}-{mode}"
        on_writer(lambda f=folder: f.mkdir(exist_ok=True))
        dist.barrier()
        with route(None if mode == "auto" else mode):
            runtime.save_module_state(model, folder / "model.tlsf32")
            routes = [last_sharded_io().route]
            runtime.save_optimizer(opt, model, folder / "opt.tladam")
            routes.append(last_sharded_io().route)
            saved = snapshot(model, opt)
            fresh, fresh_opt = sharded_model(mesh, seed=3)
            runtime.load_module_state(fresh, folder / "model.tlsf32")
            routes.append(last_sharded_io().route)
            runtime.load_optimizer(fresh_opt, fresh, folder / "opt.tladam")
            routes.append(last_sharded_io().route)
        after_load = differences(snapshot(fresh, fresh_opt), saved)
        train(model, opt, K, N)
        train(fresh, fresh_opt, K, N)
        out[f"{shape[0]}x{shape[1]} {mode}"] = {
            "placements": str(model.emb.weight.placements),
            "routes": routes,
            "after_load": after_load,
            "after_training": differences(snapshot(fresh, fresh_opt), snapshot(model, opt)),
        }
    return out


@check
def memory(ctx: dict[str, Any]) -> dict[str, Any]:
    """Rank 0's resident-set peak while saving a model of large parameters."""
    from measure_memory import measure

    return measure(ctx["mesh"], WORKDIR / f"w{WORLD}" / "memory")
