"""One rank of a sharded background-save test group (started by ``sharded_support.launch``
with ``script=``; see ``test_sharded_background.py``).

Environment: ``torchrun``-style (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), plus
``TLCKPT_TEST_WORKDIR`` (the shared folder), ``TLCKPT_TEST_CHECKS`` (comma-separated check
names) and ``TLCKPT_TEST_DEVICE`` (``cpu``: gloo; ``cuda``: gloo for CPU tensors and NCCL
for CUDA ones, the model on the GPU). Each rank writes ``bg-r{R}.json`` in the folder after
every check: check name → ``{"ok": bool, ...}``.
"""

from __future__ import annotations

import errno
import os
import sys
from collections.abc import Callable
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
from tlckpt.codec.sets.set_commit import SetWriter
from tlckpt.codec.sets.set_digests import DigestingWriter
from tlckpt.runtime.binding.dtensors import local_tensor
from tlckpt.runtime.placement import positional, sharded_placement
from tlckpt.runtime.placement.collectives import all_agree
from tlckpt.runtime.placement.sharded_io import ENV, last_sharded_io
from tlckpt.runtime.sets import set_restoring, set_writing, writer_threads
from tlckpt.testing.models import TiedNet, make_adam, train

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
WORKDIR = Path(os.environ["TLCKPT_TEST_WORKDIR"])
DEVICE = os.environ.get("TLCKPT_TEST_DEVICE", "cpu")
CHECKS: dict[str, Callable[[Any], dict[str, Any]]] = {}


def check(fn: Callable[[Any], dict[str, Any]]) -> Callable[[Any], dict[str, Any]]:
    CHECKS[fn.__name__] = fn
    return fn


