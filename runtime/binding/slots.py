"""Parameter slots of a module and the schema they define (FORMAT.md §2, API.md ``schema_of``).

A *slot* is one entry of ``module.named_parameters(remove_duplicate=False)`` (or of the given
sequence of tensors): tied parameters occupy one slot per place they are used, frozen ones
included. Slots that share storage exactly are aliases of the first trainable slot holding
that storage; any other overlap cannot be described by the format and is refused.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ...codec.errors import CheckpointError, SchemaMismatchError
from ...codec.values.schema import ParameterSchema
from .dtensors import local_tensor

__all__ = ["ParameterSlots", "named_tensors", "parameter_slots", "schema_of", "view_key"]

ModuleOrParams = torch.nn.Module | Iterable[torch.Tensor] | Mapping[str, torch.Tensor]


@dataclass(frozen=True)
class ParameterSlots:
    """The destination's parameters in slot order, with names for error messages.

    Attributes:
        names: one readable name per slot (``"emb.weight"``, or ``"params[3]"``).
        tensors: the live tensors, one per slot (a tied tensor appears once per slot).
        schema: the :class:`ParameterSchema` they define.
    """

    names: tuple[str, ...]
    tensors: tuple[torch.Tensor, ...]
    schema: ParameterSchema

    def label(self, i: int) -> str:
        """``"slot 3 (head.weight)"`` — how errors name a slot."""
        return f"slot {i} ({self.names[i]})"


def named_tensors(
    source: Any,
    of_module: Callable[[torch.nn.Module], Iterable[tuple[str, Any]]],
    prefix: str,
    not_a_tensor: Callable[[str, Any], Exception],
) -> list[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` pairs of a module, a mapping of names to tensors, or a sequence.

    Args:
        source: the caller's argument.
        of_module: a module's named entries (its parameters, or its ``state_dict``).
        prefix: how a sequence's entries are named (``"params"`` → ``"params[3]"``).
        not_a_tensor: the error for an entry that is not a tensor, given its name and value.

    Raises:
        TypeError: a single tensor (a sequence of them is meant).
    """
    if isinstance(source, torch.nn.Module):
        items = list(of_module(source))
    elif isinstance(source, Mapping):
        items = list(source.items())
    elif isinstance(source, torch.Tensor):
        raise TypeError("pass a module or a sequence of tensors, not a single tensor")
    else:
        items = [(f"{prefix}[{i}]", t) for i, t in enumerate(source)]
    # Checked per distinct type (a model of 10^5 tensors has a handful of them), the types
    # gathered by C-level loops (``map``) rather than a Python one per entry.
    names, values = zip(*items) if items else ((), ())
    if not all(issubclass(kind, torch.Tensor) for kind in set(map(type, values))):
        for name, t in items:
            if not isinstance(t, torch.Tensor):
                raise not_a_tensor(str(name), t)
    if set(map(type, names)) <= {str}:
        return items
    return [(str(name), t) for name, t in items]


def _named_parameters(module_or_params: ModuleOrParams) -> list[tuple[str, torch.Tensor]]:
    return named_tensors(
        module_or_params,
        lambda module: module.named_parameters(remove_duplicate=False),
        "params",
        lambda name, value: TypeError(f"{name} is a {type(value).__name__}, not a tensor"),
    )


def _byte_range(t: torch.Tensor) -> tuple[int, int]:
    """The half-open byte range of ``t`` inside its storage (empty for no elements)."""
    if t.numel() == 0:
        return (0, 0)
    size = t.element_size()
    start = t.storage_offset()
    last = start + sum((d - 1) * abs(s) for d, s in zip(t.shape, t.stride()))
    return (start * size, (last + 1) * size)


def _storage_key(t: torch.Tensor) -> tuple:
    # Like safetensors: (device, storage pointer, storage size) identifies the storage.
    storage = t.untyped_storage()
    return (t.device, storage.data_ptr(), storage.nbytes())


