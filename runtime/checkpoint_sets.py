"""Checkpoint sets, torch side: a whole training state written as one set, and restored from
one, all or nothing.

Writing (:func:`write_set`) takes a :class:`SetSource`: the live objects (a blocking save)
or a :class:`~.snapshot.Snapshot` of them (a background save) — the same code writes both.
Members go through the public save functions into the codec's digesting writers
(:class:`~tlckpt.codec.checkpoint_set.SetWriter`), the training-state document is written,
then the manifest commits the set.

Restoring (:func:`restore_set`) has two phases:

1. *open*: the manifest is read, every member opened and its size checked, the small members
   hashed (the training-state document is parsed next). A failure here means the set is
   damaged or incomplete (a caller asking for the latest set falls back to the previous one);
2. *fit and commit*: the manifest's tensor names and shapes are compared with the model's
   (same shapes under other names is refused), the scheduler, param groups and random
   states are checked against the live objects, the model and optimizer loads are planned
   (staged, off to the side) by reading the large members through digesting readers — the
   bytes hashed are the bytes loaded, in one pass; a plan that fails on a damaged member
   reports the digest, and the fallback applies. Every digest is then completed and
   compared, the members are checked not to have changed since, and only then does one
   commit block (Ctrl-C held back) write the scheduler, the model, the optimizer, the param
   groups' hyperparameters and the random states.

Models holding DTensors are saved and restored as collectives, like the file functions:
every rank calls, rank 0 writes and reads the files, and the manifest is committed only
after every rank has confirmed its part.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..codec.checkpoint_set import (
    SetWriter,
    VerifiedSet,
    candidate_steps,
    set_path,
    warn_skipped,
)
from ..codec.errors import CheckpointError, SchemaMismatchError
from ..formats.checkpoint_set import (
    MODEL_BITS_FILE,
    MODEL_BITS_VERSION,
    MODEL_FLOAT32_FILE,
    OPTIMIZER_FILE,
    TRAINING_STATE_FAMILY,
    TRAINING_STATE_FILE,
    TRAINING_STATE_VERSION,
)
from ..formats.float32_state import WRITTEN_VERSION as FLOAT32_VERSION
from . import bits_files, float32_files, optimizer_files, training_state
from .local_placement import LOCAL
from .module_state import save_module_state, save_state_bits
from .optimizer import save_optimizer
from .placement import Placement, placement_for
from .plans import committing
from .snapshot import Snapshot
from .state_tensors import state_tensors
from .tensors import file_dtype_of

__all__ = [
    "Restored",
    "SetSource",
    "live_source",
    "snapshot_source",
    "write_set",
    "restore_set",
    "restore_latest",
    "save_checkpoint",
    "load_checkpoint",
]


@dataclass(frozen=True)
class Restored:
    """What a restore returns besides the state it put back.

    Attributes:
        step: the set's step.
        random_counter: the run's random counter saved with it, or ``None``.
        extra: the caller's ``extra`` saved with it, or ``None``.
    """

    step: int
    random_counter: int | None
    extra: Any


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
    _require_module(model)
    state, float32 = _described(model)
    data = training_state.capture(step, optimizer, scheduler, random_counter, extra)
    placement = placement_for(model)
    return SetSource(model, model, optimizer, state, float32, data, placement is not LOCAL)


def snapshot_source(
    step: int,
    model: torch.nn.Module,
    snapshot: Snapshot,
    optimizer: torch.optim.Optimizer | None,
    scheduler: Any,
    random_counter: int | None,
    extra: Any,
) -> SetSource:
    """A source over a snapshot taken at the call (a background save).

    Raises:
        CheckpointError: as :func:`live_source`.
    """
    state, float32 = _described(model)
    data = training_state.capture(step, optimizer, scheduler, random_counter, extra)
    return SetSource(snapshot.state, snapshot.params, snapshot.optimizer, state, float32, data)


def _require_module(model: Any) -> None:
    if not isinstance(model, torch.nn.Module):
        raise CheckpointError(
            f"model must be a torch.nn.Module (a set records its tensors' names), got"
            f" {type(model).__name__}",
            field="model",
        )


# --------------------------------------------------------------------------- writing


def _write_members(writer: SetWriter | None, source: SetSource, target: Path) -> None:
    """Every member through the public save functions; ``writer`` is ``None`` on a rank
    that does not touch the files (it takes part in the collectives only)."""

    def destination(role: str, file: str, version: int = 0, family: str | None = None) -> Any:
        if writer is None:
            return contextlib.nullcontext(target / file)  # never opened on this rank
        return writer.member(role, file, version, family)

    model_file = MODEL_FLOAT32_FILE if source.float32 else MODEL_BITS_FILE
    model_version = FLOAT32_VERSION if source.float32 else MODEL_BITS_VERSION
    with destination("model", model_file, model_version) as f:
        if source.float32:
            save_module_state(source.model, f)
        else:
            save_state_bits(source.model, f, pretty=False)
    if source.optimizer is not None:
        with destination("optimizer", OPTIMIZER_FILE) as f:
            version = save_optimizer(source.optimizer, source.params, f)
        if writer is not None:
            writer.set_version("optimizer", version)
    if writer is not None:
        with writer.member(
            "training_state", TRAINING_STATE_FILE, TRAINING_STATE_VERSION, TRAINING_STATE_FAMILY
        ) as f:
            f.write(source.training_state)


def write_set(
    path: str | os.PathLike,
    step: int,
    source: SetSource,
    *,
    overwrite: bool = False,
) -> Path:
    """Write and commit the set of ``step`` as the folder ``path`` (see the module
    docstring).

    Returns:
        The committed set's folder.

    Raises:
        FileExistsError: ``path`` exists and ``overwrite`` is false.
        CheckpointError: a member could not be written (named); nothing is committed.
        OSError: from the file system; nothing is committed.
    """
    if not source.sharded:
        with SetWriter(path, step, overwrite=overwrite) as writer:
            _write_members(writer, source, Path(writer.path))
            return writer.commit(source.state)
    return _write_sharded(path, step, source, overwrite)


def _write_sharded(path: str | os.PathLike, step: int, source: SetSource, overwrite: bool) -> Path:
    """Every rank writes its part through the collective save functions; rank 0 commits
    the manifest once every rank has confirmed."""
    from .collectives import is_writer, share_verdict, world_size

    with contextlib.ExitStack() as stack:
        writer: SetWriter | None = None
        error: BaseException | None = None
        if is_writer():
            try:
                writer = stack.enter_context(SetWriter(path, step, overwrite=overwrite))
            except Exception as exc:  # shared below: every rank raises it
                error = exc
        share_verdict(error)
        target = Path(writer.path) if writer is not None else Path(path)
        _write_members(writer, source, target)  # collectives: every rank, same order
        share_verdict(None)  # every rank's part is written
        error = None
        final = Path(path)
        if writer is not None:
            try:
                final = writer.commit(source.state, world_size())
            except Exception as exc:  # shared below
                error = exc
        share_verdict(error)
        return final


# --------------------------------------------------------------------------- restoring


class _Unverified(Exception):
    """Phase 1 failed: the set is damaged or incomplete (``__cause__`` says how)."""


def _check_names(manifest_state: Any, model: torch.nn.Module) -> None:
    live = [(n, tuple(t.shape)) for n, t in state_tensors(model)]
    saved = list(manifest_state)
    if live == saved:
        return
    if len(live) != len(saved):
        raise SchemaMismatchError(
            f"the set holds {len(saved)} state tensors, the model has {len(live)}",
            field="state",
            actual=len(live),
            expected=len(saved),
        )
    i = next(k for k, (a, b) in enumerate(zip(live, saved)) if a != b)
    what = "names" if live[i][1] == saved[i][1] else "shapes"
    raise SchemaMismatchError(
        f"state tensor {i} is {saved[i][0]!r} {list(saved[i][1])} in the set and"
        f" {live[i][0]!r} {list(live[i][1])} in the model: the {what} differ (a model whose"
        " layers are registered in another order is refused even when the shapes agree)",
        field=f"state[{i}]",
        actual=live[i],
        expected=saved[i],
    )


def restore_set(
    folder: str | os.PathLike,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    scheduler: Any,
    rng: bool,
    *,
    fallback: bool = False,
) -> Restored:
    """Verify the set in ``folder`` and restore it into the live objects, all or nothing.

    Args:
        fallback: raise phase-1 failures as :class:`_Unverified` (the caller moves on to
            an older set) rather than as they are.

    Raises:
        CheckpointError: the set does not verify (the member and the check named), or does
            not fit the objects; nothing live has changed.
        OSError: from the file system; nothing live has changed.
    """
    _require_module(model)
    placement = placement_for(model)
    if placement is not LOCAL:
        return _restore_sharded(folder, model, optimizer, scheduler, rng)
    with contextlib.ExitStack() as stack:
        try:
            verified = stack.enter_context(VerifiedSet.open(folder, streaming=True))
            state = verified.training_state()
        except (CheckpointError, OSError) as exc:
            if fallback:
                raise _Unverified() from exc
            raise

        def digests_verified() -> None:
            try:
                verified.finish_digests()
            except (CheckpointError, OSError) as exc:
                if fallback:
                    raise _Unverified() from exc
                raise

        return _fit_and_commit(
            placement,
            verified,
            state,
            verified.manifest,
            model,
            optimizer,
            scheduler,
            rng,
            digests_verified,
        )


def _fit_and_commit(
    placement: Placement,
    verified: VerifiedSet | None,
    state: Any,
    manifest: Any,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    scheduler: Any,
    rng: bool,
    digests_verified: Callable[[], None] = lambda: None,
) -> Restored:
    """Phase 2 (see the module docstring); ``verified`` is ``None`` on a rank that does not
    read the files.

    Args:
        digests_verified: returns once the members' digests (hashed while the loads are
            planned from the same handles) have been checked, or raises why not. A damaged
            member takes precedence over the error its plan raised: it is why the plan
            failed.
    """

    def member(role: str) -> Any:
        if verified is None:
            return Path(manifest.members[role].file)  # never opened on this rank
        return verified.file(role)

    def fits() -> training_state.Application:
        _check_names(manifest.state, model)
        if optimizer is not None and "optimizer" not in manifest.members:
            raise CheckpointError("an optimizer was given, and the set holds no optimizer member")
        return training_state.prepare(state, optimizer, scheduler, rng)

    application = placement.agree(fits)  # every rank goes on, or every rank raises
    with contextlib.ExitStack() as plans:
        try:
            if manifest.members["model"].file == MODEL_FLOAT32_FILE:
                model_plan = float32_files.plan_load(placement, model, member("model"), staged=True)
            else:
                model_plan = bits_files.plan_load(placement, model, member("model"))
            plans.enter_context(model_plan)
            optimizer_plan = None
            if optimizer is not None:
                optimizer_plan = optimizer_files.plan_load(
                    placement, optimizer, model, member("optimizer"), False
                )
                plans.enter_context(optimizer_plan)
        except (CheckpointError, OSError):
            digests_verified()  # a damaged member is the reason, if there is one
            raise
        digests_verified()
        if verified is not None:
            placement.agree(verified.confirm_unchanged)
        else:
            placement.agree(lambda: None)
        with committing():
            application.apply_scheduler()
            model_plan.commit()
            if optimizer_plan is not None:
                optimizer_plan.commit()
            application.apply()
    extra = state.extra
    return Restored(state.step, state.random_counter, extra)


def _restore_sharded(
    folder: str | os.PathLike,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    scheduler: Any,
    rng: bool,
) -> Restored:
    """Rank 0 verifies and reads the documents, every rank gets them, every rank plans and
    commits (the loads are collectives)."""
    from ..codec.set_documents import parse_manifest, parse_training_state
    from ..formats.checkpoint_set import (
        MANIFEST_FILE,
        MAX_MANIFEST_BYTES,
        MAX_TRAINING_STATE_BYTES,
    )
    from .collectives import broadcast_bytes, is_writer

    placement = placement_for(model)
    with contextlib.ExitStack() as stack:

        def verify() -> VerifiedSet | None:
            if not is_writer():
                return None
            opened = stack.enter_context(VerifiedSet.open(folder))
            opened.training_state()
            return opened

        verified = placement.agree(verify)
        manifest_bytes = training_bytes = None
        if verified is not None:
            manifest_bytes = (Path(folder) / MANIFEST_FILE).read_bytes()
            training_bytes = verified.file("training_state").read()
        manifest = parse_manifest(broadcast_bytes(manifest_bytes), MAX_MANIFEST_BYTES)
        state = parse_training_state(broadcast_bytes(training_bytes), MAX_TRAINING_STATE_BYTES)
        return _fit_and_commit(
            placement, verified, state, manifest, model, optimizer, scheduler, rng
        )


def restore_latest(
    directory: str | os.PathLike,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    scheduler: Any,
    rng: bool,
) -> Restored:
    """Restore the newest set that verifies, passing over (with a warning naming the set,
    the member and the check) every newer one that does not.

    Raises:
        CheckpointError: no set verifies; or the newest verified set does not fit the
            objects (not a reason to fall back: an older one would not fit either).
    """
    for step in reversed(candidate_steps(directory)):
        try:
            return restore_set(
                set_path(directory, step), model, optimizer, scheduler, rng, fallback=True
            )
        except _Unverified as skipped:
            warn_skipped(step, skipped.__cause__ or skipped)
    raise CheckpointError(
        f"no checkpoint set in {os.fspath(directory)} verifies", path=os.fspath(directory)
    )


# --------------------------------------------------------------------------- public functions


def save_checkpoint(
    path: str | os.PathLike,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any = None,
    random_counter: int | None = None,
    extra: Any = None,
    step: int = 0,
    overwrite: bool = False,
) -> Path:
    """Save a whole training state as one checkpoint set: the folder ``path``, committed
    atomically (a crash leaves the previous folder or none, and a recognisable leftover).

    Args:
        path: the set's folder; it must not exist unless ``overwrite``.
        model: the model (``TLSF32B`` when float32, else exact-bits JSON).
        optimizer: its Adam/AdamW optimizer, if any.
        scheduler: its learning-rate scheduler, if any.
        random_counter: the run's random counter, if it has one.
        extra: anything else, of JSON values (exactly, or refused).
        step: the step the set records.
        overwrite: replace an existing set at ``path``.

    Returns:
        The set's folder.

    Raises:
        CheckpointError: something cannot be saved exactly (named); nothing is written.
        FileExistsError: ``path`` exists and ``overwrite`` is false.
        OSError: from the file system; nothing is committed.

    Example:
        >>> save_checkpoint("ckpt", model=model, optimizer=opt, step=100)  # doctest: +SKIP
    """
    source = live_source(step, model, optimizer, scheduler, random_counter, extra)
    return write_set(path, step, source, overwrite=overwrite)


def load_checkpoint(
    path: str | os.PathLike,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any = None,
    rng: bool = False,
) -> Restored:
    """Verify the checkpoint set at ``path`` and restore it, all or nothing.

    Every member's size and digest is checked before anything live changes; the model and
    optimizer loads are read from the very handles that were hashed; the model, optimizer,
    scheduler, every param group's hyperparameters (``lr`` included) and, with ``rng``, the
    global random states are then written in one block with Ctrl-C held back.

    Args:
        path: the set's folder.
        model, optimizer, scheduler: the live objects, built as for the saved run.
        rng: also restore torch's, CUDA's, numpy's and ``random``'s global states.

    Returns:
        The set's step, random counter and ``extra``.

    Raises:
        IntegrityError: a member is missing or damaged (named, with the check).
        CheckpointError: the set is malformed or does not fit the objects (tensor names or
            shapes, optimizer, param groups, scheduler, random states); nothing has changed.
        OSError: from the file system; nothing has changed.
    """
    return restore_set(path, model, optimizer, scheduler, rng)
