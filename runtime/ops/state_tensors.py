"""A model's state as the state files hold it: named tensors in file order, and their ties.

State is ``state_dict()`` order: parameters (tied ones once per place they are registered,
frozen ones included) and persistent buffers, without names (FORMAT.md §4). The file's scalar
type is the model's one floating dtype; an integer or bool tensor (BatchNorm's
``num_batches_tracked``) travels in it only when the conversion is exact both ways.

A tied tensor is in the state once per place it is registered; the file holds its values
once per place too, and a load requires every copy to hold the same bits as the first,
then writes the first only (its copies share its memory). Each payload a load reads goes
through one step, :meth:`Arrival.arrive`: a tied copy compared with its original, any other
tensor's values converted to its dtype, exactly.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from ...codec.errors import (
    CheckpointError,
    ConfigError,
    FileChangedError,
    PartialLoadError,
    SchemaMismatchError,
)
from ..binding.dtensors import fingerprint, local_tensor, spec_of
from ..binding.slots import named_tensors, view_key
from ..binding.tensors import encoding_of, file_dtype_of, from_file_dtype
from ..commit.plans import StatePlan
from ..placement.placement_protocol import Receiver

__all__ = [
    "ModuleOrTensors",
    "NamedTensors",
    "DEFAULT_BITS_DTYPE",
    "state_tensors",
    "require_module",
    "require_float32",
    "bits_named_state",
    "tied_copies",
    "written",
    "tie_conflict",
    "lease_outwaited",
    "partial_load",
    "Arrival",
    "layout_of",
    "state_plan",
]

ModuleOrTensors = torch.nn.Module | Sequence[torch.Tensor] | Mapping[str, torch.Tensor]
NamedTensors = list[tuple[str, torch.Tensor]]

#: Scalar type of exact-bits JSON state that has no floating tensor to decide it (a model of
#: integer buffers only, or no state at all): binary64 holds every integer up to 2^53.
DEFAULT_BITS_DTYPE = torch.float64


def _not_a_tensor(name: str, value: object) -> CheckpointError:
    return CheckpointError(
        f"state entry {name!r} is a {type(value).__name__}, not a tensor; the formats"
        " hold tensors only",
        field=name,
    )


def state_tensors(module_or_tensors: ModuleOrTensors) -> NamedTensors:
    """The live state tensors with their names, in file order.

    Args:
        module_or_tensors: an ``nn.Module`` (its ``state_dict(keep_vars=True)``: parameters
            and persistent buffers), a mapping of names to tensors, or a sequence of tensors.

    Returns:
        ``(name, tensor)`` pairs; the tensors are the live ones (not copies).

    Raises:
        CheckpointError: an entry of the state is not a tensor (for example ``_extra_state``).
        TypeError: the argument is none of the accepted kinds.
    """
    return named_tensors(
        module_or_tensors,
        lambda module: module.state_dict(keep_vars=True).items(),
        "state",
        _not_a_tensor,
    )


def require_module(model: Any) -> None:
    """Refuse anything but a module (a set records its tensors' names).

    Raises:
        CheckpointError: ``model`` is not a ``torch.nn.Module``.
    """
    if not isinstance(model, torch.nn.Module):
        raise CheckpointError(
            f"model must be a torch.nn.Module (a set records its tensors' names), got"
            f" {type(model).__name__}",
            field="model",
        )


def require_float32(named: NamedTensors) -> None:
    """Refuse a state whose floating dtype is not float32 (TLSF32B holds nothing else).

    Raises:
        ConfigError: the model's floating dtype is not float32, or it mixes several.
    """
    dtype = file_dtype_of(named)
    if dtype not in (None, torch.float32):
        raise ConfigError(
            f"TLSF32B holds float32 state only and this model is {dtype}; use"
            " save_state_bits/load_state_bits for its exact bits",
            actual=str(dtype),
            expected="torch.float32",
        )


def bits_named_state(module_or_tensors: ModuleOrTensors) -> tuple[NamedTensors, torch.dtype, str]:
    """The state, the scalar type of its exact-bits JSON file and that type's encoding.

    Raises:
        ConfigError: mixed floating dtypes, or one no exact-bits format holds.
    """
    named = state_tensors(module_or_tensors)
    dtype = file_dtype_of(named) or DEFAULT_BITS_DTYPE
    return named, dtype, encoding_of(dtype, "model state")


#: Tensor types that are never DTensors: their memory is their own.
_LOCAL_TYPES = {torch.Tensor, torch.nn.Parameter}


def tied_copies(named: NamedTensors, addresses: np.ndarray | None = None) -> dict[int, int]:
    """State index → the earlier index holding the very same tensor view (tied weights are
    in ``state_dict`` once per place they are registered).

    Args:
        named: the state.
        addresses: each tensor's data address (a DTensor's: its local shard's) as
            ``uint64``, where the caller has them (:attr:`~.state_walk.StateWalk.addresses`).
    """
    # Two views can only be the same if they start at the same address: find the addresses
    # shared by several tensors (at once, with numpy), then compare full view keys within
    # those rare groups only.
    if addresses is None:
        if {type(t) for _, t in named} <= _LOCAL_TYPES:
            addresses = np.array([t.data_ptr() for _, t in named], dtype=np.uint64)
        else:
            addresses = np.array([local_tensor(t).data_ptr() for _, t in named], dtype=np.uint64)
    order = np.argsort(addresses, kind="stable")
    ranked = addresses[order]
    shared = np.flatnonzero(ranked[1:] == ranked[:-1])
    if not len(shared):
        return {}
    by_address: dict[int, list[int]] = {}
    for k in np.unique(np.concatenate((shared, shared + 1))).tolist():
        i = int(order[k])
        if named[i][1].numel():
            by_address.setdefault(int(ranked[k]), []).append(i)
    copies: dict[int, int] = {}
    for candidates in by_address.values():
        if len(candidates) > 1:
            first: dict[tuple, int] = {}
            for i in sorted(candidates):
                j = first.setdefault(view_key(named[i][1]), i)
                if j != i:
                    copies[i] = j
    return copies


def written(named: NamedTensors, copies: dict[int, int]) -> list[int]:
    """The state indices whose values a load writes (a tied copy shares its original's
    memory): the items of its transfer, in order."""
    if not copies:
        return list(range(len(named)))
    return [i for i in range(len(named)) if i not in copies]


def lease_outwaited() -> FileChangedError:
    """The error of a leased load after whose copy the lease cannot be vouched for."""
    return FileChangedError(
        "a writer waited for the file longer than the kernel's lease-break time during the"
        " load, which may have let it change the file",
        field="lease",
    )


def partial_load(exc: BaseException, done: int, total: int, leased: bool) -> PartialLoadError:
    """The error of an in-place load that failed with ``exc`` after it had overwritten
    ``done`` of ``total`` live tensors."""
    reason = exc.reason if isinstance(exc, CheckpointError) else str(exc)
    advice = (
        " (under a read lease: only a failing disk or an outwaited lease does this)"
        if leased
        else "; a staged load never leaves a model like this"
    )
    return PartialLoadError(
        f"the model was partially updated: {done} of {total} tensors had been overwritten"
        f" when the in-place load failed ({reason}). Load a complete file again or restore"
        f" the model{advice}",
        actual=done,
        expected=total,
        path=getattr(exc, "path", None) or getattr(exc, "filename", None),
    )


def tie_conflict(named: NamedTensors, i: int, j: int) -> SchemaMismatchError:
    """The error for a file whose tensor ``i`` differs from ``j``, to which it is tied."""
    return SchemaMismatchError(
        f"tensor {i} ({named[i][0]!r}) is tied to tensor {j} ({named[j][0]!r}) but the file"
        " holds different values for them",
        field=f"tensors[{i}]",
    )


class TieCheck:
    """Compares each tied copy's payload, bit for bit, with its original's, one payload at a
    time, in file order (an original comes before its copies).

    Args:
        named: the state.
        copies: :func:`tied_copies` of it.
        keep: whether an original's payload buffer stays untouched until its copies have
            been read (fresh memory per payload): then the copies are compared with it
            directly; else by SHA-256 digest (a reused buffer: one payload held at a time).
    """

    def __init__(self, named: NamedTensors, copies: dict[int, int], keep: bool):
        self.named = named
        self.copies = copies
        self.originals = set(copies.values())
        #: The records that are an original or a copy of a tied tensor.
        self.tied = self.originals | set(copies)
        self.keep = keep
        self.seen: dict[int, np.ndarray | bytes] = {}

    def is_copy(self, record: int, payload: np.ndarray) -> bool:
        """Note an original's payload, or check a copy's against it.

        Returns:
            Whether ``record`` is a copy (its values are its original's: nothing to keep).

        Raises:
            SchemaMismatchError: a copy whose bits differ from its original's.
        """
        original = self.copies.get(record)
        if original is None:
            if record in self.originals:
                self.seen[record] = _bits(payload) if self.keep else _digest(payload)
            return False
        seen = self.seen[original]
        if isinstance(seen, bytes):
            same = seen == _digest(payload)
        else:
            same = np.array_equal(_bits(payload), seen)
        if not same:
            raise tie_conflict(self.named, record, original)
        return True


class Arrival:
    """The one step every payload of a state load goes through when it arrives.

    Args:
        named: the state.
        copies: :func:`tied_copies` of it (``{}`` where the caller reads no tied copy).
        keep: as :class:`TieCheck`'s: whether an original's payload stays untouched until
            its copies have arrived.
        as_tensor: the payload (a numpy array of the file's element type) as a CPU tensor
            of the file's scalar type; by default a view of it (``torch.from_numpy``).
    """

    def __init__(
        self,
        named: NamedTensors,
        copies: dict[int, int],
        keep: bool,
        as_tensor: Callable[[np.ndarray], torch.Tensor] = torch.from_numpy,
    ):
        self.named = named
        self.ties = TieCheck(named, copies, keep)
        self.as_tensor = as_tensor

    def arrive(self, record: int, values: np.ndarray) -> torch.Tensor | None:
        """Check a tied copy against its original, or convert a tensor's file values.

        Args:
            record: the payload's index in the state.
            values: its values as read (any shape: a whole tensor, or a shard's piece).

        Returns:
            ``None`` for a tied copy (nothing to keep: it shares its original's memory);
            else the values as a tensor of the destination's dtype, the same shape.

        Raises:
            SchemaMismatchError: a tied copy whose bits differ from its original's.
            CheckpointError: values that the destination's dtype does not hold exactly.
        """
        if record in self.ties.tied and self.ties.is_copy(record, values):
            return None
        name, t = self.named[record]
        return from_file_dtype(self.as_tensor(values), t.dtype, name)


def _bits(payload: np.ndarray) -> np.ndarray:
    """The payload's words as unsigned integers: equal exactly when the bits are (NaN
    payloads and -0.0 included), without a copy."""
    width = payload.itemsize if payload.itemsize <= 8 else 8  # complex128: two words each
    return payload.reshape(-1).view(np.dtype(f"<u{width}"))


def _digest(payload: np.ndarray) -> bytes:
    return hashlib.sha256(memoryview(payload).cast("B")).digest()


def layout_of(kind: str, named: NamedTensors, copies: dict[int, int] | None = None) -> bytes:
    """The fingerprint ranks compare before a sharded state save or load: names, dtypes,
    shapes, placements and ties (:func:`~.dtensors.fingerprint`)."""
    described = [(n, str(t.dtype), tuple(t.shape), spec_of(t)) for n, t in named]
    return fingerprint(kind, described, sorted((copies or {}).items()))


def state_plan(named: NamedTensors, sent: list[int], receiver: Receiver) -> StatePlan:
    """The plan of a staged state load: each written tensor's memory on this process (a
    DTensor's local shard) and its new value, as ``receiver`` holds them after the transfer."""
    parts = receiver.received()
    return StatePlan([(local_tensor(named[i][1]), parts[k]) for k, i in enumerate(sent)])
