"""Adam/AdamW optimizer state ↔ files: TorchLean's ``TLADAMF`` when the state fits one of
its versions, tlckpt's own ``TLCKOPT`` family when it does not; the save, and the load as a
plan committed after.

Both are written once over a :class:`~.placement.Placement` (one process, or every rank of
sharded parameters with rank 0 at the file), and once for both families: they differ only in
the codec writer or reader called and in what an entry holds.

Saving decides the family from the binding (:meth:`~.adam_binding.AdamBinding.fit`): every
slot with state, its step and its moments (``exp_avg``, ``exp_avg_sq``, and
``max_exp_avg_sq`` where its group has amsgrad). Then it streams one representative slot at
a time: the codec asks for a slot's entry, and its moments arrive (gathered, when sharded)
and are written before the next (device moments through reusable pinned host buffers).

Loading reads the file once, whichever family its magic names: the codec checks every rule
as it goes (a ``TLADAMF`` file against the optimizer's one TorchLean config, a ``TLCKOPT``
file against its param groups, slot by slot), and each moment payload goes through the
placement's :class:`~.placement.Receiver` as it is read (in the file's order), into new
tensors of the parameter's dtype on its device (as DTensors laid out like their parameters,
when sharded). Then the complete replacement state is built (``step`` in the form the
optimizer's settings expect; a slot without an entry gets no state, as torch has it before
the slot's first step); the plan's commit swaps it in, in one step. Any error before the
swap leaves the optimizer bit for bit as it was.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..codec.adam import read_adam, write_adam
from ..codec.adam_types import AdamEntry
from ..codec.config import float_bits
from ..codec.errors import CheckpointError, ConfigError, EntryError
from ..codec.families import families_differ
from ..codec.inspection import sniff_family
from ..codec.optimizer_types import OptimizerEntry
from ..codec.source import PathOrFile, open_source
from ..codec.tlckpt_optimizer import read_optimizer_state
from ..codec.tlckpt_optimizer_writer import write_optimizer_state
from ..formats.tlckpt_optimizer import GROUP_FLOATS, MOMENTS
from .adam_binding import AdamBinding, bind_optimizer, step_tensor, step_value
from .dtensors import fingerprint, is_dtensor, like_dtensor, spec_of
from .placement import Placement, Receiver, Take
from .plans import OptimizerPlan
from .slots import ModuleOrParams
from .tensors import HostBuffer, to_host

__all__ = ["save", "plan_load", "TORCHLEAN_FAMILY", "OWN_FAMILY"]

#: The families' names in the codec's family registry.
TORCHLEAN_FAMILY, OWN_FAMILY = "adam", "tlckpt_optimizer"
#: A live state's key for each moment payload of an entry, in the entry's order.
_STATE_KEYS = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")
#: Items per slot in a load's receiver: one per moment payload an entry can hold (``m`` of
#: slot ``s`` is item ``3 * s``, ``v`` item ``3 * s + 1``, ``max_exp_avg_sq`` ``3 * s + 2``).
_PER_SLOT = len(MOMENTS)
_ITEM_OF_FIELD = {name: k for k, name in enumerate(MOMENTS)}


def _layout(kind: str, binding: AdamBinding, extra: Any = None) -> bytes:
    slots = binding.slots
    described = [
        (n, str(t.dtype), tuple(t.shape), t.requires_grad, spec_of(t))
        for n, t in zip(slots.names, slots.tensors)
    ]
    settings = [
        (
            g.kind.name,
            [float_bits(getattr(g, name)) for name in GROUP_FLOATS],
            g.amsgrad,
            g.maximize,
        )
        for g in binding.group_configs
    ]
    return fingerprint(
        kind, described, slots.schema.representatives, binding.group_index, settings, extra
    )


def _amsgrad(binding: AdamBinding, slot: int) -> bool:
    group = binding.groups[slot]
    return bool(group is not None and group.get("amsgrad", False))


@dataclass(frozen=True)
class _SlotState:
    """A representative slot's state as saved: its step and its moments' state keys."""

    step: int
    keys: tuple[str, ...]


def _checked_states(binding: AdamBinding) -> dict[int, _SlotState]:
    """Each representative slot that has state (ascending): its step, after checking that
    its state is complete and typed like its parameter."""
    slots, state = binding.slots, binding.optimizer.state
    states: dict[int, _SlotState] = {}
    for i in slots.schema.representative_slots:
        p = slots.tensors[i]
        entry = state.get(p)
        if not entry:
            continue  # no state yet: no entry (TLCKOPT), or a refusal (TLADAMF)
        amsgrad = _amsgrad(binding, i)
        keys = _STATE_KEYS if amsgrad else _STATE_KEYS[:2]
        for key in ("step", *keys):
            if key not in entry:
                raise EntryError(f"{slots.label(i)}: optimizer state has no {key!r}")
        if not amsgrad and _STATE_KEYS[2] in entry:
            raise EntryError(
                f"{slots.label(i)}: optimizer state has a {_STATE_KEYS[2]!r} but its param"
                " group has amsgrad=False; saving would lose it",
                field=f"slot {i}.{_STATE_KEYS[2]}",
            )
        for key in keys:
            moment = entry[key]
            if moment.dtype != p.dtype or moment.shape != p.shape:
                raise ConfigError(
                    f"{slots.label(i)}: {key} is {moment.dtype} {tuple(moment.shape)}, the"
                    f" parameter {p.dtype} {tuple(p.shape)}",
                    field=f"slot {i}.{key}",
                )
        states[i] = _SlotState(step_value(entry["step"], f"{slots.label(i)} step"), keys)
    return states


def _host_moment(t: torch.Tensor, staging: HostBuffer) -> np.ndarray:
    t = t.detach()
    if t.device.type == "cpu":
        return to_host(t.reshape(-1))  # a view of the live moment unless it was strided
    host = staging.tensor(t.numel(), t.dtype)
    host.copy_(t.reshape(-1))  # synchronous: the bytes are there when the codec writes them
    return to_host(host)


class _Entries(Mapping[int, Any]):
    """The codec's entries: each slot's full moments, taken when the codec asks for them.

    Args:
        binding: the optimizer.
        states: the slots that have state, ascending (the codec's order and the moments').
        take: the placement's ``take``: item ``first[slot] + k`` is the slot's k-th moment.
        make: the codec's entry from a slot, its step and its host moments.
    """

    def __init__(
        self,
        binding: AdamBinding,
        states: dict[int, _SlotState],
        take: Take,
        make: Callable[[int, int, list[np.ndarray]], Any],
    ):
        self.states = states
        self.take = take
        self.make = make
        self.first: dict[int, int] = {}
        item = 0
        for slot, state in states.items():
            self.first[slot] = item
            item += len(state.keys)
        pin = any(t.device.type == "cuda" for t in binding.slots.tensors)
        self.staging = [HostBuffer(pin) for _ in _STATE_KEYS]

    def __getitem__(self, slot: int) -> Any:
        state = self.states.get(slot)
        if state is None:
            raise KeyError(slot)
        first = self.first[slot]
        moments = [
            _host_moment(self.take(first + k), self.staging[k]) for k in range(len(state.keys))
        ]
        return self.make(slot, state.step, moments)

    def __iter__(self) -> Iterator[int]:
        return iter(self.states)

    def __len__(self) -> int:
        return len(self.states)


def save(
    placement: Placement,
    optimizer: torch.optim.Optimizer,
    module_or_params: ModuleOrParams,
    path: PathOrFile,
    random_counter: int | None,
    require_torchlean: bool = False,
) -> int:
    """Write the optimizer's state (see :func:`~tlckpt.runtime.save_optimizer`).

    Returns:
        The version written (on every rank): 2 to 5 for ``TLADAMF``, 1 for ``TLCKOPT``.
    """

    def check() -> tuple[AdamBinding, dict[int, _SlotState], Any, list[torch.Tensor]]:
        binding = bind_optimizer(optimizer, module_or_params)
        slots = binding.slots
        placement.check(zip(slots.names, slots.tensors))
        states = _checked_states(binding)
        fit = binding.fit(has_state=states.__contains__)
        if require_torchlean and not fit.fits:
            raise fit.refusal()
        keys = [(slot, key) for slot, state in states.items() for key in state.keys]
        live = binding.optimizer.state
        moments = [live[slots.tensors[slot]][key] for slot, key in keys]
        placement.check((f"{slots.names[s]} {key}", m) for (s, key), m in zip(keys, moments))
        return binding, states, fit, moments

    def layout(
        checked: tuple[AdamBinding, dict[int, _SlotState], Any, list[torch.Tensor]],
    ) -> bytes:
        binding, states, fit, moments = checked
        described, k = [], 0
        for slot, state in states.items():
            described.append(
                (slot, state.step, [spec_of(m) for m in moments[k : k + len(state.keys)]])
            )
            k += len(state.keys)
        return _layout("save", binding, (fit.fits, described))

    binding, states, fit, moments = placement.agree(check, layout)
    schema, dtypes = binding.slots.schema, binding.dtypes

    def write(take: Take) -> int:
        if fit.fits:
            entries = _Entries(binding, states, take, lambda _, step, m: AdamEntry(step, *m))
            return write_adam(path, schema, fit.config, entries, random_counter)
        entries = _Entries(
            binding,
            states,
            take,
            lambda slot, step, m: OptimizerEntry(step, dtypes[slot], *m),
        )
        return write_optimizer_state(
            path, schema, binding.group_configs, binding.group_index, entries, random_counter
        )

    # The codec holds one entry's moments at a time: m and v (and max_exp_avg_sq).
    lanes = 2 if fit.fits else _PER_SLOT
    version = placement.gather(moments, lanes, write)
    return int(placement.share(version))


class _MomentSink:
    """Payload sink of a load: each moment payload through the receiver, as it is read, in
    memory of the parameter's dtype (the readers have checked that the file's is the same)."""

    def __init__(self, receiver: Receiver, binding: AdamBinding):
        self.receiver = receiver
        self.tensors = binding.slots.tensors
        self.values = torch.empty(0)  # the buffer being read into

    def buffer(self, record: int, field: str, count: int, dtype: np.dtype) -> Any:
        item = _PER_SLOT * record + _ITEM_OF_FIELD[field]
        torch_dtype = self.tensors[record].dtype
        if torch.empty((), dtype=torch_dtype).element_size() != dtype.itemsize:
            raise CheckpointError(  # pragma: no cover - the readers compare the dtypes first
                f"internal error: {dtype} payload for a {torch_dtype} parameter"
            )
        self.values = self.receiver.buffer(item, count, torch_dtype)
        return to_host(self.values)

    def done(self, record: int, field: str, buffer: Any) -> None:
        self.receiver.put(_PER_SLOT * record + _ITEM_OF_FIELD[field], self.values)


def _shaped_like(flat: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    # Adam creates its moments with zeros_like(p, memory_format=preserve_format): keep the
    # parameter's layout (channels_last, ...) so the optimizer sees what it would have made.
    values = flat.view(param.shape)
    if param.is_contiguous():
        return values
    out = torch.empty_like(param, memory_format=torch.preserve_format, requires_grad=False)
    return out.copy_(values)


def _moment(part: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """A new moment for ``param`` from this process's part of the file's values (as a
    DTensor laid out like ``param`` when it is one)."""
    return like_dtensor(part, param) if is_dtensor(param) else _shaped_like(part, param)


def _new_state(
    binding: AdamBinding, steps: dict[int, int], parts: dict[int, torch.Tensor]
) -> dict[torch.Tensor, dict]:
    """The complete replacement state, built off to the side, in param-group order: the
    slots of the file's entries, each with the moments its group keeps."""
    slots = binding.slots
    by_param: dict[int, dict] = {}
    for i, step in steps.items():
        p, group = slots.tensors[i], binding.groups[i]
        if group is None:  # pragma: no cover - the readers accept entries of owners only
            raise CheckpointError(f"{slots.label(i)} has no param group")
        keys = _STATE_KEYS if _amsgrad(binding, i) else _STATE_KEYS[:2]
        entry: dict[str, torch.Tensor] = {
            "step": step_tensor(group, p, step, f"{slots.label(i)} step")
        }
        for k, key in enumerate(keys):
            entry[key] = _moment(parts[_PER_SLOT * i + k], p)
        by_param[id(p)] = entry
    state: dict[torch.Tensor, dict] = {}  # keyed by parameter, as torch keeps it
    for group in binding.optimizer.param_groups:
        for p in group["params"]:
            if id(p) in by_param:
                state[p] = by_param[id(p)]
    return state


