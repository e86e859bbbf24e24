"""Restoring a checkpoint set into torch objects, all or nothing: the two phases of
:mod:`.checkpoint_sets`' docstring, one set (:func:`restore_set`) or the newest that verifies
(:func:`restore_latest`).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ...codec.errors import CheckpointError, FileChangedError
from ...codec.sets.checkpoint_set import VerifiedSet, newest_usable
from ...codec.sets.set_documents import parse_manifest, parse_training_state
from ...codec.sets.set_folders import set_path
from ...codec.sets.set_keys import as_key
from ...codec.sets.set_manifest_v3 import is_state_tree_set
from ...formats.checkpoint_set import (
    MAX_MANIFEST_BYTES,
    MAX_TRAINING_STATE_BYTES,
    MODEL_FLOAT32_FILE,
    OPTIMIZER_FILE,
)
from ..commit.plans import committing
from ..ops import bits_files, float32_files, optimizer_files, sharded_named_state
from ..ops.state_tensors import require_module
from ..placement.choice import placement_for
from ..placement.collectives import broadcast_bytes, is_writer
from ..placement.local_placement import LOCAL
from ..placement.placement_protocol import Placement
from . import training_state
from .multi_set_restoring import check_state_tensors, restore_structured, targets_structured
from .set_structure import SAFETENSORS

__all__ = ["Restored", "Targets", "restore_set", "restore_latest"]


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


@dataclass(frozen=True)
class Targets:
    """The live objects a set is restored into.

    Attributes:
        model: the model.
        optimizer: its optimizer, or ``None``.
        scheduler: its learning-rate scheduler, or ``None``.
        rng: also restore the global random states.
    """

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer | None = None
    scheduler: Any = None
    rng: bool = False


class _Unverified(Exception):
    """Phase 1 failed: the set is damaged or incomplete (``__cause__`` says how)."""


def restore_set(
    folder: str | os.PathLike,
    targets: Targets,
    *,
    fallback: bool = False,
    key: Any = None,
) -> Restored:
    """Verify the set in ``folder`` and restore it into the live objects, all or nothing.

    Args:
        fallback: raise phase-1 failures as :class:`_Unverified` (the caller moves on to
            an older set) rather than as they are (a set that does not authenticate with
            ``key`` is one).
        key: the key the set must be signed with (32 bytes or a ``SetKey``); ``None``: it
            must be unsigned.

    Raises:
        CheckpointError: the set does not verify (the member and the check named), or does
            not fit the objects; nothing live has changed.
        OSError: from the file system; nothing live has changed.
    """
    structured = targets_structured(targets.model, targets.optimizer, targets.scheduler)
    if not structured:
        require_module(targets.model)
    key = as_key(key)  # a bad key is the caller's error, never a set to pass over
    placement = LOCAL if structured else placement_for(targets.model)
    if placement is not LOCAL:
        return _restore_sharded(placement, folder, targets, key)
    with contextlib.ExitStack() as stack:
        try:
            verified = stack.enter_context(VerifiedSet.open(folder, streaming=True, key=key))
            state = verified.training_state()
        except (CheckpointError, OSError) as exc:
            if fallback:
                raise _Unverified() from exc
            raise

        if is_state_tree_set(verified.manifest):
            raise CheckpointError(
                "the set is of one state tree (a framework's whole checkpoint, manifest"
                " version 3), not of a model: load it with the framework's plug-in"
                " (tlckpt.integrations.lightning.TlckptCheckpointIO)",
                path=folder,
                field="version",
                actual=verified.manifest.version,
            )

        def digests_verified() -> None:
            try:
                verified.finish_digests()
            except (CheckpointError, OSError) as exc:
                if fallback:
                    raise _Unverified() from exc
                raise

        if structured or verified.manifest.version != 1:
            # Sets of several objects, or of other families: :mod:`.multi_set_restoring`.
            step, counter, extra = restore_structured(
                verified,
                state,
                targets.model,
                targets.optimizer,
                targets.scheduler,
                targets.rng,
                digests_verified,
            )
            return Restored(step, counter, extra)
        return _fit_and_commit(
            placement,
            verified,
            state,
            verified.manifest,
            targets,
            digests_verified,
        )


def _fit_and_commit(
    placement: Placement,
    verified: VerifiedSet | None,
    state: Any,
    manifest: Any,
    targets: Targets,
    digests_verified: Callable[[], None] = lambda: None,
    folder: str | os.PathLike | None = None,
) -> Restored:
    """Phase 2 (see :mod:`.checkpoint_sets`); ``verified`` is ``None`` on a rank that does not
    read the files.

    A sharded set (``folder`` given, every rank the same): the loads open the members by
    their paths, so that every rank reads its own pieces in parallel where the ranks share
    a file system (:mod:`..placement.io_choice`); rank 0 checks before and after that each
    path still names the very file it verified, unchanged.

    Args:
        digests_verified: returns once the members' digests (hashed while the loads are
            planned from the same handles) have been checked, or raises why not. A damaged
            member takes precedence over the error its plan raised: it is why the plan
            failed.
    """

    model, optimizer = targets.model, targets.optimizer

    def member(role: str) -> Any:
        if folder is not None:
            return Path(folder) / manifest.members[role].file
        if verified is None:
            return Path(manifest.members[role].file)  # never opened on this rank
        return verified.file(role)

    def still_verified(final: bool = True) -> None:
        if verified is not None:
            if folder is not None:
                if final:
                    verified.finish_digests()  # sharded: hashed aside while the ranks staged
                _names_verified(verified)
            verified.confirm_unchanged()

    def fits() -> training_state.Application:
        saved = manifest.state if manifest.version == 1 else manifest.members["model"].tensors
        check_state_tensors(saved or (), model)
        if optimizer is not None and "optimizer" not in manifest.members:
            raise CheckpointError("an optimizer was given, and the set holds no optimizer member")
        return training_state.prepare(state, optimizer, targets.scheduler, targets.rng)

    application = placement.agree(fits)  # every rank goes on, or every rank raises
    if folder is not None:
        placement.agree(lambda: still_verified(final=False))
    with contextlib.ExitStack() as plans:
        try:
            model_file = manifest.members["model"].file
            if model_file == MODEL_FLOAT32_FILE:
                model_plan = float32_files.plan_load(placement, model, member("model"), staged=True)
            elif model_file.endswith(SAFETENSORS):
                model_plan = sharded_named_state.plan_load(placement, model, member("model"))
            else:
                model_plan = bits_files.plan_load(placement, model, member("model"))
            plans.enter_context(model_plan)
            optimizer_plan = None
            if optimizer is not None:
                # The member's hyperparameters are the truth: read, not compared with the
                # live optimizer's (a fresh one has its defaults), installed below.
                optimizer_plan = optimizer_files.plan_load(
                    placement, optimizer, model, member("optimizer"), False, adopt_config=True
                )
                plans.enter_context(optimizer_plan)
        except (CheckpointError, OSError):
            digests_verified()  # a damaged member is the reason, if there is one
            raise
        digests_verified()
        placement.agree(still_verified)
        if optimizer_plan is not None:
            member_groups = optimizer_plan.member_groups
            placement.agree(lambda: application.adopt_member(member_groups))
        with committing():
            application.apply_scheduler()
            model_plan.commit()
            if optimizer_plan is not None:
                optimizer_plan.commit()
            application.apply()
    extra = state.extra
    return Restored(state.step, state.random_counter, extra)


def _restore_sharded(
    placement: Placement,
    folder: str | os.PathLike,
    targets: Targets,
    key: Any = None,
) -> Restored:
    """Rank 0 opens the set once, verifying (and authenticating) it and parsing its
    documents; the other ranks get the very bytes it verified and parse them; every rank
    plans and commits (the loads are collectives, reading the members by path: every rank
    its own pieces where they share a file system)."""
    with contextlib.ExitStack() as stack:

        def verify() -> tuple[VerifiedSet, Any] | None:
            if not is_writer():
                return None
            # The large members' digests are computed on a thread while every rank stages
            # its loads (nothing live changes before they are compared: ``still_verified``).
            opened = stack.enter_context(VerifiedSet.open(folder, key=key, streaming=True))
            return opened, opened.training_state()

        checked = placement.agree(verify)
        if checked is not None:  # rank 0: what it verified, parsed once
            verified, state = checked
            manifest = verified.manifest
            broadcast_bytes(verified.manifest_bytes)
            broadcast_bytes(verified.file("training_state").read())  # the handle it checked
            stack.enter_context(_digests_aside(verified))
        else:
            verified = None
            manifest = parse_manifest(broadcast_bytes(None), MAX_MANIFEST_BYTES, authenticate=False)
            state = parse_training_state(broadcast_bytes(None), MAX_TRAINING_STATE_BYTES)
        if manifest.version != 1 and not _one_of_each(manifest):
            raise CheckpointError(
                "a sharded (DTensor) model is restored from sets of one model, one"
                " Adam/AdamW optimizer and one scheduler only; this set is of version"
                f" {manifest.version} with several objects or another optimizer",
                field="version",
            )
        return _fit_and_commit(placement, verified, state, manifest, targets, folder=folder)


def _one_of_each(manifest: Any) -> bool:
    """Whether a version-2 set holds what a sharded restore restores: one model (any
    family), at most one Adam/AdamW optimizer bound to it, one scheduler, each one object."""
    structure = manifest.structure or {}
    single = ("single", ())
    optimizer = manifest.members.get("optimizer")
    return (
        manifest.version == 2
        and structure.get("model") == single
        and structure.get("optimizer") in (None, single)
        and structure.get("scheduler") in (None, single)
        and (optimizer is None or optimizer.file == OPTIMIZER_FILE)
    )


@contextlib.contextmanager
def _digests_aside(verified: VerifiedSet) -> Iterator[None]:
    """Hash the streamed members (:meth:`VerifiedSet.finish_digests`) on a thread of their
    own; the set's ``finish_digests`` then waits for it and raises what it found. Left
    early, the block still waits (the handles close after it)."""
    outcome: list[BaseException] = []

    def run() -> None:
        try:
            finish()
        except BaseException as exc:  # re-raised by the caller's finish_digests
            outcome.append(exc)

    finish = verified.finish_digests
    thread = threading.Thread(target=run, name="tlckpt-verify", daemon=True)
    thread.start()

    def finished() -> None:
        thread.join()
        if outcome:
            raise outcome[0]

    verified.finish_digests = finished  # type: ignore[method-assign]
    try:
        yield
    finally:
        thread.join()


def _names_verified(verified: VerifiedSet) -> None:
    """Raise :class:`FileChangedError` if a member's path no longer names the file that was
    verified (another file renamed over it): a load that opens the path would read that one."""
    for role, opened in verified.members.items():
        now, held = os.stat(opened.path), os.fstat(opened.file.fileno())
        if (now.st_dev, now.st_ino) != (held.st_dev, held.st_ino):
            raise FileChangedError(
                f"member {role} was replaced after it was verified (another file was renamed"
                " over it)",
                path=opened.path,
            )


def restore_latest(
    directory: str | os.PathLike,
    targets: Targets,
    *,
    key: Any = None,
) -> Restored:
    """Restore the newest set that verifies (with ``key``: authenticates), passing over
    (with a warning naming the set, the member and the check) every newer one that does
    not; sets that vanish meanwhile (another process's retention) make it look at the
    directory again, a bounded number of times
    (:func:`~tlckpt.codec.sets.checkpoint_set.newest_usable`).

    Raises:
        CheckpointError: no set verifies; or the newest verified set does not fit the
            objects (not a reason to fall back: an older one would not fit either).
    """
    key = as_key(key)
    # Listed again where sets vanish while they are tried (another process's retention).
    found = newest_usable(
        directory,
        lambda step: restore_set(set_path(directory, step), targets, fallback=True, key=key),
        (_Unverified,),
        reason=lambda skipped: skipped.__cause__ or skipped,
    )
    if found is not None:
        return found[1]
    raise CheckpointError(
        f"no checkpoint set in {os.fspath(directory)} verifies", path=os.fspath(directory)
    )
