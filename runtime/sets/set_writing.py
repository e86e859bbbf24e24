"""Writing a checkpoint set from torch objects: the source of a save (the live objects, or a
snapshot of them) and :func:`write_set`, through the operations a restore reads with
(:mod:`..ops`, over one placement chosen per save) into the codec's
:class:`~tlckpt.codec.sets.set_commit.SetWriter` (see :mod:`.checkpoint_sets`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from ...codec.errors import CheckpointError
from ...codec.fileio.gcpause import without_gc
from ...codec.safetensors.family import SAFETENSORS_FAMILY
from ...codec.sets.remote_set_writer import RemoteOptions, RemoteSetWriter
from ...codec.sets.remote_store import is_url
from ...codec.sets.set_commit import SetWriter
from ...formats.checkpoint_set import (
    MODEL_BITS_FILE,
    MODEL_BITS_VERSION,
    MODEL_FLOAT32_FILE,
    OPTIMIZER_FILE,
    SAFETENSORS_MEMBER_VERSION,
    TRAINING_STATE_FAMILY,
    TRAINING_STATE_FILE,
    TRAINING_STATE_VERSION,
)
from ...formats.float32_state import WRITTEN_VERSION as FLOAT32_VERSION
from ..binding.tensors import file_dtype_of
from ..ops import bits_files, float32_files, optimizer_files, sharded_named_state
from ..ops.state_tensors import require_module, state_tensors
from ..placement.choice import placement_for
from ..placement.local_placement import LOCAL
from ..placement.placement_protocol import Placement
from ..placement.positional import when_written
from . import training_state
from .snapshot import Snapshot

#: A version-2 set's model member of one model in the safetensors layout (role + suffix).
MODEL_SAFETENSORS_FILE = "model.safetensors"

__all__ = [
    "MODEL_SAFETENSORS_FILE",
    "SetSource",
    "live_source",
    "snapshot_source",
    "open_set_writer",
    "write_set",
]


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
        structure: a version-2 set's structure (a sharded model's safetensors member,
            :func:`~.multi_set_writing.set_source`): the model member is written in the
            safetensors layout and the manifest is version 2; ``None``: version 1.
        details: the version-2 manifest's fields of each member (with ``structure``).
    """

    model: Any
    params: Any
    optimizer: torch.optim.Optimizer | None
    state: list[tuple[str, tuple[int, ...]]]
    float32: bool
    training_state: bytes
    sharded: bool = False
    structure: dict[str, Any] | None = None
    details: dict[str, dict[str, Any]] | None = None


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


