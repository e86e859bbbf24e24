"""Live Adam/AdamW state by slot: which moments a slot keeps, the checks a save makes of
them, and the replacement state a load builds from the file's moments.

The moments of slot ``s`` are numbered as items of a load's receiver (``m`` is item
``3 * s``, ``v`` item ``3 * s + 1``, ``max_exp_avg_sq`` ``3 * s + 2``), the file's order.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...codec.errors import CheckpointError, ConfigError, EntryError
from ...codec.values.optimizer_types import MOMENT_DTYPE_NAMES
from ...formats.tlckpt_optimizer import MOMENTS
from .adam_binding import AdamBinding, step_tensor, step_value
from .dtensors import is_dtensor, like_dtensor

__all__ = [
    "PER_SLOT",
    "STATE_KEYS",
    "SlotState",
    "checked_states",
    "item",
    "new_state",
]

#: A live state's key for each moment payload of an entry, in the entry's order.
STATE_KEYS = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")
#: Items per slot in a load's receiver: one per moment payload an entry can hold (``m`` of
#: slot ``s`` is item ``3 * s``, ``v`` item ``3 * s + 1``, ``max_exp_avg_sq`` ``3 * s + 2``).
PER_SLOT = len(MOMENTS)
_ITEM_OF_FIELD = {name: k for k, name in enumerate(MOMENTS)}


def item(slot: int, field: str) -> int:
    """The receiver item of slot ``slot``'s moment payload ``field`` (a file's field name)."""
    return PER_SLOT * slot + _ITEM_OF_FIELD[field]


def _amsgrad(binding: AdamBinding, slot: int) -> bool:
    group = binding.group_of(slot)
    return bool(group is not None and group.get("amsgrad", False))


@dataclass(frozen=True)
class SlotState:
    """A representative slot's state as saved: its step and its moments' state keys."""

    step: int
    keys: tuple[str, ...]


def checked_states(binding: AdamBinding) -> dict[int, SlotState]:
    """Each slot that has state (ascending): its step, after checking that its state is
    complete and typed like its parameter. Representative slots, and frozen slots that kept
    the state they had before they were frozen (:attr:`AdamBinding.state_slots`)."""
    slots, state = binding.slots, binding.optimizer.state
    states: dict[int, SlotState] = {}
    for i in binding.state_slots:
        p = slots.tensors[i]
        entry = state.get(p)
        if not entry:
            continue  # no state yet: no entry (TLCKOPT), or a refusal (TLADAMF)
        if binding.dtypes[i] not in MOMENT_DTYPE_NAMES:  # checked for trainable slots already
            raise ConfigError(
                f"frozen {slots.label(i)} is {p.dtype} and has optimizer state: Adam moments"
                f" of that dtype cannot be stored (tlckpt holds {', '.join(MOMENT_DTYPE_NAMES)}"
                " moments)",
                field=f"slot {i}",
                actual=binding.dtypes[i],
                expected=MOMENT_DTYPE_NAMES,
            )
        keeps_max = _amsgrad(binding, i)
        keys = STATE_KEYS if keeps_max else STATE_KEYS[:2]
        for key in ("step", *keys):
            if key not in entry:
                raise EntryError(f"{slots.label(i)}: optimizer state has no {key!r}")
        if not keeps_max and STATE_KEYS[2] in entry:
            raise EntryError(
                f"{slots.label(i)}: optimizer state has a {STATE_KEYS[2]!r} but its param"
                " group has amsgrad=False; saving would lose it",
                field=f"slot {i}.{STATE_KEYS[2]}",
            )
        for key in keys:
            moment = entry[key]
            if moment.dtype != p.dtype or moment.shape != p.shape:
                raise ConfigError(
                    f"{slots.label(i)}: {key} is {moment.dtype} {tuple(moment.shape)}, the"
                    f" parameter {p.dtype} {tuple(p.shape)}",
                    field=f"slot {i}.{key}",
                )
        states[i] = SlotState(step_value(entry["step"], f"{slots.label(i)} step"), keys)
    return states


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


def new_state(
    binding: AdamBinding, steps: dict[int, int], parts: dict[int, torch.Tensor]
) -> dict[torch.Tensor, dict]:
    """The complete replacement state, built off to the side, in param-group order: the
    slots of the file's entries, each with the moments its group keeps."""
    slots = binding.slots
    by_param: dict[int, dict] = {}
    for i, step in steps.items():
        p, group = slots.tensors[i], binding.group_of(i)
        if group is None:  # pragma: no cover - the readers accept entries of owners only
            raise CheckpointError(f"{slots.label(i)} has no param group")
        keys = STATE_KEYS if _amsgrad(binding, i) else STATE_KEYS[:2]
        entry: dict[str, torch.Tensor] = {
            "step": step_tensor(group, p, step, f"{slots.label(i)} step")
        }
        for k, key in enumerate(keys):
            entry[key] = _moment(parts[PER_SLOT * i + k], p)
        by_param[id(p)] = entry
    state: dict[torch.Tensor, dict] = {}  # keyed by parameter, as torch keeps it
    for group in binding.optimizer.param_groups:
        for p in group["params"]:
            if id(p) in by_param:
                state[p] = by_param[id(p)]
    return state
