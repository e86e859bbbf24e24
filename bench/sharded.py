"""Sharded checkpoints: tlckpt against ``torch.distributed.checkpoint`` on FSDP2 state.

Run from the repository root (it starts gloo groups on this machine)::

    nice -n 10 .venv/bin/python -m bench.sharded [--worlds 2 3] [--sizes 64 256] [--reps 3]

For each world size and model size (MiB of float32 parameters: ``Linear`` layers of 1024 x
1024, each its own FSDP2 group, trained one AdamW step), every rank saves and loads the model
and its optimizer with

* tlckpt, parallel path (every rank writes and reads its own bytes of ``model.tlsf32`` and
  ``opt.tladam``),
* tlckpt, forced through rank 0 (``TLCKPT_SHARDED_IO=rank0``), the path before this one,
* DCP (``dcp.save`` / ``dcp.load`` of ``get_state_dict(model, optimizer)``, then
  ``set_state_dict``), one file per rank into a fresh folder,
* tlckpt checkpoint sets (``CheckpointManager``; older sets removed untimed, as DCP's
  folder is): a blocking ``save``, the
  call of a background save (``blocking=False``; its writing is waited for untimed before
  the next operation), a background save and its ``wait()``, and ``restore``,

repetitions interleaved, ``os.sync()`` before each operation, a barrier before and after (the
time is the slowest rank's). Rank 0's peak memory growth is its resident set's high-water mark
during the operation minus its resident set just before (``/proc/self/clear_refs``), as
``tests/distributed/measure_memory.py`` measures it. After the last repetition each load way
loads once more into zeroed live state, checked by CRC-32 per shard on every rank. Prints a
Markdown table of medians. ``python -m bench --only sharded`` runs the same workers (worlds 2
and 3, one untimed round first, the allocator users have) as a group of the benchmark, its
ratios to DCP rows of the goals table (:func:`group_result`).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from tlckpt.testing.processes import PeakProbe, current_rss, free_port, rank_env

__all__ = ["METHODS", "WORLDS", "group_result", "main"]

WIDTH = 1024
#: The world sizes of the issue's goal (``python -m bench`` runs both).
WORLDS = (2, 3)
MIB = 1 << 20
#: The ways of each operation, timed in turns. ``set``: ``CheckpointManager.save`` (blocking)
#: and ``restore`` of the model and the optimizer as one checkpoint set (digests, manifest);
#: ``set background``: ``save(blocking=False)``, the call alone (the writing goes on after);
#: ``set background+wait``: the call and its ``wait()``.
METHODS = {
    "save": ["tlckpt", "tlckpt-rank0", "dcp", "set", "set background", "set background+wait"],
    "load": ["tlckpt", "tlckpt-rank0", "dcp", "set"],
}


def _worker(folder: Path, size_mib: int, reps: int, out: Path) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.device_mesh import init_device_mesh

    from bench.ways import checksums
    from tlckpt import CheckpointManager
    from tlckpt.codec.sets.set_commit import remove_set
    from tlckpt.runtime import load_module_state, load_optimizer, save_module_state, save_optimizer
    from tlckpt.runtime.placement.sharded_io import ENV, last_sharded_io
    from tlckpt.testing.models import sharded_linears

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=600))
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    layers = max(1, size_mib * MIB // (WIDTH * WIDTH * 4))
    model, opt = sharded_linears(mesh, WIDTH, layers)

    def tlckpt(operation: str, mode: str | None) -> Any:
        save = operation == "save"
        model_io = save_module_state if save else load_module_state
        optimizer_io = save_optimizer if save else load_optimizer

        def run() -> None:
            if mode:
                os.environ[ENV] = mode
            try:
                model_io(model, folder / "model.tlsf32")
                optimizer_io(opt, model, folder / "opt.tladam")
            finally:
                os.environ.pop(ENV, None)

        return run

    def dcp_save() -> None:
        model_state, optim_state = get_state_dict(model, opt)
        dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=folder / "dcp")

    def dcp_load() -> None:
        model_state, optim_state = get_state_dict(model, opt)
        state = {"model": model_state, "optim": optim_state}
        dcp.load(state, checkpoint_id=folder / "dcp")
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])

    manager = CheckpointManager(folder / "sets")  # older sets removed untimed (as DCP's)
    steps = iter(range(1, 1 << 30))
    pending: list[Any] = []

    def set_save() -> None:
        manager.save(next(steps), model=model, optimizer=opt)

    def set_background() -> None:
        pending.append(manager.save(next(steps), model=model, optimizer=opt, blocking=False))

    def set_background_wait() -> None:
        manager.save(next(steps), model=model, optimizer=opt, blocking=False).wait()

    def set_restore() -> None:
        manager.restore(model=model, optimizer=opt)

    operations = {
        ("save", "set"): set_save,
        ("save", "set background"): set_background,
        ("save", "set background+wait"): set_background_wait,
        ("load", "set"): set_restore,
        ("save", "tlckpt"): tlckpt("save", None),
        ("save", "tlckpt-rank0"): tlckpt("save", "rank0"),
        ("save", "dcp"): dcp_save,
        ("load", "tlckpt"): tlckpt("load", None),
        ("load", "tlckpt-rank0"): tlckpt("load", "rank0"),
        ("load", "dcp"): dcp_load,
    }

    def local_state() -> list[Any]:
        """This rank's shards of the parameters and of every optimizer tensor (anew: a
        load may replace the moments)."""
        tensors = [p for p in model.parameters()]
        tensors += [v for state in opt.state.values() for _, v in sorted(state.items())]
        return [
            t.to_local() if hasattr(t, "to_local") else t for t in tensors if torch.is_tensor(t)
        ]

    def verify(load: Any) -> bool:
        """Whether ``load`` lands the saved values in zeroed live state, on every rank."""
        reference = checksums(local_state())
        with torch.no_grad():
            for t in local_state():
                t.zero_()
        load()
        ok = torch.tensor([int(checksums(local_state()) == reference)])
        dist.all_reduce(ok, op=dist.ReduceOp.MIN)
        return bool(ok.item())

    figures: list[dict[str, Any]] = []
    verified: dict[str, bool] = {}
    probe = PeakProbe()
    routes: dict[str, str] = {}
    for rep in range(reps):
        for operation in ["save", "load"]:
            for method in METHODS[operation]:
                gc.collect()
                if rank == 0:
                    os.sync()
                dist.barrier()
                before = current_rss()
                probe.reset()
                start = time.perf_counter()
                operations[(operation, method)]()
                dist.barrier()
                seconds = time.perf_counter() - start
                growth = probe.peak() - before
                while pending:  # a background save's writing, untimed
                    pending.pop().wait()
                if rank == 0:
                    for old in manager.steps()[:-1]:
                        remove_set(manager.directory, old)
                if method.startswith("tlckpt") or method == "set":
                    record = last_sharded_io()
                    routes[f"{operation} {method}"] = record.route if record else "?"
                figures.append(
                    {
                        "rep": rep,
                        "operation": operation,
                        "method": method,
                        "seconds": seconds,
                        "rank0_growth": growth,
                    }
                )
        if rep == reps - 1:  # every file is still there: check each load way, untimed
            verified = {m: verify(operations[("load", m)]) for m in METHODS["load"]}
        if rank == 0:
            shutil.rmtree(folder / "dcp", ignore_errors=True)  # a fresh folder for each save
        dist.barrier()
    files = {
        "tlckpt": sum((folder / n).stat().st_size for n in ("model.tlsf32", "opt.tladam")),
    }
    if rank == 0:
        params = sum(p.numel() * 4 for p in model.parameters())
        out.write_text(
            json.dumps(
                {
                    "figures": figures,
                    "routes": routes,
                    "params": params,
                    "files": files,
                    "verified": verified,
                }
            )
        )
    dist.destroy_process_group()


def _run(
    world: int, size_mib: int, reps: int, tmp: str | None, default_allocator: bool = False
) -> dict[str, Any]:
    """Every rank's worker process; rank 0's figures. With ``default_allocator`` the ranks
    run with the allocator users have (no ``MALLOC_MMAP_THRESHOLD_``), as ``python -m bench``
    runs every workload."""
    with tempfile.TemporaryDirectory(dir=tmp) as scratch:
        folder = Path(scratch)
        out = folder / "figures.json"
        port = free_port()
        procs = []
        for rank in range(world):
            env = rank_env(rank, world, port)
            if default_allocator:
                env.pop("MALLOC_MMAP_THRESHOLD_", None)
            args = ["--worker", str(folder), str(size_mib), str(reps), str(out)]
            procs.append(subprocess.Popen([sys.executable, "-m", "bench.sharded", *args], env=env))
        codes = [p.wait() for p in procs]
        if any(codes) or not out.exists():
            raise SystemExit(f"world {world}, {size_mib} MiB: the workers failed ({codes})")
        return json.loads(out.read_text())


def group_result(size_mib: int, worlds: tuple[int, ...], reps: int, tmp: str) -> dict[str, Any]:
    """The ``sharded`` group of ``python -m bench``: every world's figures as the other groups
    report theirs.

    Each world runs ``reps + 1`` interleaved repetitions; the first is the untimed round (the
    first call's costs: lazy imports, the arena, gloo's first collectives), as in
    :func:`bench.measure.interleave`. Ways are named ``world <n>: <method>``; ``growth`` holds
    rank 0's peak memory growth (bytes, the largest of the repetitions); ``verified``, for
    each load way, whether it landed the saved values in zeroed live state on every rank.

    Args:
        size_mib: MiB of float32 parameters (``Linear(1024, 1024)`` layers, AdamW moments).
        worlds: the numbers of ranks, one gloo group each.
        reps: the timed repetitions.
        tmp: the parent of each world's scratch folder.

    Returns:
        ``times`` (operation -> way -> seconds), ``growth``, ``verified``, ``routes``,
        ``payload_bytes`` (the model and optimizer files' bytes), ``params_bytes``,
        ``size_mib``, ``worlds``.
    """
    times: dict[str, dict[str, list[float]]] = {op: {} for op in METHODS}
    growth: dict[str, dict[str, int]] = {op: {} for op in METHODS}
    routes: dict[str, dict[str, str]] = {}
    verified: dict[str, bool] = {}
    params = files = 0
    for world in worlds:
        run = _run(world, size_mib, reps + 1, tmp, default_allocator=True)
        for op, methods in METHODS.items():
            for method in methods:
                timed = [
                    f
                    for f in run["figures"]
                    if f["operation"] == op and f["method"] == method and f["rep"] > 0
                ]
                way = f"world {world}: {method}"
                if op == "load":
                    verified[way] = run["verified"][method]
                times[op][way] = [f["seconds"] for f in timed]
                growth[op][way] = max(f["rank0_growth"] for f in timed)
        routes[str(world)] = run["routes"]
        params, files = run["params"], run["files"]["tlckpt"]
    return {
        "times": times,
        "growth": growth,
        "verified": verified,
        "routes": routes,
        "payload_bytes": files,
        "params_bytes": params,
        "size_mib": size_mib,
        "worlds": list(worlds),
    }


def _table(results: list[tuple[int, int, dict[str, Any]]]) -> str:
    lines = [
        "| world | params MiB | operation | way | median s [min-max] | / DCP | rank-0 growth MiB |",
        "|---|---|---|---|---|---|---|",
    ]
    for world, _, run in results:
        for operation, methods in METHODS.items():
            rows_of = {
                method: [
                    f
                    for f in run["figures"]
                    if f["operation"] == operation and f["method"] == method
                ]
                for method in methods
            }
            med = {m: statistics.median(f["seconds"] for f in rows) for m, rows in rows_of.items()}
            for method, rows in rows_of.items():
                seconds = [f["seconds"] for f in rows]
                growth = max(f["rank0_growth"] for f in rows) / MIB
                lines.append(
                    f"| {world} | {run['params'] / MIB:.0f} | {operation} | {method} |"
                    f" {med[method]:.3f} [{min(seconds):.3f}-{max(seconds):.3f}] |"
                    f" {med[method] / med['dcp']:.2f} | {growth:.1f} |"
                )
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        folder, size, reps, out = sys.argv[2:6]
        _worker(Path(folder), int(size), int(reps), Path(out))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worlds", type=int, nargs="+", default=list(WORLDS))
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 256], help="MiB of params")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--tmp", default=None, help="parent of the scratch folders")
    parser.add_argument("--json", default=None, help="also write every figure here")
    args = parser.parse_args()
    results = []
    for world in args.worlds:
        for size in args.sizes:
            run = _run(world, size, args.reps, args.tmp)
            results.append((world, size, run))
            print(f"world {world}, {size} MiB: routes {run['routes']}", flush=True)
            if args.json:
                Path(args.json).write_text(json.dumps(results))
    print(_table(results))


if __name__ == "__main__":
    main()
