"""Background saves of sharded (DTensor) models, on every rank.

Every rank calls :meth:`~.checkpoint_manager.CheckpointManager.save` with ``blocking=False``
in the same order; each copies its own shards into its manager's arena
(:mod:`.snapshot`) and returns. Each rank's writer thread then runs the save's collectives
over a gloo process group of the manager's own (:func:`new_saving_group`, made on the calling
thread at the first such save, as every group creation must be: on every rank, in the same
order), never over the trainer's group, whose collectives the training thread issues
meanwhile. The set commits once every rank's part is durable; a failure on any rank (its
copies included) is raised by every rank's handle, and nothing is committed.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .set_writing import SetSource, write_set
from .writer_threads import after_writers_at_exit

__all__ = ["SavingGroup", "new_saving_group", "sharded_background", "retain_on_writer"]


class SavingGroup:
    """A manager's saving process group (``pg``), destroyed and let go at exit once the
    writers have ended (:func:`_release_at_exit`).

    Why: while anything holds a gloo group, its C++ worker threads live on, and one that
    drops the last reference to a tensor with a Python object during the interpreter's
    finalization takes the GIL there, which aborts the process ("terminate called without
    an active exception", SIGABRT) — even after ``dist.destroy_process_group()``, which
    unregisters the group but cannot free what the manager still holds.
    """

    def __init__(self, pg: Any) -> None:
        self.pg = pg


#: The saving groups alive (weakly: a manager let go frees its group as before).
_groups: weakref.WeakSet[SavingGroup] = weakref.WeakSet()


def new_saving_group() -> SavingGroup:
    """Collective: the process group of a manager's sharded background saves (see
    :func:`~..placement.collectives.group.new_saving_group`), released at exit."""
    from ..placement.collectives import new_saving_group as make

    group = SavingGroup(make())
    _groups.add(group)
    after_writers_at_exit(_release_at_exit)
    return group


def _release_at_exit() -> None:
    """Destroy every saving group still registered and drop the last references, so that
    their worker threads are joined now, on this thread, while the interpreter is whole."""
    import torch.distributed as dist

    for group in list(_groups):
        pg, group.pg = group.pg, None
        if pg is None:
            continue
        if dist.is_initialized():  # else the trainer destroyed every group already
            with contextlib.suppress(ValueError, RuntimeError):  # destroyed on its own
                dist.destroy_process_group(pg)
        del pg  # the last reference: ~ProcessGroupGloo joins its threads here


def retain_on_writer(step: int, group: Any, retain: Callable[[int], None]) -> None:
    """Collective: ``retain(step)`` (retention after ``step`` was committed) on rank 0 alone,
    every rank waiting for it, so that every rank then lists the same sets."""
    from ..placement.collectives import bound_group, is_writer, share_verdict

    with bound_group(group):
        if is_writer():
            retain(step)
        share_verdict(None)


def sharded_background(
    target: Path,
    step: int,
    source: SetSource,
    snapshot: Any,
    overwrite: bool,
    key: Any,
    group: Any,
    retain: Callable[[int], None],
) -> Callable[[], Path]:
    """The writer thread's work for a sharded background save (see the module docstring).

    Args:
        target: the set's folder.
        step: its step.
        source: the snapshot's source (:func:`~.set_writing.snapshot_source`).
        snapshot: the copies (their device copies may still be landing).
        overwrite: replace an existing set of ``step``.
        key: the manager's key, or ``None``.
        group: the manager's saving group.
        retain: the manager's retention, run on rank 0 after the commit.

    Returns:
        The work: it returns the committed set's folder, or raises, on every rank alike.
    """

    def background() -> Path:
        failed: BaseException | None = None
        try:
            snapshot.wait()
        except Exception as exc:  # every rank raises it, through the save's first verdict
            failed = exc
        path = write_set(
            target, step, source, overwrite=overwrite, key=key, group=group, failed=failed
        )
        retain_on_writer(step, group, retain)
        return path

    return background
