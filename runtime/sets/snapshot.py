"""Copies of a model's and an optimizer's tensors, taken at one moment, for a background save.

A :class:`Snapshotter` owns one reusable host arena (pinned when any tensor is on a CUDA
device) that grows to the largest state it has held. :meth:`Snapshotter.capture` copies
every distinct tensor view of the model's state and the optimizer's state into it: on the
CPU one ``copy_`` (a memcpy) per tensor; from a CUDA device with ``non_blocking`` copies on
a side stream that first waits for the training stream's work so far, after which the
training stream waits for the copies only (not for the write), and the live tensors'
memory is kept from reuse until the copies are done (``record_stream``).

The :class:`Snapshot` then looks like what it copied: a mapping of state names to tensors
(tied views stay one tensor, parameters stay parameters with their ``requires_grad``), the
parameter slots, and a stand-in optimizer of the same class whose param groups and state
hold the copies. The set's writers take those exactly as they take the live objects, so a
background set is written by the same code as a blocking one.

A sharded model's DTensors are copied shard by shard, each rank its own, and stay DTensors
of the same layout over the host copies: the set's sharded writers take them as they take
the live ones (every rank writes its part, :mod:`.set_writing`).

Only one snapshot of a snapshotter is alive at a time: its arena is reused by the next
capture (a manager's next save waits for the previous one first).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..binding.dtensors import dtensor_over, local_tensor
from ..binding.slots import view_key
from ..ops.state_tensors import NamedTensors, state_tensors

__all__ = ["Snapshot", "ManySnapshot", "Snapshotter"]

_ALIGN = 64  # bytes: every copy starts on a cache line


def _key(t: torch.Tensor) -> tuple:
    """What makes two tensors one copy: the same view (as the slots see ties); an empty
    tensor only as the very same object."""
    return view_key(t) if t.numel() else ("object", id(t))


class _Landing:
    """Copies that land asynchronously (device copies), each with its completion event."""

    _events: list[Any]

    def wait(self) -> None:
        """Block until every copy has landed (device copies run asynchronously)."""
        for event in self._events:
            event.synchronize()
        self._events = []


@dataclass
class Snapshot(_Landing):
    """Host copies of a model's state and an optimizer's, as of one capture.

    Attributes:
        state: state name → copy, in ``state_dict`` order (what ``save_module_state`` takes).
        params: the parameter slots' copies (``named_parameters(remove_duplicate=False)``
            order), for the optimizer's writer.
        optimizer: a stand-in optimizer over the copies, or ``None``.
        nbytes: bytes copied.
    """

    state: dict[str, torch.Tensor]
    params: list[torch.Tensor]
    optimizer: torch.optim.Optimizer | None
    nbytes: int
    _events: list[Any]


@dataclass
class ManySnapshot(_Landing):
    """Host copies of several models' and optimizers' state, as of one capture.

    Attributes:
        states: each model's state name → copy, in ``state_dict`` order.
        optimizers: a stand-in over the copies for each optimizer, in order.
        copy_of: the copy of a live tensor the capture copied (a parameter's copy is a
            parameter).
        nbytes: bytes copied.
    """

    states: list[dict[str, torch.Tensor]]
    optimizers: list[torch.optim.Optimizer]
    copy_of: Callable[[torch.Tensor], torch.Tensor]
    nbytes: int
    _events: list[Any]


class Snapshotter:
    """Takes :class:`Snapshot`\\ s into one reusable host arena (see the module docstring)."""

    def __init__(self) -> None:
        self._arena: torch.Tensor | None = None
        self._streams: dict[torch.device, Any] = {}

    def _arena_of(self, nbytes: int, pin: bool) -> torch.Tensor:
        arena = self._arena
        if arena is None or arena.numel() < nbytes or (pin and not arena.is_pinned()):
            self._arena = None  # release the smaller arena before allocating the larger
            arena = torch.empty(max(nbytes, 1), dtype=torch.uint8, pin_memory=pin)
            self._arena = arena
        return arena

    def capture(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> Snapshot:
        """Copy the state of ``model`` and ``optimizer`` now.

        Returns:
            The snapshot; its device copies may still be in flight (:meth:`Snapshot.wait`).
        """
        taken = self.capture_many([model], [] if optimizer is None else [optimizer])
        state = taken.states[0]
        params = [taken.copy_of(p) for _, p in model.named_parameters(remove_duplicate=False)]
        stand_in = taken.optimizers[0] if optimizer is not None else None
        return Snapshot(state, params, stand_in, taken.nbytes, taken._events)

    def capture_many(
        self, models: Sequence[torch.nn.Module], optimizers: Sequence[torch.optim.Optimizer]
    ) -> ManySnapshot:
        """Copy the state of several models and optimizers now, into the one arena (a set
        of several: every distinct tensor once, whichever model or optimizer holds it).

        A DTensor (a sharded model's parameter, its optimizer's moments) is copied as this
        rank's shard alone, and the copy is a DTensor of the same layout over the host
        copy (:func:`~..binding.dtensors.dtensor_over`): no communication.
        """
        nameds: list[NamedTensors] = [state_tensors(model) for model in models]
        slots = [p for model in models for _, p in model.named_parameters(remove_duplicate=False)]
        moments: list[tuple[Any, str, torch.Tensor]] = []
        for optimizer in optimizers:
            for p, entry in optimizer.state.items():
                for key, value in entry.items():
                    if isinstance(value, torch.Tensor):
                        moments.append((p, key, value))
        # One copy per distinct view (tied parameters are one tensor in several places).
        order: dict[tuple, int] = {}
        lives: list[torch.Tensor] = []
        named_tensors = [t for named in nameds for _, t in named]
        for t in named_tensors + slots + [v for _, _, v in moments]:
            key = _key(t)
            if key not in order:
                order[key] = len(lives)
                lives.append(t)
        shards = [local_tensor(t) for t in lives]  # a DTensor's own shard; else itself
        offsets, total = [], 0
        for t in shards:
            offsets.append(total)
            total += -(-t.numel() * t.element_size() // _ALIGN) * _ALIGN
        pin = any(t.is_cuda for t in shards) and torch.cuda.is_available()
        arena = self._arena_of(total, pin)
        landed = [
            arena[o : o + t.numel() * t.element_size()].view(t.dtype).view(t.shape)
            for o, t in zip(offsets, shards)
        ]
        events = self._copy(shards, landed)
        copies = [dtensor_over(c, t) for c, t in zip(landed, lives)]
        # Parameters become parameters again (the optimizer's writer reads requires_grad).
        as_param: dict[int, torch.Tensor] = {}
        for p in slots:
            k = order[_key(p)]
            if k not in as_param:
                as_param[k] = torch.nn.Parameter(copies[k], requires_grad=p.requires_grad)

        def copy_of(t: torch.Tensor) -> torch.Tensor:
            k = order[_key(t)]
            return as_param.get(k, copies[k])

        states = [{name: copy_of(t) for name, t in named} for named in nameds]
        stand_ins = [_stand_in(optimizer, copy_of) for optimizer in optimizers]
        return ManySnapshot(states, stand_ins, copy_of, total, events)

    def _copy(self, lives: Sequence[torch.Tensor], copies: Sequence[torch.Tensor]) -> list[Any]:
        with torch.no_grad():
            on_device: dict[torch.device, list[int]] = defaultdict(list)
            for k, t in enumerate(lives):
                if t.is_cuda:
                    on_device[t.device].append(k)
                else:
                    copies[k].copy_(t.detach())
            events = []
            for device, items in on_device.items():
                side = self._streams.get(device)
                if side is None:
                    side = self._streams[device] = torch.cuda.Stream(device)
                training = torch.cuda.current_stream(device)
                side.wait_stream(training)  # the values as of this call
                with torch.cuda.stream(side):
                    for k in items:
                        copies[k].copy_(lives[k].detach(), non_blocking=True)
                        lives[k].record_stream(side)  # not reused before the copy is done
                    events.append(side.record_event())
                training.wait_stream(side)  # later kernels cannot overwrite before the copy
        return events


def _stand_in(optimizer: torch.optim.Optimizer, copy_of: Any) -> torch.optim.Optimizer:
    """An optimizer of ``optimizer``'s class whose param groups and state hold the copies
    (zero-dimensional hyperparameter tensors cloned, so later updates do not reach it)."""
    stand_in = object.__new__(type(optimizer))
    stand_in.__dict__.update(optimizer.__dict__)
    groups = []
    for group in optimizer.param_groups:
        copied = {
            k: v.detach().clone() if isinstance(v, torch.Tensor) else v for k, v in group.items()
        }
        copied["params"] = [copy_of(p) for p in group["params"]]
        groups.append(copied)
    stand_in.param_groups = groups
    state: defaultdict[torch.Tensor, dict] = defaultdict(dict)
    for p, entry in optimizer.state.items():
        state[copy_of(p)] = {
            k: copy_of(v) if isinstance(v, torch.Tensor) else v for k, v in entry.items()
        }
    stand_in.state = state
    return stand_in