def view_key(t: torch.Tensor) -> tuple:
    """What makes two views the same parameter: storage, offset, shape, stride and dtype.

    A DTensor's storage is its local shard's, qualified by its global shape and placements;
    a DTensor whose shard on this rank is empty is identified by the object itself (tied
    FSDP2 parameters are one object), so every rank finds the same ties.
    """
    local = local_tensor(t)
    if local is not t:
        if not local.numel():
            return ("object", id(t))
        return (*view_key(local), tuple(t.shape), tuple(t.placements))
    return (*_storage_key(t), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)


def _representatives(names: list[str], tensors: list[torch.Tensor]) -> list[int | None]:
    reps: list[int | None] = []
    first_trainable: dict[tuple, int] = {}  # view key → first trainable slot with it
    by_storage: dict[tuple, list[int]] = {}  # storage → earlier slots in it (overlap check)
    for i, t in enumerate(tensors):
        local = local_tensor(t)  # where a DTensor's bytes live on this rank
        # Empty tensors hold no bytes: only the very same tensor object ties them.
        key = view_key(t) if local.numel() else ("object", id(t))
        if local.numel():
            start, end = _byte_range(local)
            neighbours = by_storage.setdefault(_storage_key(local), [])
            for j in neighbours:
                if view_key(tensors[j]) == key:
                    continue
                o_start, o_end = _byte_range(local_tensor(tensors[j]))
                if start < o_end and o_start < end:
                    raise SchemaMismatchError(
                        f"parameters {names[j]!r} (slot {j}) and {names[i]!r} (slot {i}) share"
                        " part of their storage without being the same tensor; a checkpoint"
                        " can only describe fully tied parameters",
                        field=f"slot {i}",
                    )
            neighbours.append(i)
        if not t.requires_grad:
            reps.append(None)  # frozen slots never own (or borrow) a moment history
            continue
        reps.append(first_trainable.setdefault(key, i))
    return reps


def parameter_slots(module_or_params: ModuleOrParams) -> ParameterSlots:
    """The slots of a module (``named_parameters(remove_duplicate=False)``) or of tensors.

    Args:
        module_or_params: an ``nn.Module``, a sequence of tensors (repeat a tensor to tie
            it), or a mapping of names to tensors.

    Returns:
        The :class:`ParameterSlots`; its schema has a representatives map only when some
        slots are aliases.

    Raises:
        SchemaMismatchError: two parameters overlap without being the same view.
        TypeError: the argument is not a module or a collection of tensors.
    """
    named = _named_parameters(module_or_params)
    names = [n for n, _ in named]
    tensors = [t for _, t in named]
    reps = _representatives(names, tensors)
    shapes = [tuple(t.shape) for t in tensors]
    grads = [t.requires_grad for t in tensors]
    aliased = any(r is not None and r != i for i, r in enumerate(reps))
    schema = ParameterSchema(shapes, grads, reps if aliased else None)
    if not schema.is_well_formed():  # cannot happen by construction; never write such a file
        raise CheckpointError(f"internal error: derived schema is not well-formed: {schema}")
    return ParameterSlots(tuple(names), tuple(tensors), schema)


def schema_of(module_or_params: ModuleOrParams) -> ParameterSchema:
    """The :class:`ParameterSchema` of a module's parameters or of a sequence of tensors.

    Slots follow ``named_parameters(remove_duplicate=False)`` (frozen parameters included);
    a slot whose tensor has the same storage, offset, shape, stride and dtype as an earlier
    trainable slot is an alias of it (tied weights).

    Args:
        module_or_params: an ``nn.Module`` or a sequence of tensors.

    Returns:
        The schema that optimizer checkpoints of these parameters carry.

    Raises:
        SchemaMismatchError: two parameters partially overlap (the message names both).

    Example:
        >>> emb = torch.nn.Embedding(10, 4)
        >>> head = torch.nn.Linear(4, 10, bias=False)
        >>> head.weight = emb.weight
        >>> schema_of(torch.nn.ModuleList([emb, head])).representatives
        (0, 0)
    """
    return parameter_slots(module_or_params).schema