@without_gc
def _write_members(
    writer: SetWriter | None,
    source: SetSource,
    target: Path,
    deferred: list[BaseException] | None = None,
    early_digest: bool = False,
) -> None:
    """Every member through the save operations, over the placement of the model.

    One process (``deferred`` is ``None``): each member streams through ``writer``'s
    digesting writers. Sharded (``deferred`` a list): every rank passes the member's path in
    the temporary folder ``target`` to the collective save operation, which writes it in
    parallel (each rank its own bytes) or through rank 0 (:mod:`..placement.io_choice`)
    and makes it durable; then rank 0 (``writer``; ``None`` on the other ranks) reads it back
    once to digest it. A failure of rank 0's outside the operations (which end agreed) is
    appended to ``deferred`` for the caller's verdict, never raised here, where the other
    ranks could not follow it out of the collectives. With ``early_digest`` (agreed by every
    rank: :func:`_one_page_cache`), a member written in parallel is read back as soon as
    every rank's bytes are in it, while the ranks sync it.
    """
    placement: Placement = placement_for(source.model)
    digesting: list[threading.Thread] = []

    def adopt(role: str, file: str, version: int, family: str | None, fd: int | None) -> None:
        try:
            writer.adopt(role, file, version, family, fd)  # type: ignore[union-attr]
        except Exception as exc:
            deferred.append(exc)  # type: ignore[union-attr]

    def digest(role: str, file: str, version: int, family: str | None, at: str | None) -> None:
        """Rank 0: read the member back (from ``at``, its temporary, whose bytes are final)
        and digest it on a thread, while the ranks sync it or write the next member."""
        fd = None
        if at is not None:
            try:  # opened before the rename that follows: the same bytes under either name
                fd = os.open(at, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
            except OSError as exc:
                deferred.append(exc)  # type: ignore[union-attr]
                return
        thread = threading.Thread(target=adopt, args=(role, file, version, family, fd))
        try:
            thread.start()
        except RuntimeError:  # no new threads at interpreter shutdown: digested here
            adopt(role, file, version, family, fd)
            return
        digesting.append(thread)

    @contextlib.contextmanager
    def destination(role: str, file: str, version: int = 0, family: str | None = None) -> Any:
        if deferred is None:
            with writer.member(role, file, version, family) as f:  # type: ignore[union-attr]
                yield f
            return
        started: list[str] = []

        def written(at: str) -> None:  # inside the parallel save, on rank 0
            started.append(at)
            digest(role, file, version, family, at)

        with when_written(written) if early_digest else contextlib.nullcontext():
            yield target / file  # (every rank alike: the parallel save's extra verdict)
        if writer is not None and not started:  # through rank 0: read back once committed
            digest(role, file, version, family, None)

    if source.structure is not None:  # the safetensors layout, by the same parallel path
        with destination(
            "model", MODEL_SAFETENSORS_FILE, SAFETENSORS_MEMBER_VERSION, SAFETENSORS_FAMILY.name
        ) as f:
            sharded_named_state.save(placement, source.model, f)
    else:
        model_file = MODEL_FLOAT32_FILE if source.float32 else MODEL_BITS_FILE
        model_version = FLOAT32_VERSION if source.float32 else MODEL_BITS_VERSION
        with destination("model", model_file, model_version) as f:
            if source.float32:
                float32_files.save(placement, source.model, f)
            else:
                bits_files.save(placement, source.model, f, pretty=False)
    version = None
    try:
        if source.optimizer is not None:
            with destination("optimizer", OPTIMIZER_FILE) as f:
                version = optimizer_files.save(placement, source.optimizer, source.params, f, None)
    finally:
        for thread in digesting:
            thread.join()  # before the folder can be removed (a failure) or committed
    if version is not None and writer is not None and "optimizer" in writer.members:
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


def _commit(writer: Any, source: SetSource, world: int = 1) -> Any:
    """The manifest of the source's version, committed (:meth:`SetWriter.commit`)."""
    if source.structure is not None:
        return writer.commit_v2(source.structure, source.details or {}, world)
    return writer.commit(source.state, world)


def open_set_writer(
    path: str | os.PathLike,
    step: int,
    *,
    overwrite: bool = False,
    key: Any = None,
    remote: RemoteOptions | None = None,
) -> Any:
    """The writer of a set at ``path``: a URL (``s3://…``, ``memory://…``) gets a
    :class:`~tlckpt.codec.sets.remote_set_writer.RemoteSetWriter` (commit without rename),
    a plain path the local :class:`~tlckpt.codec.sets.set_commit.SetWriter` (rename,
    ``fsync``), unchanged.

    Args:
        path: the set's folder or URL.
        step, overwrite, key: as :class:`~tlckpt.codec.sets.set_commit.SetWriter`.
        remote: a URL's store options (``None``: the defaults).
    """
    if is_url(path):
        options = remote or RemoteOptions()
        return RemoteSetWriter(
            str(path),
            step,
            overwrite=overwrite,
            key=key,
            storage_options=options.storage_options,
            lease_seconds=options.lease_seconds,
        )
    return SetWriter(path, step, overwrite=overwrite, key=key)


def write_set(
    path: str | os.PathLike,
    step: int,
    source: SetSource,
    *,
    overwrite: bool = False,
    key: Any = None,
    remote: RemoteOptions | None = None,
    group: Any = None,
    failed: BaseException | None = None,
) -> Path | str:
    """Write and commit the set of ``step`` as the folder ``path`` (see the module
    docstring); signed with ``key`` (32 bytes, or a ``SetKey``) when given.

    Args:
        group: a sharded set's process group (every rank of the default group, in rank
            order): a background save's own; ``None``: the default group.
        failed: a sharded set only: this rank failed before the save began (the
            snapshot's copies); every rank raises it, nothing is written.

    Returns:
        The committed set's folder (its URL, for a URL).

    Raises:
        FileExistsError: ``path`` exists and ``overwrite`` is false.
        CheckpointError: a member could not be written (named); nothing is committed.
        OSError: from the file system; nothing is committed.
    """
    if not source.sharded:
        if failed is not None:
            raise failed
        with open_set_writer(path, step, overwrite=overwrite, key=key, remote=remote) as writer:
            _write_members(writer, source, Path(writer.path))
            return _commit(writer, source)
    if is_url(path):
        raise CheckpointError(
            "sets of sharded (DTensor) models are saved to local folders only, not to"
            f" object storage ({path})",
            path=str(path),
        )
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
    """Every rank writes its part through the collective save functions, into the
    temporary folder rank 0 created; rank 0 digests each member (keyed when the set is
    signed) and commits the manifest once every rank has confirmed. A failure on any rank,
    at any step, is raised on every rank, and nothing is committed."""
    from ..placement.collectives import broadcast_json, is_writer, share_verdict, world_size
    from ..placement.io_choice import one_probe

    with contextlib.ExitStack() as stack:
        writer: SetWriter | None = None
        error: BaseException | None = failed
        if is_writer() and error is None:
            try:
                writer = stack.enter_context(SetWriter(path, step, overwrite=overwrite, key=key))
            except Exception as exc:  # shared below: every rank raises it
                error = exc
        share_verdict(error)
        target = Path(broadcast_json(writer.path if writer is not None else None))
        deferred: list[BaseException] = []
        early = _one_page_cache(target)
        with one_probe():  # the members share the temporary folder: one probe
            _write_members(writer, source, target, deferred, early)  # collectives: every rank
        share_verdict(deferred[0] if deferred else None)  # every rank's part is written
        error = None
        final = Path(path)
        if writer is not None:
            try:
                final = _commit(writer, source, world_size())
            except Exception as exc:  # shared below
                error = exc
        share_verdict(error)
        return final


def _one_page_cache(folder: Path) -> bool:
    """Collective: whether every rank reaches ``folder`` through one kernel (the same boot)
    and one mount of its file system (the same device number): then one page cache holds
    every rank's writes, and rank 0 may read a member back before the others have synced
    it. Ranks on several machines over a shared file system see each other's writes only
    once synced (NFS: close-to-open), so there rank 0 reads back after the sync."""
    from ..placement.collectives import all_agree

    try:
        with open("/proc/sys/kernel/random/boot_id", "rb") as f:
            boot = f.read().strip()
        device = os.stat(folder).st_dev
    except OSError:  # not Linux, or the folder unseen: read back after the sync
        return all_agree(False)
    return all_agree(bool(boot), hashlib.sha256(boot + b"/%d" % device).digest())
