"""Failure checks of a sharded test group's rank (see ``sharded_worker.py``): corrupted files,
failures on one rank only, and failing saves raise on every rank and change nothing."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))


from worker_common import (
    MINE,
    RANK,
    WORLD,
    check,
    local_state,
    route,
    unchanged,
)

from tlckpt.runtime import (
    load_module_state,
    load_optimizer,
    load_state_bits,
    save_module_state,
    save_optimizer,
)
from tlckpt.runtime.placement.collectives import scatter


def attempt(action: Callable[[], Any]) -> dict[str, Any]:
    try:
        action()
    except Exception as exc:
        return {"raised": type(exc).__name__, "message": str(exc)}
    return {"raised": None, "message": ""}


def corruptions(folder: Path, out: Path) -> dict[str, tuple[str, Path]]:
    """Damaged copies of this world's files: name → (which loader, path)."""
    out.mkdir(exist_ok=True)
    model = (folder / "model.tlsf32").read_bytes()
    opt = (folder / "opt.tladam").read_bytes()
    state = (folder / "state.json").read_bytes()
    shape = bytearray(model)
    shape[31] += 1  # first tensor's first dim
    # head.weight (tied to emb.weight) is the last tensor but one; head.bias (7 floats, after
    # a 24-byte header) is last: flip a bit of head.weight's last value.
    tie = bytearray(model)
    tie[len(model) - 7 * 4 - 24 - 4] ^= 0x01
    flip_beta = bytearray(opt)
    flip_beta[15 + 8] ^= 0x01  # beta1's lowest mantissa bit (v4: kind at 15, betas at 23)
    variants = {
        "model_truncated": ("model", model[:-3]),
        "model_trailing": ("model", model + b"\0"),
        "model_shape": ("model", bytes(shape)),
        "model_foreign": ("model", b"NOTTLSF" + model[7:]),
        "model_tie_conflict": ("model", bytes(tie)),
        "opt_truncated": ("opt", opt[: len(opt) // 2]),
        "opt_config_bit": ("opt", bytes(flip_beta)),
        "opt_trailing": ("opt", opt + b"\0\0"),
        "opt_version": ("opt", opt[:7] + (9).to_bytes(8, "little") + opt[15:]),
        "bits_truncated": ("bits", state[:-10]),
        "bits_tag": ("bits", state.replace(b"float32_bits", b"float64_bits", 1)),
    }
    made = {}
    for name, (kind, data) in variants.items():
        path = out / name
        if RANK == 0:
            path.write_bytes(data)
        made[name] = (kind, path)
    made["model_missing"] = ("model", out / "does-not-exist")
    made["opt_counter_not_asked_for"] = ("opt_no_restore", folder / "opt.tladam")
    dist.barrier()
    return made


@check
def corrupted_files(ctx: dict[str, Any]) -> dict[str, Any]:
    """Each damaged file: every rank raises the same error; nothing changes anywhere."""
    model, opt = ctx["trained"]
    out = {}
    for name, (kind, path) in corruptions(MINE, MINE / "bad").items():
        before = local_state(model, opt)
        if kind == "model":
            result = attempt(lambda p=path: load_module_state(model, p))
        elif kind == "bits":
            result = attempt(lambda p=path: load_state_bits(model, p))
        elif kind == "opt_no_restore":  # a sound file with a counter nobody asked for
            result = attempt(lambda p=path: load_optimizer(opt, model, p))
        else:
            result = attempt(lambda p=path: load_optimizer(opt, model, p))
        result["unchanged"] = unchanged(before, local_state(model, opt))
        out[name] = result
    return out


@check
def rank_local_failures(ctx: dict[str, Any]) -> dict[str, Any]:
    """A failure on the last rank alone (while its shards are being built; or a model that
    differs from the others') makes every rank raise, and nothing changes anywhere."""
    model, opt = ctx["trained"]
    out = {}
    real = scatter._part_of
    calls = {"n": 0}

    def failing_part(full: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        calls["n"] += 1
        if RANK == WORLD - 1 and calls["n"] == 3:
            raise MemoryError("injected: no memory for this shard")
        return real(full, like)

    for name, action in [
        ("model", lambda: load_module_state(model, MINE / "model.tlsf32")),
        (
            "optimizer",
            lambda: load_optimizer(opt, model, MINE / "opt.tladam", restore_random_counter=True),
        ),
        ("bits", lambda: load_state_bits(model, MINE / "state.json")),
    ]:
        calls["n"] = 0
        scatter._part_of = failing_part
        try:
            before = local_state(model, opt)
            with route("rank0"):  # the scatter's path (worker_paths: the parallel one's)
                result = attempt(action)
            result["unchanged"] = unchanged(before, local_state(model, opt))
        finally:
            scatter._part_of = real
        out[f"injected_{name}"] = result

    # The last rank passes one tensor fewer: the ranks' layouts differ.
    tensors = list(model.state_dict(keep_vars=True).values())
    mine = tensors[:-1] if RANK == WORLD - 1 else tensors
    before = local_state(model, opt)
    result = attempt(lambda: load_module_state(mine, MINE / "model.tlsf32"))
    result["unchanged"] = unchanged(before, local_state(model, opt))
    out["different_layout"] = result
    return out


@check
def save_failures(ctx: dict[str, Any]) -> dict[str, Any]:
    """Saving: a refusal or a file-system error on rank 0 is raised on every rank."""
    model, opt = ctx["trained"]
    out = {
        "missing_directory": attempt(
            lambda: save_module_state(model, MINE / "no" / "such" / "dir.tlsf32")
        ),
        "optimizer_missing_directory": attempt(
            lambda: save_optimizer(opt, model, MINE / "no" / "such" / "dir.tladam")
        ),
    }
    amsgrad = torch.optim.AdamW(model.parameters(), amsgrad=True)
    out["amsgrad"] = attempt(
        lambda: save_optimizer(amsgrad, model, MINE / "never.tladam", require_torchlean=True)
    )
    out["nothing_written"] = not (MINE / "never.tladam").exists()
    return out
