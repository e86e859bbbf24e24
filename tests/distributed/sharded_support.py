"""Helpers shared by the sharded-checkpoint tests, their worker processes and the memory script.

The model is :class:`tlckpt.testing.models.TiedNet` (tied embedding/output weights, a frozen layer,
BatchNorm buffers), sharded with FSDP2 ``fully_shard``: ``mix`` in a group of its own, the
rest (the tied pair and the frozen layer included) in the root's. Its dims (7 and 4 rows)
shard unevenly over 2 and 3 ranks, and some ranks hold empty shards.

Every rank trains on the same batches, so the buffers (which FSDP2 leaves unsharded) stay
equal on all ranks and runs in different world sizes can be compared.
"""

from __future__ import annotations

import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import orjson
import torch

from tlckpt.testing.bitwise import same
from tlckpt.testing.models import TiedNet, make_adam
from tlckpt.testing.processes import free_port, rank_env

HERE = Path(__file__).resolve().parent

#: The checks each world size runs, in order (see ``sharded_worker.py``).
CHECKS_OF_WORLD = {
    2: [
        "sharded_run",
        "resume_same_world",
        "single_process_file_into_shards",
        "corrupted_files",
        "rank_local_failures",
        "save_failures",
        "own_family_groups",
        "exact_bits_dtypes",
        "hsdp_meshes",
        "checkpoint_sets",
        "signed_checkpoint_sets",
        "memory",
    ],
    3: [
        "sharded_run",
        "resume_same_world",
        "single_process_file_into_shards",
        "other_world_into_shards",
        "corrupted_files",
        "rank_local_failures",
        "save_failures",
        "own_family_groups",
        "distribute_tensor_float64",
        "both_paths",
        "injected_failures",
    ],
}

__all__ = [
    "CHECKS_OF_WORLD",
    "K",
    "N",
    "full",
    "snapshot",
    "differences",
    "max_difference",
    "plain_copy",
    "local_slice",
    "launch",
    "LATER",
]

#: Training steps before the checkpoint, and after it.
K, N = 3, 3

#: Groups started after those (label → world size, checks): they read the files of every
#: world before them (3 → 2, 2 → 1 and 3 → 1 through a one-rank group) by both paths.
LATER = {
    "2 after 3": (2, ["both_paths", "injected_failures"]),
    "1 rank": (1, ["both_paths", "injected_failures"]),
}


def full(t: torch.Tensor) -> torch.Tensor:
    """The full value of a tensor (a collective for a DTensor: every rank must call it)."""
    from torch.distributed.tensor import DTensor

    with torch.no_grad():
        value = t.full_tensor() if isinstance(t, DTensor) else t.detach()
    return value.clone()


def snapshot(model: torch.nn.Module, opt: torch.optim.Optimizer) -> dict[str, Any]:
    """Full values of a (sharded or plain) model's state and its optimizer's, by name.

    Collective when the model is sharded (every rank calls it, in the same order).
    """
    state = {name: full(t) for name, t in model.state_dict(keep_vars=True).items()}
    names = {id(p): n for n, p in model.named_parameters()}
    moments: dict[str, dict[str, torch.Tensor]] = {}
    for group in opt.param_groups:
        for p in group["params"]:
            entry = opt.state.get(p)
            if entry:
                moments[names[id(p)]] = {k: full(v) for k, v in entry.items()}
    return {"state": state, "optimizer": moments}


def differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """Where two snapshots differ in any bit (state tensors, optimizer tensors, steps)."""
    out = [n for n in a["state"] if n not in b["state"] or not same(a["state"][n], b["state"][n])]
    out += [n for n in b["state"] if n not in a["state"]]
    if sorted(a["optimizer"]) != sorted(b["optimizer"]):
        out.append(f"optimizer keys {sorted(a['optimizer'])} vs {sorted(b['optimizer'])}")
        return out
    for name, entry in a["optimizer"].items():
        other = b["optimizer"][name]
        for key, value in entry.items():
            if key not in other or not same(value, other[key]):
                out.append(f"optimizer {name}.{key}")
    return out


