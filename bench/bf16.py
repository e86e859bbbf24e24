"""The ``bf16`` group: a bf16 model in the safetensors layout, standalone and in a set.

Goals of issues #21 and #23 (`bench/goals.py`): a bf16 model of ≥ 100M parameters (full run:
32 x ``Linear(2048, 2048)``, 134M parameters, 256 MiB) saved in a checkpoint set
(``CheckpointManager``, ``model_format="auto"``: a safetensors member) against
``safetensors.torch.save_file`` + fsync, restored (digests verified) against ``load_file`` +
``load_state_dict``, the member's size against the safetensors file's; the same model through
``save_module_state`` / ``load_module_state`` of a ``.safetensors`` file; and the bytes
``open_checkpoint`` reads (``rchar`` of ``/proc/self/io``) before a tensor is asked for.

==================  ==========================================================================
tlckpt set          ``CheckpointManager(dir).save(1, model=m)`` (its folder removed first,
                    untimed); ``CheckpointManager(dir).restore(model=m)``
tlckpt              ``save_module_state(m, "x.safetensors")``; ``load_module_state`` (default)
safetensors         ``save_file(m.state_dict())`` + fsync; ``load_file`` + ``load_state_dict``
==================  ==========================================================================
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch

from bench.measure import Way, fsync_path

__all__ = ["bf16_model", "bf16_ways", "open_bytes", "member_sizes"]

SET_DIR, TL_FILE, ST_FILE = "sets", "state.tl.safetensors", "state.st.safetensors"


def bf16_model(layers: int, width: int) -> torch.nn.Module:
    """``layers`` bf16 ``Linear(width, width)`` without bias (random weights, seeded)."""
    torch.manual_seed(5)
    linears = [torch.nn.Linear(width, width, bias=False) for _ in range(layers)]
    return torch.nn.Sequential(*linears).to(torch.bfloat16)


def bf16_ways(module: torch.nn.Module, folder: str) -> tuple[dict[str, Way], dict[str, Way]]:
    """``(save ways, load ways)`` of the group, files in ``folder``."""
    import safetensors.torch as st

    import tlckpt

    sets, tl, stf = (os.path.join(folder, n) for n in (SET_DIR, TL_FILE, ST_FILE))

    def set_save() -> None:
        tlckpt.CheckpointManager(sets).save(1, model=module)

    def st_save() -> None:
        st.save_file(module.state_dict(), stf)
        fsync_path(stf)

    def unlink(path: str):
        return lambda: os.path.exists(path) and os.unlink(path)

    saves = {
        "tlckpt set": Way(set_save, lambda: shutil.rmtree(sets, ignore_errors=True)),
        "tlckpt": Way(lambda: tlckpt.save_module_state(module, tl), unlink(tl)),
        "safetensors": Way(st_save, unlink(stf)),
    }
    loads = {
        "tlckpt set": Way(lambda: tlckpt.CheckpointManager(sets).restore(model=module)),
        "tlckpt": Way(lambda: tlckpt.load_module_state(module, tl)),
        "safetensors": Way(lambda: module.load_state_dict(st.load_file(stf))),
    }
    return saves, loads


def _rchar() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise OSError("no rchar in /proc/self/io")


def open_bytes(folder: str) -> dict[str, int]:
    """Bytes read (``rchar``) by ``open_checkpoint`` of the saved ``.safetensors`` file and
    the names, shapes and dtypes of every tensor; then by reading one tensor."""
    import tlckpt

    path = os.path.join(folder, TL_FILE)
    with tlckpt.open_checkpoint(path) as f:  # the first call's imports are not counted
        f.tensor(f.names()[0])
    before = _rchar()
    with tlckpt.open_checkpoint(path) as f:
        described = [(n, f.shape(n), f.dtype(n)) for n in f.names()]
        opened = _rchar()
        f.tensor(described[-1][0])
        read = _rchar()
    return {"open_checkpoint": opened - before, "one tensor": read - opened}


def member_sizes(folder: str) -> dict[str, int]:
    """The set's model member, the standalone file and the safetensors file, in bytes."""
    step = sorted(os.listdir(os.path.join(folder, SET_DIR)))[-1]
    member = os.path.join(folder, SET_DIR, step, "model.safetensors")
    return {
        "tlckpt set": os.path.getsize(member),
        "tlckpt": os.path.getsize(os.path.join(folder, TL_FILE)),
        "safetensors": os.path.getsize(os.path.join(folder, ST_FILE)),
    }
