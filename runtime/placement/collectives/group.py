"""The process group as a checkpoint sees it: ranks, the wire, each rank's rows.

Nothing here communicates: these are questions one rank answers alone, the same way on
every rank.

Collectives run over the default process group, unless this thread has bound another
(:func:`bound_group`): a background save's writer thread runs every collective of its save
over a group of its own (made with ``dist.new_group`` on the main thread, over every rank
in rank order, so that group ranks are global ranks), never over the trainer's group, whose
collectives the training thread is issuing meanwhile.

``torch.distributed.tensor`` is imported by the functions that meet a DTensor, never at
module level: importing it costs ~0.6 s (it brings ``sympy``), which a process that never
makes a DTensor would pay at its first save or load.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

from ....codec.errors import CheckpointError, SchemaMismatchError
from ...binding.dtensors import is_dtensor, local_tensor

__all__ = [
    "WRITER",
    "rank",
    "world_size",
    "is_writer",
    "wire_device",
    "row_shards",
    "check_mesh",
    "as_bytes",
    "bound_group",
    "current_group",
    "new_saving_group",
]

#: The rank that reads and writes the file.
WRITER = 0


_bound = threading.local()


def current_group() -> Any:
    """The process group this thread's collectives run over (``None``: the default one)."""
    return getattr(_bound, "group", None)


@contextlib.contextmanager
def bound_group(group: Any) -> Iterator[None]:
    """Run this thread's collectives over ``group`` inside the block (``None``: the default
    group). ``group`` must span every rank of the default group, in rank order."""
    before = current_group()
    _bound.group = group
    try:
        yield
    finally:
        _bound.group = before


def new_saving_group() -> Any:
    """Collective (every rank, on the main thread, in the same order as the trainer's other
    group creations): a new gloo process group over every rank of the default group, in
    rank order, for a background save's collectives. Gloo whatever the trainer's backend:
    what a background save moves are host copies."""
    ranks = list(range(dist.get_world_size()))
    return dist.new_group(ranks=ranks, backend="gloo", timeout=_trainers_timeout())


def _trainers_timeout() -> Any:
    """The default group's timeout, so that a rank that never joins a save fails the others'
    saves as the trainer's own collectives would (else gloo's default, 30 minutes). Read
    through private attributes: ``None`` (the default) where this torch has none."""
    try:
        group = dist.distributed_c10d._get_default_group()
        return group._get_backend(torch.device("cpu")).options._timeout
    except (AttributeError, RuntimeError, ValueError):  # no CPU backend, another torch
        return None


def rank() -> int:
    """This process's rank in the process group of this thread's collectives."""
    return dist.get_rank(current_group())


def world_size() -> int:
    """The number of ranks in the process group of this thread's collectives."""
    return dist.get_world_size(current_group())


def is_writer() -> bool:
    """Whether this rank reads and writes the file."""
    return rank() == WRITER


def wire_device() -> torch.device:
    """Where tensors that travel through this thread's group must be: CPU when its backend
    takes CPU tensors (gloo, mpi, or a ``cpu:gloo,cuda:nccl`` pair), else the current
    accelerator (NCCL takes CUDA tensors only)."""
    backend = str(dist.get_backend(current_group())).lower()
    if "cpu" in backend or backend in ("gloo", "mpi"):
        return torch.device("cpu")
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor's memory as flat bytes (what travels: exact for every dtype)."""
    return t.reshape(-1).view(torch.uint8)


def row_shards(t: torch.Tensor) -> list[tuple[int, int]] | None:
    """Each rank's rows ``[lo, hi)`` of a DTensor sharded by rows over a one-dimensional
    mesh of all ranks in rank order (``Shard(0)``: ``torch.chunk`` rows, the last ranks
    possibly empty); ``None`` for any other layout."""
    from torch.distributed.tensor import Shard  # imported where used: see the module docstring

    mesh = t.device_mesh
    placements = t.placements
    if (
        mesh.ndim != 1
        or len(placements) != 1
        or type(placements[0]) is not Shard
        or placements[0].dim not in (0, -t.ndim)
        or t.ndim == 0
        or mesh.mesh.tolist() != list(range(world_size()))
    ):
        return None
    size = t.shape[0]
    chunk = -(-size // world_size()) if size else 0
    return [(min(r * chunk, size), min((r + 1) * chunk, size)) for r in range(world_size())]


def check_mesh(name: str, t: torch.Tensor) -> None:
    """Refuse a DTensor whose device mesh does not span every rank of the default group,
    or whose local rows are not the ones :func:`row_shards` says (then the ranks would
    not agree on what travels).

    Raises:
        CheckpointError: naming the tensor and both sizes.
    """
    if not is_dtensor(t):
        return
    if t.device_mesh.size() != world_size():
        raise CheckpointError(
            f"tensor {name!r} is sharded over {t.device_mesh.size()} rank(s) of a"
            f" {world_size()}-rank process group; a checkpoint is saved and loaded by every"
            " rank of the default group, so each sharded tensor must span all of them",
            field=name,
            actual=t.device_mesh.size(),
            expected=world_size(),
        )
    rows = row_shards(t)
    if rows is not None:
        lo, hi = rows[rank()]
        local = tuple(local_tensor(t).shape)
        if local != (hi - lo, *t.shape[1:]):
            raise SchemaMismatchError(
                f"tensor {name!r}: this rank's shard is {local}, but rows {lo}:{hi} of"
                f" {tuple(t.shape)} under {t.placements}",
                field=name,
                actual=local,
                expected=(hi - lo, *t.shape[1:]),
            )
