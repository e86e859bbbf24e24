"""DTensors (FSDP2 ``fully_shard``, ``distribute_tensor``) as the runtime sees them.

Nothing here communicates. It answers, on one process: does this model hold sharded
tensors (then the public functions take the sharded placement, :mod:`.sharded_placement`),
what is a DTensor's local shard (where its storage identity lives, for tied weights), and
what every rank must agree on before the first collective.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

__all__ = [
    "dtensor_class",
    "is_dtensor",
    "like_dtensor",
    "dtensor_over",
    "local_tensor",
    "reusable",
    "sharded",
    "spec_of",
    "fingerprint",
]


def dtensor_class() -> type | None:
    """``DTensor``, if anything imported ``torch.distributed.tensor`` — else ``None``.

    No DTensor can exist before that module is imported (FSDP2 and ``distribute_tensor``
    import it), so single-process users never pay its import (half a second, sympy
    included) just for the check.
    """
    module = sys.modules.get("torch.distributed.tensor")
    return getattr(module, "DTensor", None) if module is not None else None


#: Tensor types that are never DTensors (a DTensor parameter keeps the DTensor type): the
#: answer for the common case without a look-up, once per tensor of a large model.
_PLAIN_TYPES = frozenset({torch.Tensor, torch.nn.Parameter})


def is_dtensor(t: Any) -> bool:
    """Whether ``t`` is a ``torch.distributed.tensor.DTensor`` (parameters included)."""
    if type(t) in _PLAIN_TYPES:
        return False
    cls = dtensor_class()
    return cls is not None and isinstance(t, cls)


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """This process's shard of a DTensor (a view of its memory); any other tensor itself."""
    if not is_dtensor(t):
        return t
    with torch.no_grad():  # a view of the storage, not a node in an autograd graph
        return t.to_local()


def like_dtensor(part: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``part`` (this rank's shard) as a DTensor laid out as ``like``; a plain ``like`` gives
    ``part`` itself. Adam keeps a DTensor parameter's moments as such DTensors."""
    if not is_dtensor(like):
        return part
    return type(like).from_local(
        part,
        like.device_mesh,
        like.placements,
        run_check=False,
        shape=like.shape,
        stride=like.stride(),
    )


def dtensor_over(part: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``part`` as a DTensor laid out as ``like`` (same mesh, placements, global shape and
    stride), over ``part``'s memory wherever it lies: unlike :func:`like_dtensor`, a host
    copy of a device shard stays on the host (a background save's snapshot). No
    communication. A plain ``like`` gives ``part`` itself.
    """
    if not is_dtensor(like):
        return part
    return type(like)(part, like._spec, requires_grad=False)


def reusable(module_or_tensors: Any) -> Any:
    """The argument, with a one-shot iterable (``model.parameters()``) turned into a list.

    The public functions look at the tensors once to choose between the single-process and
    the collective path, and again to do the work; a generator would be empty the second
    time. Modules, mappings, sequences and tensors are returned as they are.
    """
    if isinstance(module_or_tensors, (torch.nn.Module, Mapping, Sequence, torch.Tensor)):
        return module_or_tensors
    if isinstance(module_or_tensors, Iterable):
        return list(module_or_tensors)
    return module_or_tensors


def _tensors(module_or_tensors: Any) -> Iterable[Any]:
    if isinstance(module_or_tensors, torch.nn.Module):
        yield from module_or_tensors.parameters()
        yield from module_or_tensors.buffers()
    elif isinstance(module_or_tensors, Mapping):
        yield from module_or_tensors.values()
    elif isinstance(module_or_tensors, Sequence) and not isinstance(module_or_tensors, str):
        yield from module_or_tensors


def sharded(module_or_tensors: Any) -> bool:
    """Whether a module (its parameters or buffers) or a collection holds a DTensor.

    Never raises: an argument of the wrong kind is left to the single-process path, which
    reports it.
    """
    cls = dtensor_class()
    if cls is None:
        return False
    if isinstance(module_or_tensors, torch.nn.Module):
        # Each submodule's own tensors, read from its dictionaries: ``parameters()`` is a
        # generator that deduplicates through a set, ~1 µs per tensor for 20,000 of them.
        types: set[type] = set()
        for m in module_or_tensors.modules():
            types.update(map(type, m._parameters.values()), map(type, m._buffers.values()))
        return any(tp not in _PLAIN_TYPES and issubclass(tp, cls) for tp in types)
    return any(is_dtensor(t) for t in _tensors(module_or_tensors))


def spec_of(t: torch.Tensor) -> str:
    """How a tensor is laid out across ranks: ``"local"``, or the mesh and placements."""
    if not is_dtensor(t):
        return "local"
    mesh = t.device_mesh
    return f"{mesh.device_type}{tuple(mesh.shape)}:{tuple(t.placements)}"


def fingerprint(*parts: Any) -> bytes:
    """A digest of a layout description (names, shapes, dtypes, placements, ties, config).

    Every rank computes it from its own objects; equal digests mean the ranks will run the
    same collectives in the same order.
    """
    return hashlib.sha256(repr(parts).encode()).digest()
