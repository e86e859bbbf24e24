"""Checkpoint sets of any training state, restored (written by :mod:`.multi_set_writing`): sets of
several models, optimizers and schedulers, or with members of other families, all or nothing.

The structure given must be the saved one (kinds and keys), every model's tensor names and
shapes and every optimizer's binding must fit, then every model, optimizer, scheduler and
param group is planned off to the side, every digest is completed, and one commit block
(Ctrl-C held back) writes them all — the schedulers first, all rolled back together if one
refuses. Sharded (DTensor) models are restored by :mod:`.set_restoring` (version-1 sets, and
version-2 sets of one model, at most one Adam/AdamW optimizer and one scheduler).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch

from ...codec.errors import CheckpointError, ConfigError, MalformedError, SchemaMismatchError
from ...codec.sets.checkpoint_set import VerifiedSet
from ...codec.sets.set_documents import TrainingState
from ..commit.plans import committing
from ..ops import bits_files, float32_files, optimizer_files
from ..ops.named_module_state import plan_named_load
from ..ops.state_tensors import state_tensors
from ..placement.choice import placement_for
from ..placement.local_placement import LOCAL
from . import training_state
from .set_structure import (
    JSON,
    TLSF32,
    Role,
    bound_parameters,
    structured,
)

__all__ = ["restore_structured", "targets_structured", "check_state_tensors"]


def targets_structured(model: Any, optimizer: Any, scheduler: Any) -> bool:
    """Whether a restore's objects are given as sequences or mappings (a version-2 set)."""
    return any(
        isinstance(v, (list, tuple, Mapping))
        and not isinstance(v, (torch.nn.Module, torch.optim.Optimizer))
        for v in (model, optimizer, scheduler)
    )


def _saved_structure(verified: VerifiedSet, state: TrainingState) -> dict[str, Any]:
    manifest = verified.manifest
    if manifest.structure is not None:
        return dict(manifest.structure)
    # Version 1: one of each, as one object.
    return {
        "model": ("single", ()),
        "optimizer": ("single", ()) if "optimizer" in manifest.members else None,
        "scheduler": ("single", ()) if state.scheduler is not None else None,
    }


def _describe(entry: Any) -> str:
    if entry is None:
        return "none"
    kind, keys = entry
    return "one object" if kind == "single" else f"a {kind} of keys {list(keys)}"


def _check_structure(saved: dict[str, Any], given: dict[str, Role]) -> None:
    for role, live in given.items():
        want = saved.get(role)
        have = live.described()
        if have is None and role != "model":
            continue  # a role not given is not restored
        if have != want:
            raise SchemaMismatchError(
                f"the set holds {_describe(want)} as its {role}, and {_describe(have)} was"
                " given: a restore takes the structure the set was saved with",
                field=f"structure.{role}",
                actual=_describe(have),
                expected=_describe(want),
            )


def check_state_tensors(saved: Any, model: torch.nn.Module, role: str | None = None) -> None:
    """Check a model's state tensors against those a set records, in order.

    Args:
        saved: the recorded ``(name, shape)`` pairs (a version-1 manifest's ``state``, a
            version-2 model member's ``tensors``).
        model: the live model.
        role: the model's member in a version-2 set (named in the message and the field);
            ``None`` for a version-1 set (field ``state``).

    Raises:
        SchemaMismatchError: their number, or a name or shape, differs (the first named).
    """
    live = [(n, tuple(t.shape)) for n, t in state_tensors(model)]
    saved = list(saved)
    if live == saved:
        return
    where, field = ("", "state") if role is None else (f"{role}: ", role)
    if len(live) != len(saved):
        raise SchemaMismatchError(
            f"{where}the set holds {len(saved)} state tensors, the model has {len(live)}",
            field=field,
            actual=len(live),
            expected=len(saved),
        )
    i = next(k for k, (a, b) in enumerate(zip(live, saved)) if a != b)
    what = "names" if live[i][1] == saved[i][1] else "shapes"
    raise SchemaMismatchError(
        f"{where}state tensor {i} is {saved[i][0]!r} {list(saved[i][1])} in the set and"
        f" {live[i][0]!r} {list(live[i][1])} in the model: the {what} differ (a model whose"
        " layers are registered in another order is refused even when the shapes agree)",
        field=f"{field}[{i}]",
        actual=live[i],
        expected=saved[i],
    )


@dataclass
class _Schedulers:
    """Every scheduler's load, staged together: one rollback for all of them."""

    pairs: list[tuple[Any, Any]]
    optimizers: list[torch.optim.Optimizer]

    def apply(self) -> None:
        """Load every scheduler's state (first in the commit: user code); if one raises,
        every scheduler and param group is put back exactly, in place
        (:func:`~.training_state.load_schedulers`)."""
        training_state.load_schedulers(self.pairs, self.optimizers)