def _read(binding: AdamBinding, path: PathOrFile, receiver: Receiver) -> dict[str, Any]:
    """Read the file, of either family, into ``receiver``; its steps and random counter."""
    schema = binding.slots.schema
    sink = _MomentSink(receiver, binding)
    with open_source(path) as src:
        family = sniff_family(src.file)
        if family == TORCHLEAN_FAMILY:
            config = binding.fit().require()  # the one config a TLADAMF file can hold
            checkpoint: Any = read_adam(
                src.file, schema, dtype=config.dtype, expected_config=config, sink=sink
            )
        elif family == OWN_FAMILY:
            checkpoint = read_optimizer_state(
                src.file,
                schema,
                groups=binding.group_configs,
                slot_groups=binding.group_index,
                dtypes=binding.dtypes,
                sink=sink,
            )
        else:
            raise families_differ(family, [TORCHLEAN_FAMILY, OWN_FAMILY])
    steps = [[slot, entry.step] for slot, entry in checkpoint.entries.items()]
    return {"steps": steps, "counter": checkpoint.random_counter}


def plan_load(
    placement: Placement,
    optimizer: torch.optim.Optimizer,
    module_or_params: ModuleOrParams,
    path: PathOrFile,
    restore_random_counter: bool,
) -> OptimizerPlan:
    """Read and check the optimizer's file and build its replacement state (see
    :func:`~tlckpt.runtime.load_optimizer`); nothing live changes.

    Returns:
        The plan, holding the file's random counter; its commit swaps the state in.
    """

    def check() -> AdamBinding:
        binding = bind_optimizer(optimizer, module_or_params)
        placement.check(zip(binding.slots.names, binding.slots.tensors))
        return binding

    binding = placement.agree(check, lambda b: _layout("load", b, restore_random_counter))
    items = [t for t in binding.slots.tensors for _ in range(_PER_SLOT)]
    receiver = placement.receiver(items, in_order=False, on_device=True)

    def read() -> dict[str, Any]:
        summary = _read(binding, path, receiver)
        counter = summary["counter"]
        if counter is not None and not restore_random_counter:
            raise ConfigError(
                f"the file holds a random counter ({counter}) and the caller has nowhere to"
                " put it; pass restore_random_counter=True and restore it",
                field="random_counter",
                actual=counter,
            )
        return summary

    summary = placement.share(placement.transfer(receiver, read))
    steps = {int(slot): int(step) for slot, step in summary["steps"]}
    parts = receiver.received()
    state = placement.agree(lambda: _new_state(binding, steps, parts))
    return OptimizerPlan(optimizer, state, summary["counter"])
