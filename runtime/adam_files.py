"""Adam/AdamW optimizer state as ``TLADAMF`` (FORMAT.md §3): the save, and the load as a
plan committed after.

Both are written once over a :class:`~.placement.Placement` (one process, or every rank of
sharded parameters with rank 0 at the file).

Saving streams one representative slot at a time: the codec asks for a slot's entry, and
its moments ``m`` and ``v`` arrive (gathered, when sharded) and are written before the next
(device moments through reusable pinned host buffers). Loading reads the file once: the
codec checks every rule as it goes, and each moment payload goes through the placement's
:class:`~.placement.Receiver` as it is read (in the file's order: entries may come in any
order), into new tensors on each parameter's device (as DTensors laid out like their
parameters, when sharded). Then the complete replacement state is built (``step`` in the
form the optimizer's settings expect); the plan's commit swaps it in, in one step. Any error
before the swap leaves the optimizer bit for bit as it was.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any, BinaryIO

import numpy as np
import torch

from ..codec.adam import AdamCheckpoint, AdamEntry, read_adam, validate_adam, write_adam
from ..codec.adam_writer import adam_layout
from ..codec.config import float_bits
from ..codec.errors import CheckpointError, ConfigError, EntryError
from ..codec.source import PathOrFile
from .adam_binding import AdamBinding, bind_adam, step_tensor, step_value
from .dtensors import fingerprint, is_dtensor, like_dtensor, local_tensor, spec_of
from .placement import Placement, Receiver, Take
from .plans import OptimizerPlan
from .positional import read_pieces, save_pieces
from .slots import ModuleOrParams
from .tensors import HostBuffer, torch_dtype_of

__all__ = ["save", "plan_load"]

#: The payload fields of an entry and their place among a slot's items (``m`` of slot ``s``
#: is item ``2 * s``, ``v`` item ``2 * s + 1``).
_FIELDS = {"m": 0, "v": 1}


def _layout(kind: str, binding: AdamBinding, extra: Any = None) -> bytes:
    slots, config = binding.slots, binding.config
    described = [
        (n, str(t.dtype), tuple(t.shape), t.requires_grad, spec_of(t))
        for n, t in zip(slots.names, slots.tensors)
    ]
    settings = [
        (config.kind.name, config.dtype.name),
        [float_bits(x) for x in (config.beta1, config.beta2, config.epsilon, config.weight_decay)],
    ]
    return fingerprint(kind, described, slots.schema.representatives, settings, extra)


def _checked_steps(binding: AdamBinding) -> dict[int, int]:
    """Each representative slot's step, after checking its state is complete and typed."""
    slots, state = binding.slots, binding.optimizer.state
    owners = slots.schema.representative_slots
    if owners and not any(state.get(slots.tensors[i]) for i in owners):
        raise CheckpointError(
            "the optimizer has no state yet: take an optimizer step before saving it"
        )
    steps: dict[int, int] = {}
    for i in owners:
        p = slots.tensors[i]
        entry = state.get(p)
        if not entry:
            raise EntryError(
                f"trainable {slots.label(i)} has no optimizer state yet (it has not had a"
                " gradient in an optimizer step)",
                field=f"slot {i}",
            )
        for key in ("step", "exp_avg", "exp_avg_sq"):
            if key not in entry:
                raise EntryError(f"{slots.label(i)}: optimizer state has no {key!r}")
        for key in ("exp_avg", "exp_avg_sq"):
            moment = entry[key]
            if moment.dtype != p.dtype or moment.shape != p.shape:
                raise ConfigError(
                    f"{slots.label(i)}: {key} is {moment.dtype} {tuple(moment.shape)}, the"
                    f" parameter {p.dtype} {tuple(p.shape)}",
                    field=f"slot {i}.{key}",
                )
        steps[i] = step_value(entry["step"], f"{slots.label(i)} step")
    return steps


def _host_moment(t: torch.Tensor, staging: HostBuffer) -> np.ndarray:
    t = t.detach()
    if t.device.type == "cpu":
        return t.reshape(-1).numpy()  # a view of the live moment unless it was strided
    host = staging.tensor(t.numel(), t.dtype)
    host.copy_(t.reshape(-1))  # synchronous: the bytes are there when the codec writes them
    return host.numpy()


