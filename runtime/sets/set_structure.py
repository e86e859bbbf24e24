"""The objects of a checkpoint set: one model, optimizer and scheduler each, or sequences
or mappings of them (a GAN's two models; Muon beside AdamW over one model), how each
optimizer binds to the models, and which family each model member is written in.

A role's objects are given as one object (*single*: its member is the role, ``model``), a
list or tuple (*sequence*: keys ``"0"``, ``"1"``, …, members ``model.0``, …) or a mapping
(*mapping*: its keys, which must match
:data:`~tlckpt.formats.checkpoint_set.STRUCTURE_KEY_PATTERN` since they name member
files). A restore must be given the same structure (kinds and keys) as the save.

An optimizer binds to the models holding its parameters, found by identity. Its member
describes the parameters it holds, in the models' slot order
(``named_parameters(remove_duplicate=False)``), under their names in their model — or,
when they lie in two models or more, under names qualified by the model's key
(``G.fc.weight``). A parameter in no model of the set is refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ...codec.errors import CheckpointError, ConfigError, SchemaMismatchError
from ...formats.checkpoint_set import MAX_STRUCTURE_KEYS, STRUCTURE_KEY_PATTERN
from ..binding.tensors import file_dtype_of
from ..ops.state_tensors import state_tensors

__all__ = [
    "MODEL_FORMATS",
    "Role",
    "structured",
    "member_family",
    "bound_parameters",
    "is_adam",
    "TLSF32",
    "JSON",
    "SAFETENSORS",
]

#: ``model_format`` values.
MODEL_FORMATS = ("auto", "torchlean", "safetensors")
#: A model member's family, by its file suffix.
TLSF32, JSON, SAFETENSORS = ".tlsf32", ".json", ".safetensors"


@dataclass(frozen=True)
class Role:
    """One role's objects as given.

    Attributes:
        kind: ``"single"``, ``"sequence"``, ``"mapping"``, or ``None`` (not given).
        items: ``(key, object)`` in order (a single object's key is ``""``).
    """

    kind: str | None
    items: tuple[tuple[str, Any], ...]

    def member(self, role: str, key: str) -> str:
        """The member role of the object of ``key`` (``model``, ``model.G``)."""
        return role if self.kind == "single" else f"{role}.{key}"

    def described(self) -> tuple[str, tuple[str, ...]] | None:
        """As a manifest's structure records it."""
        if self.kind is None:
            return None
        return self.kind, tuple(k for k, _ in self.items) if self.kind != "single" else ()

    def objects(self) -> list[Any]:
        """The objects, in order."""
        return [obj for _, obj in self.items]


_KINDS = {
    "model": (torch.nn.Module, "a torch.nn.Module"),
    "optimizer": (torch.optim.Optimizer, "a torch.optim.Optimizer"),
}


def _check_item(role: str, key: str, obj: Any) -> None:
    where = role if not key else f"{role}[{key!r}]"
    if role in _KINDS:
        kind, what = _KINDS[role]
        if not isinstance(obj, kind):
            raise CheckpointError(f"{where} must be {what}, got {type(obj).__name__}", field=where)
    elif not callable(getattr(obj, "state_dict", None)):
        raise CheckpointError(
            f"{where} must have a state_dict (a learning-rate scheduler), got {type(obj).__name__}",
            field=where,
        )


def structured(role: str, value: Any) -> Role:
    """``value`` (one object, a sequence or a mapping) as a :class:`Role`.

    Raises:
        CheckpointError: an object of the wrong type, an empty sequence or mapping, a
            mapping key that cannot name a member file; ``model`` is ``None``.
    """
    if value is None:
        if role == "model":
            raise CheckpointError("a set needs a model", field="model")
        return Role(None, ())
    single = isinstance(value, (torch.nn.Module, torch.optim.Optimizer)) or not isinstance(
        value, (Mapping, list, tuple)
    )
    if single:
        _check_item(role, "", value)
        return Role("single", (("", value),))
    if isinstance(value, Mapping):
        kind, items = "mapping", list(value.items())
        for key, _ in items:
            if type(key) is not str or not STRUCTURE_KEY_PATTERN.fullmatch(key):
                raise CheckpointError(
                    f"{role} key {key!r} cannot name a member file: keys are 1 to 64 letters,"
                    " digits, '_' or '-' (not starting with '-')",
                    field=role,
                    actual=repr(key)[:80],
                )
    else:
        kind, items = "sequence", [(str(i), obj) for i, obj in enumerate(value)]
    if not items or len(items) > MAX_STRUCTURE_KEYS:
        raise CheckpointError(
            f"{role} is an empty {kind} or has more than {MAX_STRUCTURE_KEYS} objects (pass"
            " None for no object)",
            field=role,
        )
    for key, obj in items:
        _check_item(role, key, obj)
    return Role(kind, tuple(items))


def member_family(model: torch.nn.Module, model_format: str) -> str:
    """The suffix of ``model``'s member: ``.tlsf32``, ``.json`` or ``.safetensors``.

    ``"auto"``: ``TLSF32B`` for a float32 model (or one without floating tensors), the
    safetensors layout otherwise (mixed floating dtypes included; a sharded model's too,
    written by every rank in parallel). ``"torchlean"``: ``TLSF32B`` or exact-bits JSON.
    ``"safetensors"``: the safetensors layout.

    Raises:
        ValueError: an unknown ``model_format``.
        CheckpointError: ``"torchlean"`` with mixed floating dtypes (``ConfigError``).
    """
    if model_format not in MODEL_FORMATS:
        raise ValueError(f"model_format must be one of {MODEL_FORMATS}, not {model_format!r}")
    if model_format == "safetensors":
        return SAFETENSORS
    try:
        float32 = file_dtype_of(state_tensors(model)) in (None, torch.float32)
    except ConfigError:
        # Mixed floating dtypes: no TorchLean family holds them, the safetensors layout does.
        if model_format == "torchlean":
            raise
        return SAFETENSORS
    if float32:
        return TLSF32
    return JSON if model_format == "torchlean" else SAFETENSORS


def is_adam(optimizer: torch.optim.Optimizer) -> bool:
    """Whether the optimizer is written in the Adam families (``.tladam`` members)."""
    return isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW))


def bound_parameters(
    optimizer: torch.optim.Optimizer, models: Role, where: str
) -> tuple[tuple[str, ...], dict[str, torch.Tensor]]:
    """The models an optimizer binds to, and its parameters by name (see the module
    docstring), in the models' slot order.

    Raises:
        SchemaMismatchError: a parameter of the optimizer is in no model of the set.
    """
    held = {id(p) for group in optimizer.param_groups for p in group["params"]}
    per_model: list[tuple[str, list[tuple[str, torch.Tensor]]]] = []
    found: set[int] = set()
    for key, model in models.items:
        slots = [
            (name, p) for name, p in model.named_parameters(remove_duplicate=False) if id(p) in held
        ]
        if slots:
            per_model.append((key, slots))
            found.update(id(p) for _, p in slots)
    if found != held:
        raise SchemaMismatchError(
            f"{where} holds {len(held - found)} parameter(s) that no model of the set has"
            " (an optimizer binds to the models holding its parameters)",
            field=where,
        )
    qualify = len(per_model) > 1
    params = {
        (f"{key}.{name}" if qualify else name): p for key, slots in per_model for name, p in slots
    }
    return tuple(key for key, _ in per_model), params