def _scheduler_pairs(schedulers: Role, state: TrainingState) -> list[tuple[Any, Any]]:
    if schedulers.kind is None:
        return []
    if schedulers.kind == "single":
        values = [state.scheduler]
    else:
        if type(state.scheduler) is not dict or sorted(state.scheduler) != sorted(
            k for k, _ in schedulers.items
        ):
            raise MalformedError(
                "the training state's scheduler states are not keyed as the set's schedulers",
                field="scheduler",
            )
        values = [state.scheduler[k] for k, _ in schedulers.items]
    for (k, _), value in zip(schedulers.items, values):
        if type(value) is not dict:
            raise ConfigError(
                f"the set's scheduler state {k!r} is not a mapping", field=f"scheduler.{k}"
            )
    return list(zip(schedulers.objects(), values))


def _model_plan(file_name: str, model: torch.nn.Module, f: Any) -> Any:
    if file_name.endswith(TLSF32):
        return float32_files.plan_load(LOCAL, model, f, staged=True)
    if file_name.endswith(JSON):
        return bits_files.plan_load(LOCAL, model, f)
    return plan_named_load(model, f, strict=True)[0]


def restore_structured(
    verified: VerifiedSet,
    state: TrainingState,
    model: Any,
    optimizer: Any,
    scheduler: Any,
    rng: bool,
    digests_verified: Callable[[], None],
) -> tuple[int, int | None, Any]:
    """Fit the live objects to a verified set and restore it, all or nothing (see the
    module docstring).

    Returns:
        The set's step, random counter and ``extra``.

    Raises:
        SchemaMismatchError: another structure, tensor names or shapes, or an optimizer
            bound to other models; nothing has changed.
        CheckpointError: a member does not fit or does not verify; nothing has changed.
    """
    manifest = verified.manifest
    models = structured("model", model)
    optimizers = structured("optimizer", optimizer)
    schedulers = structured("scheduler", scheduler)
    saved = _saved_structure(verified, state)
    _check_structure(saved, {"model": models, "optimizer": optimizers, "scheduler": schedulers})
    if any(placement_for(m) is not LOCAL for m in models.objects()):
        raise CheckpointError(
            "a sharded (DTensor) model is restored from sets of one model, one Adam/AdamW"
            " optimizer and one scheduler only",
            field="model",
        )
    for k, m in models.items:
        role = models.member("model", k)
        check_state_tensors(manifest.members[role].tensors or (), m, role)
    # Every saved optimizer's param groups, in structure order.
    offsets: dict[str, tuple[int, int]] = {}
    at = 0
    if saved["optimizer"] is not None:
        kind, keys = saved["optimizer"]
        for k in keys or ("",):
            role = "optimizer" if kind == "single" else f"optimizer.{k}"
            n = manifest.members[role].groups or 0
            offsets[role] = (at, at + n)
            at += n
    if offsets and (state.param_groups is None or len(state.param_groups) != at):
        raise MalformedError(
            "the training state's param groups do not add up to the optimizers' counts",
            field="param_groups",
        )
    bindings = []
    applications = []
    for k, opt in optimizers.items:
        role = optimizers.member("optimizer", k)
        record = manifest.members[role]
        keys, params = bound_parameters(opt, models, role)
        binds = tuple(models.member("model", b) for b in keys)
        if record.models is not None and tuple(record.models) != binds:
            raise SchemaMismatchError(
                f"{role} holds parameters of the models {list(binds)}, the set's of"
                f" {list(record.models)}",
                field=f"members.{role}.models",
                actual=list(binds),
                expected=list(record.models),
            )
        start, end = offsets[role]
        groups = state.param_groups[start:end] if state.param_groups is not None else None
        view = replace(state, param_groups=groups, scheduler=None)
        applications.append(training_state.prepare(view, opt, None, False))
        bindings.append((role, opt, params))
    schedule = _Schedulers(_scheduler_pairs(schedulers, state), optimizers.objects())
    for s in schedulers.objects():
        linked = getattr(s, "optimizer", None)
        if isinstance(linked, torch.optim.Optimizer) and linked not in schedule.optimizers:
            schedule.optimizers.append(linked)
    randoms = training_state.prepare(replace(state, param_groups=None), None, None, rng)
    with contextlib.ExitStack() as plans:
        try:
            model_plans = [
                plans.enter_context(
                    _model_plan(
                        manifest.members[models.member("model", k)].file,
                        m,
                        verified.file(models.member("model", k)),
                    )
                )
                for k, m in models.items
            ]
            optimizer_plans = [
                plans.enter_context(
                    optimizer_files.plan_load(LOCAL, opt, params, verified.file(role), False)
                )
                for role, opt, params in bindings
            ]
        except (CheckpointError, OSError):
            digests_verified()  # a damaged member is the reason, if there is one
            raise
        digests_verified()
        verified.confirm_unchanged()
        with committing():
            schedule.apply()
            for plan in model_plans:
                plan.commit()
            for plan in optimizer_plans:
                plan.commit()
            for application in applications:
                application.apply()
            randoms.apply()
    return state.step, state.random_counter, state.extra
