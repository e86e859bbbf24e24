"""Every library's save and load of a workload, as :class:`~bench.measure.Way` s.

Model state (``big1``, ``big48``, ``small``, ``gpt2``):

==============  =====================================================================
tlckpt          ``save_module_state``; ``load_module_state``: the default (``default``:
                under a read lease, in place), the default where no lease is granted
                (``staged``) and ``staged=False`` (``in place``)
torch           ``torch.save(state_dict)`` + fsync; ``torch.load(weights_only=True)`` +
                ``load_state_dict``
safetensors     ``save_file`` + fsync; ``load_file`` + ``load_state_dict`` (``save_model``
                / ``load_model`` for a model with tied weights, which ``save_file`` refuses)
raw             ``write`` of each tensor's memory + fsync; loads into the live tensors:
                ``readinto`` (one thread), ``os.preadv`` in 8 MiB chunks on 2 threads,
                ``mmap`` + ``copy_``
==============  =====================================================================

Optimizer state (``adamw``): tlckpt ``save_optimizer`` / ``load_optimizer``; torch
``torch.save(opt.state_dict())`` + fsync / ``torch.load`` + ``opt.load_state_dict``.

Every durable save pays the same fsyncs (file, then folder; tlckpt does them itself); the
file is removed before every save (untimed), so each save writes a new file.
"""

from __future__ import annotations

import mmap
import os
import threading
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from bench.measure import Way, fsync_path

__all__ = ["state_ways", "optimizer_ways", "checksums", "unique_tensors"]

LoadWays = dict[str, Way]


def unique_tensors(module: torch.nn.Module) -> list[torch.Tensor]:
    """The module's state tensors, each storage once (tied weights once), in order."""
    seen, out = set(), []
    for t in module.state_dict(keep_vars=True).values():
        key = (t.data_ptr(), t.numel())
        if key not in seen:
            seen.add(key)
            out.append(t)
    return out


def checksums(tensors: list[torch.Tensor]) -> list[int]:
    """A CRC-32 of each tensor's bytes."""
    return [
        zlib.crc32(t.detach().contiguous().reshape(-1).view(torch.uint8).numpy()) for t in tensors
    ]


def _byte_view(t: torch.Tensor) -> memoryview:
    return memoryview(t.detach().numpy()).cast("B")


def _unlink(path: str) -> Callable[[], None]:
    def remove() -> None:
        if os.path.exists(path):
            os.unlink(path)

    return remove


def _tied(module: torch.nn.Module) -> bool:
    return len(unique_tensors(module)) != len(module.state_dict())


def state_ways(module: torch.nn.Module, folder: str) -> tuple[dict[str, Way], LoadWays]:
    """``(save ways, load ways)`` of model state, by library, files in ``folder``."""
    import safetensors.torch as st

    import tlckpt

    _resolve(tlckpt)
    paths = {k: os.path.join(folder, f"state.{k}") for k in ("tlsf32", "pt", "st", "raw")}
    tensors = unique_tensors(module)
    views = [_byte_view(t) for t in tensors]
    tied = _tied(module)

    def torch_save() -> None:
        torch.save(module.state_dict(), paths["pt"])
        fsync_path(paths["pt"])

    def st_save() -> None:
        if tied:
            st.save_model(module, paths["st"])
        else:
            st.save_file(module.state_dict(), paths["st"])
        fsync_path(paths["st"])

    def raw_save() -> None:
        with open(paths["raw"], "wb") as f:
            for view in views:
                f.write(view)
            f.flush()
            os.fsync(f.fileno())
        fsync_path(paths["raw"])

    saves = {
        "tlckpt": Way(lambda: tlckpt.save_module_state(module, paths["tlsf32"])),
        "torch": Way(torch_save),
        "safetensors": Way(st_save),
        "raw write": Way(raw_save),
    }
    for name, path in zip(saves, (paths["tlsf32"], paths["pt"], paths["st"], paths["raw"])):
        saves[name] = Way(saves[name].run, _unlink(path))

    def st_load() -> None:
        if tied:
            st.load_model(module, paths["st"])
        else:
            module.load_state_dict(st.load_file(paths["st"]))

    def raw_readinto() -> None:
        with open(paths["raw"], "rb", buffering=0) as f:
            for view in views:
                f.readinto(view)

    loads = {
        "tlckpt default": Way(lambda: tlckpt.load_module_state(module, paths["tlsf32"])),
        "tlckpt staged": Way(lambda: _without_leases(module, paths["tlsf32"])),
        "tlckpt in place": Way(
            lambda: tlckpt.load_module_state(module, paths["tlsf32"], staged=False)
        ),
        "torch": Way(lambda: module.load_state_dict(torch.load(paths["pt"], weights_only=True))),
        "safetensors": Way(st_load),
        "raw readinto": Way(raw_readinto),
        "raw preadv x2": Way(lambda: _preadv_threads(paths["raw"], views, 2)),
        "raw mmap+copy_": Way(lambda: _mmap_copy(paths["raw"], tensors)),
    }
    return saves, loads


