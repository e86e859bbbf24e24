"""Checkpoint sets of any training state: several models, optimizers and schedulers
(:mod:`.set_structure`), model members in the family ``model_format`` chooses, written with a
version-2 manifest (:mod:`tlckpt.codec.set_manifest_v2`) and restored all or nothing.

A set that version 1 describes — one model in a TorchLean family, at most one Adam/AdamW
optimizer and one scheduler, each given as one object — is written by
:mod:`.set_writing` as before (byte-identical, readable by earlier versions);
:func:`set_source` decides. Everything else goes through here:

* writing: each model member in its family (``TLSF32B``, exact-bits JSON, or the
  safetensors layout with tied tensors once), each optimizer member bound to the
  parameters it holds (:func:`~.set_structure.bound_parameters`), the training-state
  document (every optimizer's param groups in structure order; several schedulers' states
  under their keys), then the manifest, which records each member's names, shapes, ties,
  models and group count;
* restoring: the structure given must be the saved one (kinds and keys), every model's
  tensor names and shapes and every optimizer's binding must fit, then every model,
  optimizer, scheduler and param group is planned off to the side, every digest is
  completed, and one commit block (Ctrl-C held back) writes them all — the schedulers first,
  all rolled back together if one refuses.

Sharded (DTensor) models are supported in version-1 sets only: several models, or a
safetensors member, of a sharded model are refused with a :class:`CheckpointError`.
"""

from __future__ import annotations

import contextlib
import copy
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from ..codec.checkpoint_set import SetWriter, VerifiedSet
from ..codec.errors import CheckpointError, ConfigError, MalformedError, SchemaMismatchError
from ..codec.set_documents import TrainingState, build_training_state
from ..formats.checkpoint_set import (
    MODEL_BITS_VERSION,
    TRAINING_STATE_FAMILY,
    TRAINING_STATE_FILE,
    TRAINING_STATE_VERSION,
)
from ..formats.float32_state import WRITTEN_VERSION as FLOAT32_VERSION
from . import bits_files, float32_files, optimizer_files, training_state
from .local_placement import LOCAL
from .module_state import save_module_state, save_state_bits
from .named_module_state import plan_named_load, save_named_state
from .optimizer import save_optimizer
from .placement import placement_for
from .plans import committing
from .rollback import Rollback
from .set_structure import (
    JSON,
    SAFETENSORS,
    TLSF32,
    Role,
    bound_parameters,
    is_adam,
    member_family,
    structured,
)
from .set_writing import SetSource, live_source, write_set
from .snapshot import ManySnapshot, Snapshotter
from .state_tensors import state_tensors, tied_copies

__all__ = [
    "StructuredSource",
    "set_source",
    "snapshot_structured",
    "write_structured",
    "write_any",
    "restore_structured",
    "targets_structured",
]

#: The family a manifest records of a safetensors member, and its version (the layout has
#: none: 0).
_SAFETENSORS_FAMILY = "safetensors"


@dataclass
class StructuredSource:
    """What a version-2 set is written from (live objects, or a snapshot's copies).

    Attributes:
        models, optimizers: the roles as given (live objects).
        schedulers: the schedulers' structure as the manifest records it.
        states: what each model member is written from (the module, or its copies).
        families: each model member's suffix (``.tlsf32``, ``.json``, ``.safetensors``).
        details: member role → the manifest's version-2 fields of that member.
        writers: what each optimizer member is written from (live, or a stand-in).
        params: each optimizer's parameters by name (live, or their copies).
        training_state: the training-state member's bytes, captured at the call.
    """

    models: Role
    optimizers: Role
    schedulers: Any
    states: list[Any]
    families: list[str]
    details: dict[str, dict[str, Any]]
    writers: list[torch.optim.Optimizer]
    params: list[dict[str, torch.Tensor]]
    training_state: bytes


def _version_1(models: Role, optimizers: Role, schedulers: Role, families: list[str]) -> bool:
    return (
        models.kind == "single"
        and families[0] in (TLSF32, JSON)
        and optimizers.kind in (None, "single")
        and all(is_adam(o) for o in optimizers.objects())
        and schedulers.kind in (None, "single")
    )


def _scheduler_state(schedulers: Role) -> Any:
    if schedulers.kind is None:
        return None
    if schedulers.kind == "single":
        return schedulers.items[0][1].state_dict()
    return {key: s.state_dict() for key, s in schedulers.items}


def set_source(
    step: int,
    model: Any,
    optimizer: Any,
    scheduler: Any,
    random_counter: int | None,
    extra: Any,
    model_format: str = "auto",
) -> SetSource | StructuredSource:
    """The source of a save over the live objects: a version-1 :class:`SetSource` when the
    set fits version 1 (see the module docstring), else a :class:`StructuredSource`.

    Raises:
        CheckpointError: an object of the wrong type, a structure that cannot be written
            (see :func:`~.set_structure.structured`), an optimizer holding a parameter of
            no model, a sharded model in a version-2 set, or a training-state value that
            cannot be saved exactly (named).
        ValueError: an unknown ``model_format``.
    """
    models = structured("model", model)
    optimizers = structured("optimizer", optimizer)
    schedulers = structured("scheduler", scheduler)
    families = [member_family(m, model_format) for m in models.objects()]
    if _version_1(models, optimizers, schedulers, families):
        return live_source(step, model, optimizer, scheduler, random_counter, extra)
    if any(placement_for(m) is not LOCAL for m in models.objects()):
        raise CheckpointError(
            "a sharded (DTensor) model can be saved in a set of one model, one Adam/AdamW"
            " optimizer and one scheduler, each given as one object; this set has more",
            field="model",
        )
    details: dict[str, dict[str, Any]] = {}
    for key, m in models.items:
        named = state_tensors(m)
        details[models.member("model", key)] = {
            "tensors": tuple((n, tuple(t.shape)) for n, t in named),
            "tied": {named[i][0]: named[j][0] for i, j in sorted(tied_copies(named).items())},
        }
    params = []
    groups: list[dict[str, Any]] = []
    for key, opt in optimizers.items:
        role = optimizers.member("optimizer", key)
        binds, named_params = bound_parameters(opt, models, role)
        params.append(named_params)
        details[role] = {
            "models": tuple(models.member("model", b) for b in binds),
            "groups": len(opt.param_groups),
        }
        # The very capture of version 1's param groups and random states.
        groups.extend(training_state._param_groups(opt))
    data = build_training_state(
        step,
        random_counter,
        _scheduler_state(schedulers),
        groups if optimizers.kind is not None else None,
        training_state._rng_states(),
        extra,
    )
    return StructuredSource(
        models,
        optimizers,
        schedulers.described(),
        models.objects(),
        families,
        details,
        optimizers.objects(),
        params,
        data,
    )