def max_difference(a: dict[str, Any], b: dict[str, Any]) -> float:
    """The largest absolute difference between two snapshots' floating tensors."""
    worst = 0.0
    pairs = [(a["state"][n], b["state"][n]) for n in a["state"]]
    for name, entry in a["optimizer"].items():
        pairs += [(v, b["optimizer"][name][k]) for k, v in entry.items()]
    for x, y in pairs:
        if x.is_floating_point() and x.numel():
            worst = max(worst, float((x.double() - y.double()).abs().max()))
    return worst


def plain_copy(snap: dict[str, Any]) -> tuple[TiedNet, torch.optim.Optimizer]:
    """A single-process model and AdamW holding a snapshot's full values."""
    torch.manual_seed(4321)
    model = TiedNet()
    model.load_state_dict(snap["state"])
    opt = make_adam("adamw", model.parameters())
    params = dict(model.named_parameters())
    for name, entry in snap["optimizer"].items():
        opt.state[params[name]] = {k: v.clone() for k, v in entry.items()}
    return model, opt


def local_slice(value: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """Rank ``rank``'s part of ``value`` under ``Shard(0)`` (``torch.chunk`` rows; empty
    for a rank past the last chunk), computed without DTensor."""
    chunks = torch.chunk(value, world, dim=0)
    return chunks[rank] if rank < len(chunks) else value[0:0]


def launch(
    world: int,
    workdir: Path,
    checks: list[str],
    timeout: float = 240.0,
    script: Path | None = None,
    cwd: Path | None = None,
    extra_env: dict[str, str] | None = None,
) -> tuple[list[dict[str, Any]], float, str]:
    """Run ``sharded_worker.py`` on ``world`` ranks (gloo, 127.0.0.1, a free port), as
    ``torchrun`` would start them, and collect each rank's results.

    ``script`` runs another program the same way instead (``cwd`` its folder, ``extra_env``
    added to its environment; its results are its exit codes, as ``{"exit": code}``).

    Returns:
        One result mapping per rank (check name → result), the wall time, and the ranks'
        combined output (for failure messages).
    """
    port = free_port()
    for rank in range(world):  # an earlier group's results in this world size are not ours
        (workdir / f"results-w{world}-r{rank}.json").unlink(missing_ok=True)
    logs = []
    procs = []
    start = time.perf_counter()
    for rank in range(world):
        env = {**rank_env(rank, world, port), **(extra_env or {})}
        log = open(workdir / f"log-w{world}-r{rank}.txt", "w+b")  # noqa: SIM115
        logs.append(log)
        procs.append(
            subprocess.Popen(
                [sys.executable, str(script)]
                if script is not None
                else [sys.executable, str(HERE / "sharded_worker.py"), str(workdir), *checks],
                env=env,
                cwd=cwd,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
    deadline = start + timeout
    try:
        for p in procs:
            p.wait(timeout=max(1.0, deadline - time.perf_counter()))
    except subprocess.TimeoutExpired:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for p in procs:
            p.wait()
    elapsed = time.perf_counter() - start
    output = []
    for rank, log in enumerate(logs):
        log.seek(0)
        text = log.read().decode(errors="replace")
        log.close()
        output.append(f"--- rank {rank} (exit {procs[rank].returncode}) ---\n{text[-6000:]}")
    if script is not None:
        return [{"exit": p.returncode} for p in procs], elapsed, "\n".join(output)
    results = []
    for rank in range(world):
        path = workdir / f"results-w{world}-r{rank}.json"
        results.append(orjson.loads(path.read_bytes()) if path.exists() else {})
    return results, elapsed, "\n".join(output)


def run_checks(
    names: Iterable[str], checks: Mapping[str, Callable[[Any], dict]], arg: Any, out: Path
) -> None:
    """A worker's checks, in turn: each named check called with ``arg``; every result so far
    (``ok``, the check's figures, or the traceback of its failure) written to ``out`` as
    JSON after each, so that a rank that dies mid-way leaves what it had done."""
    results: dict[str, Any] = {}
    for name in names:
        try:
            results[name] = {"ok": True, **checks[name](arg)}
        except Exception:  # reported to the test, which fails on it
            results[name] = {"ok": False, "error": traceback.format_exc()}
        out.write_bytes(orjson.dumps(results, default=str))
