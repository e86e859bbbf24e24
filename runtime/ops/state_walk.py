"""One walk over a model's state for the ``TLSF32B`` save and load: names, tensors, dtypes,
shapes, addresses and the plainness verdict, each computed once per call.

A model of many small tensors pays for every per-tensor Python pass, so the passes the save
and the load need are made here once, each a C-level loop (``map`` over an unbound tensor
method, ``numpy.fromiter``) rather than a Python one, and shared by every step of the call:
the dtype checks, the tie search, the header template's shapes, the split of plain tensors
(moved by address) from the others.

Nothing is cached across calls: a module's tensors can change in ways no cheap key shows
(``p.data = other`` keeps the parameter object and its version counter but changes its
memory and shape), so every call walks the state afresh. A walk describes the tensors as
they are when it is made; a plan made from it is committed within the same library call.
"""

from __future__ import annotations

import functools
from operator import attrgetter, itemgetter

import numpy as np
import torch

from ..binding.dtensors import local_tensor
from .state_tensors import ModuleOrTensors, NamedTensors, require_float32, state_tensors

__all__ = ["PLAIN_TYPES", "StateWalk", "float32_walk", "is_plain"]

#: Tensor types whose memory is their own (never a DTensor or another subclass).
PLAIN_TYPES = frozenset({torch.Tensor, torch.nn.Parameter})

# Unbound accessors, mapped over the tensors without a Python frame per tensor.
_SECOND = itemgetter(1)
_DTYPE = attrgetter("dtype")
_SHAPE = attrgetter("shape")
_IS_CPU = attrgetter("is_cpu")
_DATA_PTR = torch.Tensor.data_ptr
_IS_CONTIGUOUS = torch.Tensor.is_contiguous
_IS_NEG = torch.Tensor.is_neg


def is_plain(t: torch.Tensor) -> bool:
    """Whether ``t``'s memory is exactly a payload's bytes: a contiguous CPU float32 tensor
    (not a subclass, not a lazily negated view), so bytes move to and from it by address."""
    return (
        type(t) in PLAIN_TYPES
        and t.dtype is torch.float32
        and t.is_cpu
        and t.is_contiguous()
        and not t.is_neg()
    )


class StateWalk:
    """A model's state, walked once: what the ``TLSF32B`` save and load ask of its tensors.

    Attributes:
        named: ``(name, tensor)`` pairs in file order (the live tensors).
        tensors: the tensors alone, in the same order.
        kinds: the distinct tensor types.
        dtypes: the distinct dtypes.
    """

    def __init__(self, named: NamedTensors):
        self.named = named
        self.tensors: list[torch.Tensor] = list(map(_SECOND, named))
        self.kinds = set(map(type, self.tensors))
        self.dtypes = set(map(_DTYPE, self.tensors))

    def __len__(self) -> int:
        return len(self.tensors)

    @functools.cached_property
    def shapes(self) -> list[tuple[int, ...]]:
        """Each tensor's shape (``torch.Size``, a tuple of ints)."""
        return list(map(_SHAPE, self.tensors))

    @functools.cached_property
    def addresses(self) -> np.ndarray:
        """Each tensor's data address (a DTensor's: its local shard's), as ``uint64``."""
        n = len(self.tensors)
        if self.kinds <= PLAIN_TYPES:
            return np.fromiter(map(_DATA_PTR, self.tensors), np.uint64, n)
        return np.fromiter((local_tensor(t).data_ptr() for t in self.tensors), np.uint64, n)

    @functools.cached_property
    def plain_mask(self) -> np.ndarray | None:
        """Which tensors are plain (:func:`is_plain`); ``None`` when every one is (the
        common case, decided by a few C-level passes without building a mask)."""
        ts = self.tensors
        if (
            self.kinds <= PLAIN_TYPES
            and self.dtypes <= {torch.float32}
            and all(map(_IS_CPU, ts))
            and all(map(_IS_CONTIGUOUS, ts))
            and not any(map(_IS_NEG, ts))
        ):
            return None
        return np.fromiter(map(is_plain, ts), bool, len(ts))

    def split(self, records: list[int] | None = None) -> tuple[np.ndarray, np.ndarray, list[int]]:
        """``records`` (every tensor for ``None``) split into the plain tensors and the others.

        Returns:
            The plain records (an ``int64`` array, in order), their addresses (``uint64``),
            and the other records (a list, in order).
        """
        n = len(self.tensors)
        index = np.arange(n, dtype=np.int64) if records is None else np.asarray(records, np.int64)
        mask = self.plain_mask
        if mask is None:
            return index, self.addresses[index], []
        keep = mask[index]
        plain = index[keep]
        others = index[~keep].tolist()
        if "addresses" in self.__dict__:  # every tensor's, already taken (the tie search)
            return plain, self.addresses[plain], others
        # Only the plain tensors' (another tensor may have no address to take).
        ts = self.tensors
        addresses = np.fromiter((ts[i].data_ptr() for i in plain.tolist()), np.uint64, len(plain))
        return plain, addresses, others

    def tensors_at(self, records: np.ndarray) -> list[torch.Tensor]:
        """The tensors of ``records`` (the walk's own list when that is every tensor)."""
        if len(records) == len(self.tensors):  # records are increasing and distinct
            return self.tensors
        return list(map(self.tensors.__getitem__, records.tolist()))


def float32_walk(module_or_tensors: ModuleOrTensors) -> StateWalk:
    """The state, walked once and checked to be storable as float32
    (:func:`~.state_tensors.require_float32`'s rule).

    Raises:
        ConfigError: the model's floating dtype is not float32 (or it mixes several).
        CheckpointError: an entry of the state is not a tensor.
    """
    walk = StateWalk(state_tensors(module_or_tensors))
    if not walk.dtypes <= {torch.float32}:  # else nothing to check: all float32
        require_float32(walk.named)
    return walk