def snapshot_structured(
    snapshotter: Snapshotter, live: StructuredSource
) -> tuple[ManySnapshot, StructuredSource]:
    """Copies of every model's and optimizer's state, taken now, and ``live`` with the
    copies in place of the live objects (a background save).

    Raises:
        CheckpointError: a model holds DTensors.
    """
    taken = snapshotter.capture_many(live.models.objects(), live.optimizers.objects())
    params = [{n: taken.copy_of(p) for n, p in named.items()} for named in live.params]
    return taken, replace(live, states=taken.states, writers=taken.optimizers, params=params)


def write_structured(
    path: str | os.PathLike,
    step: int,
    source: StructuredSource,
    *,
    overwrite: bool = False,
    key: Any = None,
) -> Path:
    """Write and commit a version-2 set (see the module docstring).

    Raises:
        FileExistsError: ``path`` exists and ``overwrite`` is false.
        CheckpointError: a member could not be written (named); nothing is committed.
        OSError: from the file system; nothing is committed.
    """
    with SetWriter(path, step, overwrite=overwrite, key=key) as writer:
        for (k, _), state, family in zip(source.models.items, source.states, source.families):
            role = source.models.member("model", k)
            if family == TLSF32:
                with writer.member(role, role + family, FLOAT32_VERSION) as f:
                    save_module_state(state, f)
            elif family == JSON:
                with writer.member(role, role + family, MODEL_BITS_VERSION) as f:
                    save_state_bits(state, f, pretty=False)
            else:
                with writer.member(role, role + family, 0, _SAFETENSORS_FAMILY) as f:
                    save_named_state(state, f)
        for (k, live), optimizer, params in zip(
            source.optimizers.items, source.writers, source.params
        ):
            role = source.optimizers.member("optimizer", k)
            file = role + (".tladam" if is_adam(live) else SAFETENSORS)
            with writer.member(role, file) as f:
                version = save_optimizer(optimizer, params, f)
            writer.set_version(role, version)
        with writer.member(
            "training_state", TRAINING_STATE_FILE, TRAINING_STATE_VERSION, TRAINING_STATE_FAMILY
        ) as f:
            f.write(source.training_state)
        structure = {
            "model": source.models.described(),
            "optimizer": source.optimizers.described(),
            "scheduler": source.schedulers,
        }
        return writer.commit_v2(structure, source.details)


def write_any(
    path: str | os.PathLike,
    step: int,
    source: SetSource | StructuredSource,
    *,
    overwrite: bool = False,
    key: Any = None,
) -> Path:
    """Write a set from either kind of source (:func:`set_source`).

    Raises:
        As :func:`write_structured` and :func:`~.set_writing.write_set`.
    """
    if isinstance(source, StructuredSource):
        return write_structured(path, step, source, overwrite=overwrite, key=key)
    return write_set(path, step, source, overwrite=overwrite, key=key)


# --------------------------------------------------------------------------- restoring


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


def _check_tensors(record: Any, model: torch.nn.Module, role: str) -> None:
    live = [(n, tuple(t.shape)) for n, t in state_tensors(model)]
    saved = list(record.tensors or ())
    if live == saved:
        return
    if len(live) != len(saved):
        raise SchemaMismatchError(
            f"{role}: the set holds {len(saved)} state tensors, the model has {len(live)}",
            field=role,
            actual=len(live),
            expected=len(saved),
        )
    i = next(k for k, (a, b) in enumerate(zip(live, saved)) if a != b)
    what = "names" if live[i][1] == saved[i][1] else "shapes"
    raise SchemaMismatchError(
        f"{role}: state tensor {i} is {saved[i][0]!r} {list(saved[i][1])} in the set and"
        f" {live[i][0]!r} {list(live[i][1])} in the model: the {what} differ",
        field=f"{role}[{i}]",
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
        every scheduler and param group is put back exactly, in place.

        Raises:
            ConfigError: a scheduler refused its state.
            BaseException: what ``load_state_dict`` raised if not an ``Exception``, after
                the rollback.
        """
        if not self.pairs:
            return
        groups = [g for o in self.optimizers for g in o.param_groups]
        lists = [o.param_groups for o in self.optimizers]
        before = Rollback([*(s for s, _ in self.pairs), *lists, *groups])
        try:
            for scheduler, saved in self.pairs:
                scheduler.load_state_dict(copy.deepcopy(saved))
        except BaseException as exc:  # user code: put everything back, whatever it raised
            before.restore()
            if not isinstance(exc, Exception):
                raise
            raise ConfigError(
                f"a scheduler refused the saved state: {type(exc).__name__}: {exc}",
                field="scheduler",
            ) from exc


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
        _check_tensors(manifest.members[role], m, role)
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