class _Entries(Mapping[int, AdamEntry]):
    """The codec's entries: each slot's full moments, taken when the codec asks for them."""

    def __init__(self, binding: AdamBinding, steps: dict[int, int], take: Take):
        self.steps = steps
        self.take = take
        # Increasing slot order, the codec's and the moments': m of the k-th at item 2k.
        self.first_item = {slot: 2 * k for k, slot in enumerate(steps)}
        pin = any(t.device.type == "cuda" for t in binding.slots.tensors)
        self.m_host = HostBuffer(pin)
        self.v_host = HostBuffer(pin)

    def __getitem__(self, slot: int) -> AdamEntry:
        if slot not in self.steps:
            raise KeyError(slot)
        k = self.first_item[slot]
        m = _host_moment(self.take(k), self.m_host)
        v = _host_moment(self.take(k + 1), self.v_host)
        return AdamEntry(self.steps[slot], m, v)

    def __iter__(self) -> Iterator[int]:
        return iter(self.steps)

    def __len__(self) -> int:
        return len(self.steps)


def save(
    placement: Placement,
    optimizer: torch.optim.Optimizer,
    module_or_params: ModuleOrParams,
    path: PathOrFile,
    random_counter: int | None,
) -> int:
    """Write the optimizer's state (see :func:`~tlckpt.runtime.save_optimizer`).

    Returns:
        The version written (on every rank).
    """

    def check() -> tuple[AdamBinding, dict[int, int], list[torch.Tensor]]:
        binding = bind_adam(optimizer, module_or_params)
        slots = binding.slots
        placement.check(zip(slots.names, slots.tensors))
        steps = _checked_steps(binding)
        keys = [(slot, key) for slot in steps for key in ("exp_avg", "exp_avg_sq")]
        moments = [binding.optimizer.state[slots.tensors[slot]][key] for slot, key in keys]
        placement.check((f"{slots.names[s]} {key}", m) for (s, key), m in zip(keys, moments))
        return binding, steps, moments

    def layout(checked: tuple[AdamBinding, dict[int, int], list[torch.Tensor]]) -> bytes:
        binding, steps, moments = checked
        described = [
            (slot, step, spec_of(moments[2 * k]), spec_of(moments[2 * k + 1]))
            for k, (slot, step) in enumerate(steps.items())
        ]
        return _layout("save", binding, described)

    binding, steps, moments = placement.agree(check, layout)
    if placement.parallel(path, "save", moments):
        return _save_in_parallel(placement, binding, steps, moments, path, random_counter)

    def write(take: Take) -> int:
        entries = _Entries(binding, steps, take)
        return write_adam(path, binding.slots.schema, binding.config, entries, random_counter)

    version = placement.gather(moments, 2, write)  # one entry is m and v of a parameter
    return int(placement.share(version))


def _save_in_parallel(
    placement: Placement,
    binding: AdamBinding,
    steps: dict[int, int],
    moments: list[torch.Tensor],
    path: Any,
    random_counter: int | None,
) -> int:
    """Every rank writes its own part of each moment (:mod:`.positional`)."""
    schema, config = binding.slots.schema, binding.config
    version, layout = placement.agree(lambda: adam_layout(schema, config, steps, random_counter))
    # The moments are m and v of each slot in increasing slot order: the entries' order.
    places = {(place.path[-2], place.path[-1]): place.offset for place in layout.payloads}
    offsets = [places[(k, field)] for k in range(len(steps)) for field in _FIELDS]
    staging = HostBuffer(pin=any(t.device.type == "cuda" for t in binding.slots.tensors))
    save_pieces(path, layout, moments, lambda i, local: _host_moment(local, staging), offsets)
    return version


class _MomentSink:
    """Payload sink of a load: each moment payload through the receiver, as it is read."""

    def __init__(self, receiver: Receiver):
        self.receiver = receiver
        self.values = torch.empty(0)  # the buffer being read into

    def buffer(self, record: int, field: str, count: int, dtype: np.dtype) -> Any:
        item = 2 * record + _FIELDS[field]
        self.values = self.receiver.buffer(item, count, torch_dtype_of(dtype))
        return self.values.numpy()

    def done(self, record: int, field: str, buffer: Any) -> None:
        self.receiver.put(2 * record + _FIELDS[field], self.values)


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
    """The complete replacement state, built off to the side, in param-group order."""
    slots = binding.slots
    by_param: dict[int, dict] = {}
    for i in slots.schema.representative_slots:
        p, group = slots.tensors[i], binding.groups[i]
        if group is None:  # pragma: no cover - bind_adam guarantees a group for owners
            raise CheckpointError(f"{slots.label(i)} has no param group")
        by_param[id(p)] = {
            "step": step_tensor(group, p, steps[i], f"{slots.label(i)} step"),
            "exp_avg": _moment(parts[2 * i], p),
            "exp_avg_sq": _moment(parts[2 * i + 1], p),
        }
    state: dict[torch.Tensor, dict] = {}  # keyed by parameter, as torch keeps it
    for group in binding.optimizer.param_groups:
        for p in group["params"]:
            if id(p) in by_param:
                state[p] = by_param[id(p)]
    return state