def model_on(mesh: Any, seed: int) -> tuple[TiedNet, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = TiedNet().to(DEVICE)
    fully_shard(model.mix, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, make_adam("adamw", model.parameters())


def mutate(model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    """Change every value the save copied, on this rank, right away."""
    with torch.no_grad():
        for t in model.state_dict(keep_vars=True).values():
            local = local_tensor(t)
            if local.is_floating_point():
                local.add_(1.0)
        for entry in opt.state.values():
            for value in entry.values():
                if isinstance(value, torch.Tensor) and value.is_floating_point():
                    local_tensor(value).mul_(2.0)


def members(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.name != "manifest.json"}


@check
def background_saves(mesh: Any) -> dict[str, Any]:
    """A background save holds the values of the call: the state is changed and trained on
    (collectives on the trainer's group) while the set is written. Its members are a
    blocking save's bytes of the same state; it restores bit-exactly and the restored run
    continues as one restored from the blocking set. A second background save reuses the
    arena and the group; ``keep_last=1`` leaves its set alone."""
    model, opt = model_on(mesh, seed=0)
    counter = train(model, opt, 0, K, device=DEVICE)
    expected = snapshot(model, opt)
    blocking = tlckpt.CheckpointManager(WORKDIR / f"blocking-w{WORLD}")
    blocking.save(K, model=model, optimizer=opt, random_counter=counter)
    manager = tlckpt.CheckpointManager(WORKDIR / f"background-w{WORLD}", keep_last=1)
    handle = manager.save(K, model=model, optimizer=opt, random_counter=counter, blocking=False)
    mutate(model, opt)
    train(model, opt, K, 2, device=DEVICE)  # the trainer's collectives, during the save
    folder = handle.wait()
    dist.barrier()
    same_bytes = members(folder) == members(blocking.directory / folder.name) if RANK == 0 else None
    a, a_opt = model_on(mesh, seed=4321)
    restored = manager.restore(model=a, optimizer=a_opt)
    exact = differences(snapshot(a, a_opt), expected)
    b, b_opt = model_on(mesh, seed=99)
    blocking.restore(model=b, optimizer=b_opt)
    train(a, a_opt, K, N, device=DEVICE)
    train(b, b_opt, K, N, device=DEVICE)
    continuation = differences(snapshot(a, a_opt), snapshot(b, b_opt))
    second = snapshot(model, opt)
    manager.save(K + 2, model=model, optimizer=opt, blocking=False)
    mutate(model, opt)
    manager.wait()
    c, c_opt = model_on(mesh, seed=7)
    manager.restore(model=c, optimizer=c_opt)
    return {
        "same_bytes": same_bytes,
        "counter": restored.random_counter,
        "exact": exact,
        "continuation": continuation,
        "steps": manager.steps(),
        "second_exact": differences(snapshot(c, c_opt), second),
    }


@check
def background_through_rank0(mesh: Any) -> dict[str, Any]:
    """Forced through rank 0 (``TLCKPT_SHARDED_IO=rank0``), a background save gathers the
    shards to rank 0 point to point over the manager's group: the set is the blocking
    set's bytes and restores exactly (through rank 0 too)."""
    model, opt = model_on(mesh, seed=6)
    counter = train(model, opt, 0, K, device=DEVICE)
    expected = snapshot(model, opt)
    os.environ[ENV] = "rank0"
    try:
        blocking = tlckpt.CheckpointManager(WORKDIR / f"rank0-blocking-w{WORLD}")
        blocking.save(K, model=model, optimizer=opt, random_counter=counter)
        manager = tlckpt.CheckpointManager(WORKDIR / f"rank0-w{WORLD}")
        handle = manager.save(K, model=model, optimizer=opt, random_counter=counter, blocking=False)
        mutate(model, opt)
        folder = handle.wait()
        dist.barrier()
        same_bytes = (
            members(folder) == members(blocking.directory / folder.name) if RANK == 0 else None
        )
        fresh, fresh_opt = model_on(mesh, seed=4321)
        manager.restore(model=fresh, optimizer=fresh_opt)
        route = last_sharded_io().route
    finally:
        os.environ.pop(ENV, None)
    return {
        "same_bytes": same_bytes,
        "route": route,
        "exact": differences(snapshot(fresh, fresh_opt), expected),
    }


def _fail_check(*args: Any) -> None:
    raise OSError(errno.ENOSPC, "injected: no space on this rank")


def _fail_write(*args: Any) -> None:
    raise OSError(errno.EIO, "injected: the disk failed")


@check
def background_failures(mesh: Any) -> dict[str, Any]:
    """A failure on one rank (the last: its check of the shards; rank 0: writing its
    pieces, or reading a member back to digest it)
    is raised by ``wait()`` on every rank; nothing is committed, no folder is left, and the
    next background save commits."""
    model, opt = model_on(mesh, seed=2)
    counter = train(model, opt, 0, K, device=DEVICE)
    manager = tlckpt.CheckpointManager(WORKDIR / f"failures-w{WORLD}")
    outcomes = {}
    for label, failing, patch in (
        ("last rank", WORLD - 1, (sharded_placement, "check_mesh", _fail_check)),
        ("rank 0", 0, (positional, "_write_piece", _fail_check)),
        ("rank 0 digest", 0, (DigestingWriter, "absorb", _fail_write)),
    ):
        owner, name, replacement = patch
        original = getattr(owner, name)
        if failing == RANK:
            setattr(owner, name, replacement)
        try:
            handle = manager.save(
                K, model=model, optimizer=opt, random_counter=counter, blocking=False
            )
            try:
                handle.wait()
                raised = None
            except BaseException as exc:  # what every rank's wait raised
                raised = {"type": type(exc).__name__, "text": str(exc)}
            manager.wait()  # told already: raises nothing more
        finally:
            setattr(owner, name, original)
        dist.barrier()
        outcomes[label] = {
            "raised": raised,
            "steps": manager.steps(),
            "left": sorted(p.name for p in manager.directory.iterdir()),
        }
        dist.barrier()  # every rank has looked before rank 0 starts the next save's folder
    after = manager.save(K, model=model, optimizer=opt, random_counter=counter, blocking=False)
    after.wait()
    return {"outcomes": outcomes, "steps_after": manager.steps()}


@check
def restore_by_path(mesh: Any) -> dict[str, Any]:
    """A sharded restore reads the members by path, every rank its own pieces (the
    parallel path), while rank 0 hashes them; a member with one bit flipped, or renamed
    over after rank 0 opened it (a set of other values, same sizes), is refused on every
    rank, nothing changed."""
    model, opt = model_on(mesh, seed=3)
    counter = train(model, opt, 0, K, device=DEVICE)
    expected = snapshot(model, opt)
    manager = tlckpt.CheckpointManager(WORKDIR / f"by-path-w{WORLD}")
    folder = manager.save(K, model=model, optimizer=opt, random_counter=counter).wait()
    other_model, other_opt = model_on(mesh, seed=5)
    train(other_model, other_opt, 0, K, device=DEVICE)
    other = tlckpt.CheckpointManager(WORKDIR / f"by-path-other-w{WORLD}")
    other_folder = other.save(K, model=other_model, optimizer=other_opt).wait()
    fresh, fresh_opt = model_on(mesh, seed=4321)
    manager.restore(model=fresh, optimizer=fresh_opt)
    route = last_sharded_io().route
    exact = differences(snapshot(fresh, fresh_opt), expected)
    before = snapshot(fresh, fresh_opt)
    dist.barrier()
    if RANK == 0:  # one bit of a payload, in place, the size kept: only the digest sees it
        member = other_folder / "optimizer.tladam"
        data = bytearray(member.read_bytes())
        data[len(data) // 2] ^= 1
        member.write_bytes(bytes(data))
    dist.barrier()
    try:
        other.restore(model=fresh, optimizer=fresh_opt, step=K)
        damaged = None
    except tlckpt.CheckpointError as exc:
        damaged = type(exc).__name__
    original = set_restoring.check_state_tensors

    def replace_then_check(*args: Any) -> None:
        if RANK == 0:  # after rank 0 verified the set, before the loads open the paths
            os.replace(other_folder / "model.tlsf32", folder / "model.tlsf32")
        original(*args)

    set_restoring.check_state_tensors = replace_then_check
    try:
        manager.restore(model=fresh, optimizer=fresh_opt, step=K)
        raised = None
    except tlckpt.CheckpointError as exc:
        raised = type(exc).__name__
    finally:
        set_restoring.check_state_tensors = original
    return {
        "route": route,
        "exact": exact,
        "raised": raised,
        "damaged": damaged,
        "unchanged": differences(snapshot(fresh, fresh_opt), before) == [],
    }


@check
def digest_before_the_sync(mesh: Any) -> dict[str, Any]:
    """On one machine (one page cache), rank 0 reads each member written in parallel back
    from its temporary as soon as every rank's bytes are in it, while the ranks sync it;
    where the ranks might not share a page cache (several machines), after the sync. Both
    sets' digests verify and restore the values exactly."""
    model, opt = model_on(mesh, seed=13)
    train(model, opt, 0, 1, device=DEVICE)
    expected = snapshot(model, opt)
    adopted: list[list[Any]] = []
    real = SetWriter.adopt

    def spy(self: Any, role: str, file: str, version: int = 0, family: Any = None, fd: Any = None):
        adopted.append([role, fd is not None])
        return real(self, role, file, version, family, fd)

    original = set_writing._one_page_cache
    SetWriter.adopt = spy
    try:
        tlckpt.CheckpointManager(WORKDIR / f"early-w{WORLD}").save(1, model=model, optimizer=opt)
        set_writing._one_page_cache = lambda folder: all_agree(False)
        tlckpt.CheckpointManager(WORKDIR / f"late-w{WORLD}").save(1, model=model, optimizer=opt)
    finally:
        SetWriter.adopt = real
        set_writing._one_page_cache = original
    exact = []
    for name in ("early", "late"):
        fresh, fresh_opt = model_on(mesh, seed=99)
        tlckpt.CheckpointManager(WORKDIR / f"{name}-w{WORLD}").restore(
            model=fresh, optimizer=fresh_opt
        )
        exact.append(differences(snapshot(fresh, fresh_opt), expected))
    return {"adopted": adopted, "exact": exact}


def native_threads() -> int:
    """This process's threads, C++ ones included (gloo's workers)."""
    return len(os.listdir("/proc/self/task"))


@check
def saving_group_released(mesh: Any) -> dict[str, Any]:
    """What the interpreter runs at exit (``writer_threads._report_at_exit``) destroys the
    manager's saving group and lets it go once the writers ended: its gloo worker threads
    are joined then, not left to the interpreter's finalization (where one taking the GIL
    aborts the process). A later background save makes a group again and commits."""
    model, opt = model_on(mesh, seed=11)
    train(model, opt, 0, 1, device=DEVICE)
    manager = tlckpt.CheckpointManager(WORKDIR / f"released-w{WORLD}")
    before = native_threads()
    manager.save(1, model=model, optimizer=opt, blocking=False).wait()
    pg = manager._group.pg
    during = native_threads()
    registered = pg in dist.distributed_c10d._world.pg_map
    del pg
    writer_threads._report_at_exit()
    after = native_threads()
    released = manager._group.pg is None
    manager.save(2, model=model, optimizer=opt, blocking=False).wait()
    return {
        "registered": registered,
        "released": released,
        "threads": [before, during, after],
        "steps": manager.steps(),
    }


def main() -> None:
    torch.set_num_threads(1)
    if DEVICE == "cuda":
        torch.cuda.set_device(RANK % torch.cuda.device_count())
        dist.init_process_group("cpu:gloo,cuda:nccl", timeout=timedelta(seconds=60))
    else:
        dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    mesh = init_device_mesh(DEVICE, (WORLD,))
    try:
        run_checks(
            os.environ["TLCKPT_TEST_CHECKS"].split(","), CHECKS, mesh, WORKDIR / f"bg-r{RANK}.json"
        )
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
