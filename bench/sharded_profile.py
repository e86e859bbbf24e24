"""Where a sharded save's time goes: tlckpt's phases against DCP's, on the same FSDP2 state.

Run from the repository root (gloo groups on this machine)::

    nice -n 10 .venv/bin/python -m bench.sharded_profile [--world 2] [--size 256] [--reps 3]

Every rank builds ``--size`` MiB of float32 ``Linear(1024, 1024)`` weights, each its own FSDP2
group, and an AdamW that took one step; then, in turns, saves the model and its optimizer with
the file functions (parallel path), as a checkpoint set (``CheckpointManager.save``), and with
``torch.distributed.checkpoint`` (``dcp.save`` of ``get_state_dict``), ``os.sync()`` and a
barrier before each. tlckpt's phases are timed on each rank by wrapping the functions that
do them (the probe that picks the path, the shared verdicts, creating and sizing the file,
the ranks' ``pwrite`` s, their ``fsync`` s, the commit, a set's digests and manifest); DCP is
timed whole (and its ``get_state_dict``). Prints, per method, the median of the slowest
rank's wall time and each phase's median on rank 0 and rank 1.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from tlckpt.testing.processes import free_port, rank_env

WIDTH = 1024
MIB = 1 << 20

#: (module, attribute, phase): the functions whose time is a phase. A function imported by
#: name into several modules is wrapped in each.
PHASES = [
    ("tlckpt.runtime.placement.io_choice", "choose", "probe (path choice)"),
    ("tlckpt.runtime.placement.positional", "_create", "create + size + headers"),
    ("tlckpt.runtime.placement.positional", "_write_piece", "pwrite own pieces"),
    ("tlckpt.runtime.placement.positional", "_fsync", "fsync (ranks > 0)"),
    ("tlckpt.runtime.placement.positional", "_commit", "commit (fsync, rename)"),
    ("tlckpt.runtime.placement.collectives.verdicts", "share_verdict", "verdicts"),
    ("tlckpt.runtime.placement.collectives.stream", "writer_runs", "stream via rank 0"),
    ("tlckpt.codec.sets.set_commit", "SetWriter.__enter__", "set: clean + temporary folder"),
    ("tlckpt.codec.sets.set_commit", "SetWriter.adopt", "set: read back + digest"),
    ("tlckpt.codec.sets.set_commit", "SetWriter.member", "set: training state member"),
    ("tlckpt.codec.sets.set_commit", "SetWriter.commit", "set: manifest + rename"),
    ("tlckpt.runtime.sets.checkpoint_manager", "CheckpointManager._retain", "set: retention"),
    ("tlckpt.runtime.sets.training_state", "capture", "set: training state capture"),
]


def _wrap(phases: dict[str, float], label: str, fn: Callable) -> Callable:
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            phases[label] += time.perf_counter() - start

    timed.__wrapped__ = fn  # type: ignore[attr-defined]
    return timed


def _instrument(phases: dict[str, float]) -> None:
    import importlib

    for module_name, attribute, label in PHASES:
        module = importlib.import_module(module_name)
        if "." in attribute:
            cls_name, method = attribute.split(".")
            cls = getattr(module, cls_name)
            setattr(cls, method, _wrap(phases, label, getattr(cls, method)))
            continue
        original = getattr(module, attribute)
        timed = _wrap(phases, label, original)
        for other in list(sys.modules.values()):
            name = getattr(other, "__name__", "")
            if name.startswith("tlckpt.") and getattr(other, attribute, None) is original:
                setattr(other, attribute, timed)


def _worker(folder: Path, size_mib: int, reps: int, out: Path) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.device_mesh import init_device_mesh

    import tlckpt
    from tlckpt.runtime import save_module_state, save_optimizer
    from tlckpt.testing.models import sharded_linears

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=600))
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    model, opt = sharded_linears(mesh, WIDTH, max(1, size_mib * MIB // (WIDTH * WIDTH * 4)))
    phases: dict[str, float] = defaultdict(float)
    _instrument(phases)
    manager = tlckpt.CheckpointManager(folder / "sets", keep_last=1)  # retention timed apart
    step = [0]

    def files() -> None:
        save_module_state(model, folder / "model.tlsf32")
        save_optimizer(opt, model, folder / "opt.tladam")

    def checkpoint_set() -> None:
        step[0] += 1
        manager.save(step[0], model=model, optimizer=opt)

    def dcp_save() -> None:
        start = time.perf_counter()
        model_state, optim_state = get_state_dict(model, opt)
        phases["get_state_dict"] += time.perf_counter() - start
        target = folder / "dcp"
        dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=target)

    methods = {"tlckpt files": files, "tlckpt set": checkpoint_set, "dcp": dcp_save}
    rows: list[dict[str, Any]] = []
    for rep in range(reps + 1):  # the first round is untimed
        for name, run in methods.items():
            if rank == 0:
                shutil.rmtree(folder / "dcp", ignore_errors=True)
                os.sync()
            dist.barrier()
            phases.clear()
            start = time.perf_counter()
            run()
            mine = time.perf_counter() - start
            dist.barrier()
            wall = time.perf_counter() - start
            if rep:
                rows.append({"method": name, "wall": wall, "mine": mine, "phases": dict(phases)})
    (out / f"profile-r{rank}.json").write_text(json.dumps(rows))
    dist.destroy_process_group()


def _table(world: int, size: int, ranks: list[list[dict[str, Any]]]) -> str:
    lines = [f"world {world}, {size} MiB of parameters + AdamW (medians):", ""]
    methods = list(dict.fromkeys(row["method"] for row in ranks[0]))
    for method in methods:
        walls = [r["wall"] for r in ranks[0] if r["method"] == method]
        lines.append(f"* {method}: {statistics.median(walls):.3f} s (slowest rank, wall)")
        labels = sorted({k for rows in ranks for r in rows for k in r["phases"]})
        for label in labels:
            cells = []
            for rank, rows in enumerate(ranks):
                values = [r["phases"].get(label, 0.0) for r in rows if r["method"] == method]
                mine = [r["mine"] for r in rows if r["method"] == method]
                if any(values):
                    cells.append(
                        f"rank {rank} {statistics.median(values):.3f}"
                        f" of {statistics.median(mine):.3f}"
                    )
            if cells:
                lines.append(f"  * {label}: " + ", ".join(cells))
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        folder, size, reps, out = sys.argv[2:6]
        _worker(Path(folder), int(size), int(reps), Path(out))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--size", type=int, default=256, help="MiB of parameters")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--tmp", default=None, help="parent of the scratch folder")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.tmp) as scratch:
        folder = Path(scratch)
        port = free_port()
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "bench.sharded_profile", "--worker", scratch,
                 str(args.size), str(args.reps), scratch],
                env=rank_env(rank, args.world, port),
            )
            for rank in range(args.world)
        ]  # fmt: skip
        if any(p.wait() for p in procs):
            raise SystemExit("the workers failed")
        ranks = [json.loads((folder / f"profile-r{r}.json").read_text()) for r in range(args.world)]
    print(_table(args.world, args.size, ranks))


if __name__ == "__main__":
    main()
