"""Checkpoint sets of any training state, written: several models, optimizers and schedulers
(:mod:`.set_structure`), model members in the family ``model_format`` chooses, with a
version-2 manifest (:mod:`tlckpt.codec.sets.set_manifest_v2`); restored by
:mod:`.multi_set_restoring`.

A set that version 1 describes — one model in a TorchLean family without tied tensors, at most
one Adam/AdamW optimizer and one scheduler, each given as one object — is written by
:mod:`.set_writing` as before (byte-identical, readable by earlier versions);
:func:`set_source` decides. Everything else is written here: each model member in its family
(``TLSF32B``, exact-bits JSON, or the safetensors layout with tied tensors once), each
optimizer member bound to the parameters it holds
(:func:`~.set_structure.bound_parameters`), the training-state document (every optimizer's
param groups in structure order; several schedulers' states under their keys), then the
manifest, which records each member's names, shapes, ties, models and group count.

A sharded (DTensor) model whose member is in the safetensors layout (a bf16 FSDP2 model) is
written with a version-2 manifest by :mod:`.set_writing`'s collective writer, every rank its
own bytes (:func:`set_source` returns a :class:`SetSource` with the manifest's structure):
one model, at most one Adam/AdamW optimizer and one scheduler, each one object. Several
models, or other optimizers, of a sharded model are refused with a
:class:`CheckpointError`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from ...codec.errors import CheckpointError
from ...codec.safetensors.family import SAFETENSORS_FAMILY
from ...codec.sets.remote_set_writer import RemoteOptions
from ...codec.sets.set_document_writing import build_training_state
from ...formats.checkpoint_set import (
    MODEL_BITS_VERSION,
    SAFETENSORS_MEMBER_VERSION,
    TRAINING_STATE_FAMILY,
    TRAINING_STATE_FILE,
    TRAINING_STATE_VERSION,
)
from ...formats.float32_state import WRITTEN_VERSION as FLOAT32_VERSION
from ..ops import bits_files, float32_files, optimizer_files
from ..ops.named_module_state import save_named_state
from ..ops.state_tensors import state_tensors, tied_copies
from ..placement.choice import placement_for
from ..placement.local_placement import LOCAL
from . import training_state
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
from .set_writing import SetSource, live_source, open_set_writer, write_set
from .snapshot import ManySnapshot, Snapshotter

__all__ = ["StructuredSource", "set_source", "snapshot_structured", "write_structured", "write_any"]


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
        and not _has_ties(models.objects()[0])
    )


def _has_ties(model: Any) -> bool:
    """Whether a local model has tied tensors (one tensor under several names, GPT-2's
    ``lm_head.weight`` and ``transformer.wte.weight``): version 1's manifest cannot record
    which names are tied, and exporting the set as Hugging Face does (one name kept) needs
    that record — equal values are no proof of a tie. Such a set is written as version 2."""
    if placement_for(model) is not LOCAL:
        return False  # sharded models: version 1, as before (ties are not sharded)
    return bool(tied_copies(state_tensors(model)))


def _check_sharded(models: Role, optimizers: Role, schedulers: Role) -> None:
    """Refuse a version-2 set of a sharded model that the collective writer cannot write:
    it writes one model (its safetensors member by the parallel path), at most one
    Adam/AdamW optimizer (whose sharded path exists) and one scheduler, each one object.

    Raises:
        CheckpointError: another structure, or another optimizer (named).
    """
    if models.kind != "single" or optimizers.kind not in (None, "single"):
        raise CheckpointError(
            "a sharded (DTensor) model can be saved in a set of one model, one Adam/AdamW"
            " optimizer and one scheduler, each given as one object; this set has more",
            field="model",
        )
    for opt in optimizers.objects():
        if not is_adam(opt):
            raise CheckpointError(
                f"a sharded (DTensor) model's optimizer in a set must be Adam or AdamW, not"
                f" {type(opt).__name__}: other optimizers' trees are written by one process",
                field="optimizer",
                actual=type(opt).__name__,
            )
    if schedulers.kind not in (None, "single"):
        raise CheckpointError(
            "a sharded (DTensor) model's set takes one scheduler, given as one object",
            field="scheduler",
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
            no model, a sharded model in a set of several objects or with an optimizer other
            than Adam/AdamW, or a training-state value that cannot be saved exactly (named).
        ValueError: an unknown ``model_format``.
    """
    models = structured("model", model)
    optimizers = structured("optimizer", optimizer)
    schedulers = structured("scheduler", scheduler)
    families = [member_family(m, model_format) for m in models.objects()]
    if _version_1(models, optimizers, schedulers, families):
        return live_source(step, model, optimizer, scheduler, random_counter, extra)
    sharded = any(placement_for(m) is not LOCAL for m in models.objects())
    if sharded:
        _check_sharded(models, optimizers, schedulers)
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
    if sharded:  # one model, at most one Adam/AdamW: version 1's members, collectively
        live = live_source(step, model, optimizer, scheduler, random_counter, extra)
        structure = {
            "model": models.described(),
            "optimizer": optimizers.described(),
            "scheduler": schedulers.described(),
        }
        return replace(live, structure=structure, details=details)
    data = build_training_state(
        step,
        random_counter,
        _scheduler_state(schedulers),
        groups if optimizers.kind is not None else None,
        training_state.current_rng_states(),
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
    remote: RemoteOptions | None = None,
) -> Path | str:
    """Write and commit a version-2 set (see the module docstring); ``path`` may be a URL
    (``remote``: its store's options).

    Raises:
        FileExistsError: ``path`` exists and ``overwrite`` is false.
        CheckpointError: a member could not be written (named); nothing is committed.
        OSError: from the file system; nothing is committed.
    """
    with open_set_writer(path, step, overwrite=overwrite, key=key, remote=remote) as writer:
        for (k, _), state, family in zip(source.models.items, source.states, source.families):
            role = source.models.member("model", k)
            if family == TLSF32:
                with writer.member(role, role + family, FLOAT32_VERSION) as f:
                    float32_files.save(LOCAL, state, f)  # every model here is local
            elif family == JSON:
                with writer.member(role, role + family, MODEL_BITS_VERSION) as f:
                    bits_files.save(LOCAL, state, f, False)
            else:
                with writer.member(
                    role, role + family, SAFETENSORS_MEMBER_VERSION, SAFETENSORS_FAMILY.name
                ) as f:
                    save_named_state(state, f)
        for (k, live), optimizer, params in zip(
            source.optimizers.items, source.writers, source.params
        ):
            role = source.optimizers.member("optimizer", k)
            file = role + (".tladam" if is_adam(live) else SAFETENSORS)
            with writer.member(role, file) as f:
                version = optimizer_files.save(LOCAL, optimizer, params, f, None)
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
    remote: RemoteOptions | None = None,
) -> Path | str:
    """Write a set from either kind of source (:func:`set_source`), to a folder or a URL
    (``remote``: its store's options).

    Raises:
        As :func:`write_structured` and :func:`~.set_writing.write_set`.
    """
    if isinstance(source, StructuredSource):
        return write_structured(path, step, source, overwrite=overwrite, key=key, remote=remote)
    return write_set(path, step, source, overwrite=overwrite, key=key, remote=remote)
