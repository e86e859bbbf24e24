"""Writing a checkpoint set from torch objects: the source of a save (the live objects, or a
snapshot of them) and :func:`write_set`, through the operations a restore reads with
(:mod:`..ops`, over one placement chosen per save) into the codec's
:class:`~tlckpt.codec.sets.set_commit.SetWriter` (see :mod:`.checkpoint_sets`).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from ...codec.fileio.gcpause import without_gc
from ...codec.sets.set_commit import SetWriter
from ...formats.checkpoint_set import (
    MODEL_BITS_FILE,
    MODEL_BITS_VERSION,
    MODEL_FLOAT32_FILE,
    OPTIMIZER_FILE,
    TRAINING_STATE_FAMILY,
    TRAINING_STATE_FILE,
    TRAINING_STATE_VERSION,
)
from ...formats.float32_state import WRITTEN_VERSION as FLOAT32_VERSION
from ..binding.tensors import file_dtype_of
from ..ops import bits_files, float32_files, optimizer_files
from ..ops.state_tensors import require_module, state_tensors
from ..placement.choice import placement_for
from ..placement.local_placement import LOCAL
from ..placement.placement_protocol import Placement
from . import training_state
from .snapshot import Snapshot

__all__ = ["SetSource", "live_source", "snapshot_source", "write_set"]


@dataclass
class SetSource:
    """What a set is written from.

    Attributes:
        model: the module, or a snapshot's mapping of state names to copies.
        params: what the optimizer's writer binds to (the module, or the copies of its
            parameter slots).
        optimizer: the optimizer (live or stand-in), or ``None``.
        state: the state tensors' names and shapes, in file order (for the manifest).
        float32: whether the model member is ``TLSF32B`` (else exact-bits JSON).
        training_state: the training-state member's bytes, captured at the call.
        sharded: whether the model holds DTensors (every rank takes part).
    """

    model: Any
    params: Any
    optimizer: torch.optim.Optimizer | None
    state: list[tuple[str, tuple[int, ...]]]
    float32: bool
    training_state: bytes
    sharded: bool = False


def _described(model: Any) -> tuple[list[tuple[str, tuple[int, ...]]], bool]:
    named = state_tensors(model)
    return [(n, tuple(t.shape)) for n, t in named], file_dtype_of(named) in (None, torch.float32)


def live_source(
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    scheduler: Any,
    random_counter: int | None,
    extra: Any,
) -> SetSource:
    """A source over the live objects (a blocking save reads them while it writes).

    Raises:
        CheckpointError: the model is not a module, or a training-state value cannot be
            saved exactly (named).
    """
    require_module(model)
    state, float32 = _described(model)
    data = training_state.capture(step, optimizer, scheduler, random_counter, extra)
    placement = placement_for(model)
    return SetSource(model, model, optimizer, state, float32, data, placement is not LOCAL)


def snapshot_source(live: SetSource, snapshot: Snapshot) -> SetSource:
    """``live`` with a snapshot's copies, taken at the call, in place of the live objects
    (a background save; a sharded model's copies are DTensors over each rank's own shard
    copies, written by every rank as the live ones are).

    Args:
        live: the source over the live objects (:func:`live_source`).
        snapshot: the copies of its model's state and optimizer.
    """
    return replace(
        live,
        model=snapshot.state,
        params=snapshot.params,
        optimizer=snapshot.optimizer,
    )


class _Refusing:
    """What the writer rank writes a member into when the member's file could not be
    created: every write raises that error, inside the operation, whose verdict then raises
    it on every rank (the other ranks are in the operation's collectives meanwhile)."""

    def __init__(self, error: BaseException):
        self.error = error

    def __getattr__(self, name: str) -> Any:
        raise self.error  # write, flush, tell...: whatever the operation asks first


@contextlib.contextmanager
def _contained(member: Any, deferred: list[BaseException]) -> Iterator[Any]:
    """A sharded set's member on the writer rank: a failure to create it or to make it
    durable is kept for a verdict (raised on every rank), never raised here, where the
    other ranks could not follow it out of the operation's collectives."""
    try:
        f = member.__enter__()
    except Exception as exc:
        yield _Refusing(exc)
        return
    try:
        yield f
    except BaseException:
        member.__exit__(*sys.exc_info())  # removes nothing: the set's folder is temporary
        raise
    try:
        member.__exit__(None, None, None)  # flush, fsync, record
    except Exception as exc:
        deferred.append(exc)


@without_gc
def _write_members(
    writer: SetWriter | None,
    source: SetSource,
    target: Path,
    deferred: list[BaseException] | None = None,
) -> None:
    """Every member through the save operations, over the placement of the model (sharded:
    every rank takes part); ``writer`` is ``None`` on a rank that does not touch the files
    (it takes part in the collectives only). With ``deferred`` (sharded), the writer rank's
    failures outside the operations are appended to it instead of raised."""
    placement: Placement = placement_for(source.model)

    def destination(role: str, file: str, version: int = 0, family: str | None = None) -> Any:
        if writer is None:
            return contextlib.nullcontext(target / file)  # never opened on this rank
        member = writer.member(role, file, version, family)
        return member if deferred is None else _contained(member, deferred)

    model_file = MODEL_FLOAT32_FILE if source.float32 else MODEL_BITS_FILE
    model_version = FLOAT32_VERSION if source.float32 else MODEL_BITS_VERSION
    with destination("model", model_file, model_version) as f:
        if source.float32:
            float32_files.save(placement, source.model, f)
        else:
            bits_files.save(placement, source.model, f, pretty=False)
    if source.optimizer is not None:
        with destination("optimizer", OPTIMIZER_FILE) as f:
            version = optimizer_files.save(placement, source.optimizer, source.params, f, None)
        if writer is not None and "optimizer" in writer.members:
            writer.set_version("optimizer", version)
    if writer is not None:
        try:
            with writer.member(
                "training_state", TRAINING_STATE_FILE, TRAINING_STATE_VERSION, TRAINING_STATE_FAMILY
            ) as f:
                f.write(source.training_state)
        except Exception as exc:
            if deferred is None:
                raise
            deferred.append(exc)


def write_set(
    path: str | os.PathLike,
    step: int,
    source: SetSource,
    *,
    overwrite: bool = False,
    key: Any = None,
    group: Any = None,
    failed: BaseException | None = None,
) -> Path:
    """Write and commit the set of ``step`` as the folder ``path`` (see the module
    docstring); signed with ``key`` (32 bytes, or a ``SetKey``) when given.

    Args:
        group: a sharded set's process group (every rank of the default group, in rank
            order): a background save's own; ``None``: the default group.
        failed: a sharded set only: this rank failed before the save began (the
            snapshot's copies); every rank raises it, nothing is written.

    Returns:
        The committed set's folder.

    Raises:
        FileExistsError: ``path`` exists and ``overwrite`` is false.
        CheckpointError: a member could not be written (named); nothing is committed.
        OSError: from the file system; nothing is committed.
    """
    if not source.sharded:
        if failed is not None:
            raise failed
        with SetWriter(path, step, overwrite=overwrite, key=key) as writer:
            _write_members(writer, source, Path(writer.path))
            return writer.commit(source.state)
    from ..placement.collectives import bound_group

    with bound_group(group):
        return _write_sharded(path, step, source, overwrite, key, failed)


def _write_sharded(
    path: str | os.PathLike,
    step: int,
    source: SetSource,
    overwrite: bool,
    key: Any = None,
    failed: BaseException | None = None,
) -> Path:
    """Every rank writes its part through the collective save functions; rank 0 commits
    the manifest once every rank has confirmed (every member's bytes pass through rank 0's
    digesting writers, keyed when the set is signed). A failure on any rank, at any step,
    is raised on every rank, and nothing is committed."""
    from ..placement.collectives import is_writer, share_verdict, world_size

    with contextlib.ExitStack() as stack:
        writer: SetWriter | None = None
        error: BaseException | None = failed
        if is_writer() and error is None:
            try:
                writer = stack.enter_context(SetWriter(path, step, overwrite=overwrite, key=key))
            except Exception as exc:  # shared below: every rank raises it
                error = exc
        share_verdict(error)
        target = Path(writer.path) if writer is not None else Path(path)
        deferred: list[BaseException] = []
        _write_members(writer, source, target, deferred)  # collectives: every rank, same order
        share_verdict(deferred[0] if deferred else None)  # every rank's part is written
        error = None
        final = Path(path)
        if writer is not None:
            try:
                final = writer.commit(source.state, world_size())
            except Exception as exc:  # shared below
                error = exc
        share_verdict(error)
        return final