def _resolve(tlckpt: Any) -> None:
    """Import what tlckpt's public names resolve to lazily (``tlckpt.runtime``, which imports
    ``torch.distributed.tensor``: ~1 s and ~43 MiB in a fresh process on the project's
    machine), before anything is timed: every library is imported before its timed call, as
    ``torch`` and ``safetensors`` are here."""
    for name in ("save_module_state", "load_module_state", "save_optimizer", "load_optimizer"):
        getattr(tlckpt, name)


def _without_leases(module: torch.nn.Module, path: str) -> None:
    """The default load where no read lease is granted (another process holds the file open
    for writing, NFS, ...): it stages. The lease is refused here the way such a file
    system refuses it."""
    import tlckpt
    from tlckpt.codec.fileio import leases

    real = leases.read_lease
    leases.read_lease = lambda f: None  # type: ignore[assignment]
    try:
        tlckpt.load_module_state(module, path)
    finally:
        leases.read_lease = real  # type: ignore[assignment]


def _preadv_threads(path: str, views: list[memoryview], threads: int) -> None:
    """Positional reads of 8 MiB chunks into the tensors' memory, on ``threads`` threads."""
    chunk = 8 << 20
    jobs, offset = [], 0
    for view in views:
        for at in range(0, len(view), chunk):
            part = view[at : at + chunk]
            jobs.append((part, offset + at))
        offset += len(view)
    fd = os.open(path, os.O_RDONLY)
    try:

        def work(k: int) -> None:
            for part, at in jobs[k::threads]:
                os.preadv(fd, [part], at)

        pool = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
    finally:
        os.close(fd)


def _mmap_copy(path: str, tensors: list[torch.Tensor]) -> None:
    with open(path, "rb") as f:
        region = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    try:
        flat = np.frombuffer(region, dtype=np.float32)
        at = 0
        with torch.no_grad():
            for t in tensors:
                n = t.numel()
                t.view(-1).copy_(torch.from_numpy(flat[at : at + n]))
                at += n
        del flat
    finally:
        region.close()


def optimizer_ways(
    module: torch.nn.Module, opt: torch.optim.Optimizer, folder: str
) -> tuple[dict[str, Way], LoadWays]:
    """``(save ways, load ways)`` of the optimizer's state, by library."""
    import tlckpt

    _resolve(tlckpt)
    tl, pt = os.path.join(folder, "opt.tladam"), os.path.join(folder, "opt.pt")

    def torch_save() -> None:
        torch.save(opt.state_dict(), pt)
        fsync_path(pt)

    saves = {
        "tlckpt": Way(lambda: tlckpt.save_optimizer(opt, module, tl), _unlink(tl)),
        "torch": Way(torch_save, _unlink(pt)),
    }
    loads = {
        "tlckpt": Way(lambda: tlckpt.load_optimizer(opt, module, tl)),
        "torch": Way(lambda: opt.load_state_dict(torch.load(pt, weights_only=True))),
    }
    return saves, loads


def moments(opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Every moment tensor of an Adam optimizer, in parameter order."""
    out = []
    for group in opt.param_groups:
        for p in group["params"]:
            state = opt.state[p]
            out += [state["exp_avg"], state["exp_avg_sq"]]
    return out