def _unasked_counter(counter: int | None, restore_random_counter: bool) -> None:
    if counter is not None and not restore_random_counter:
        raise ConfigError(
            f"the file holds a random counter ({counter}) and the caller has nowhere to put"
            " it; pass restore_random_counter=True and restore it",
            field="random_counter",
            actual=counter,
        )


def _load_in_parallel(
    placement: Placement,
    optimizer: torch.optim.Optimizer,
    binding: AdamBinding,
    path: Any,
    restore_random_counter: bool,
) -> OptimizerPlan:
    """Every rank checks the file itself, then reads its own part of each moment
    (:mod:`.positional`); every rank agrees before the plan is made."""
    slots = binding.slots
    with contextlib.ExitStack() as stack:

        def validate() -> tuple[BinaryIO, AdamCheckpoint, dict[tuple[int, str], int], Any]:
            f = stack.enter_context(open(path, "rb"))
            checkpoint, offsets, stamp = validate_adam(
                f, slots.schema, dtype=binding.config.dtype, expected_config=binding.config
            )
            _unasked_counter(checkpoint.random_counter, restore_random_counter)
            return f, checkpoint, offsets, stamp

        def found(checked: tuple) -> bytes:
            _, checkpoint, offsets, stamp = checked
            steps = sorted((slot, entry.step) for slot, entry in checkpoint.entries.items())
            return fingerprint(
                sorted(offsets.items()), steps, checkpoint.random_counter, stamp.size
            )

        f, checkpoint, offsets, stamp = placement.agree(validate, found)
        order = [(slot, field) for slot in slots.schema.representative_slots for field in _FIELDS]
        tensors = [slots.tensors[slot] for slot, _ in order]
        parts: dict[int, torch.Tensor] = {}

        def keep(i: int, piece: np.ndarray) -> None:
            slot, field = order[i]
            device = local_tensor(tensors[i]).device
            parts[2 * slot + _FIELDS[field]] = torch.from_numpy(piece).to(device)

        placement.agree(
            lambda: read_pieces(
                f,
                stamp,
                [offsets[key] for key in order],
                tensors,
                binding.config.dtype.numpy,
                keep,
            )
        )
    steps = {slot: int(entry.step) for slot, entry in checkpoint.entries.items()}
    state = placement.agree(lambda: _new_state(binding, steps, parts))
    return OptimizerPlan(optimizer, state, checkpoint.random_counter)


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
        binding = bind_adam(optimizer, module_or_params)
        placement.check(zip(binding.slots.names, binding.slots.tensors))
        return binding

    binding = placement.agree(check, lambda b: _layout("load", b, restore_random_counter))
    items = [t for t in binding.slots.tensors for _ in _FIELDS]
    if placement.parallel(path, "load", items):
        return _load_in_parallel(placement, optimizer, binding, path, restore_random_counter)
    receiver = placement.receiver(items, in_order=False, on_device=True)

    def read() -> dict[str, Any]:
        checkpoint = read_adam(
            path,
            binding.slots.schema,
            dtype=binding.config.dtype,
            expected_config=binding.config,
            sink=_MomentSink(receiver),
        )
        _unasked_counter(checkpoint.random_counter, restore_random_counter)
        steps = [[slot, entry.step] for slot, entry in checkpoint.entries.items()]
        return {"steps": steps, "counter": checkpoint.random_counter}

    summary = placement.share(placement.transfer(receiver, read))
    steps = {int(slot): int(step) for slot, step in summary["steps"]}
    parts = receiver.received()
    state = placement.agree(lambda: _new_state(binding, steps, parts))
    return OptimizerPlan(optimizer, state, summary["counter"])
