"""Adam/AdamW optimizer state ↔ ``TLADAMF`` checkpoints (FORMAT.md §3), all or nothing.

Saving streams one representative slot at a time (device moments through reusable pinned
host buffers). Loading is plan-then-commit: the codec reads and checks the whole file into
fresh tensors on each parameter's device, the runtime builds the complete replacement state
(``step`` in the form the optimizer's settings expect), and only then is the optimizer's
state swapped in one step. Any error before the swap leaves the optimizer bit for bit as it
was; the replacement tensors are simply dropped.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch

from ..codec.adam import AdamEntry, read_adam, write_adam
from ..codec.errors import CheckpointError, ConfigError, EntryError, names_the_file
from ..codec.gcpause import without_gc
from ..codec.interrupts import deferred_interrupts
from ..codec.source import PathOrFile
from .adam_binding import AdamBinding, bind_adam, step_tensor, step_value
from .dtensors import reusable, sharded
from .slots import ModuleOrParams
from .tensors import HostBuffer, torch_dtype_of

__all__ = ["MissingRandomCounterWarning", "save_optimizer", "load_optimizer"]


class MissingRandomCounterWarning(UserWarning):
    """A random counter was asked for but the file has none: stochastic training (dropout,
    sampling) cannot resume exactly where it stopped."""


def host_moment(t: torch.Tensor, staging: HostBuffer) -> np.ndarray:
    t = t.detach()
    if t.device.type == "cpu":
        return t.reshape(-1).numpy()  # a view of the live moment unless it was strided
    host = staging.tensor(t.numel(), t.dtype)
    host.copy_(t.reshape(-1))  # synchronous: the bytes are there when the codec writes them
    return host.numpy()


class _LiveEntries(Mapping[int, AdamEntry]):
    """The optimizer's moments as the codec's entries, produced one slot at a time."""

    def __init__(self, binding: AdamBinding, steps: dict[int, int]):
        self.binding = binding
        self.steps = steps
        pin = any(t.is_cuda for t in binding.slots.tensors)
        self.m_host = HostBuffer(pin)
        self.v_host = HostBuffer(pin)

    def __getitem__(self, slot: int) -> AdamEntry:
        # .get: indexing the optimizer's defaultdict would insert an empty state.
        state = self.binding.optimizer.state.get(self.binding.slots.tensors[slot])
        if state is None or slot not in self.steps:
            raise KeyError(slot)
        return AdamEntry(
            self.steps[slot],
            host_moment(state["exp_avg"], self.m_host),
            host_moment(state["exp_avg_sq"], self.v_host),
        )

    def __iter__(self) -> Iterator[int]:
        return iter(self.steps)

    def __len__(self) -> int:
        return len(self.steps)


def checked_steps(binding: AdamBinding) -> dict[int, int]:
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


@names_the_file()
@without_gc
def save_optimizer(
    optimizer: torch.optim.Optimizer,
    module_or_params: ModuleOrParams,
    path: PathOrFile,
    *,
    random_counter: int | None = None,
) -> int:
    """Write an Adam/AdamW optimizer's state as a TorchLean checkpoint (atomically).

    The version follows FORMAT.md: float64 moments → 5; else a random counter → 4; else tied
    parameters → 3; else 2. The learning rate is not part of the file.

    Parameters that are DTensors (FSDP2 ``fully_shard``, ``distribute_tensor``) make this a
    collective: every rank calls it and rank 0 alone opens the file (see
    :mod:`tlckpt.runtime.sharded_optimizer`); errors are then raised on every rank alike.

    Args:
        optimizer: ``torch.optim.Adam`` or ``torch.optim.AdamW`` that has taken a step.
        module_or_params: the module (``named_parameters(remove_duplicate=False)`` order)
            or the parameter sequence the checkpoint describes.
        path: destination path, or a binary file object written at its position.
        random_counter: the training run's random counter to store, if it has one.

    Returns:
        The format version written.

    Raises:
        CheckpointError: a refusal (amsgrad, differing groups, Adam with weight decay,
            another dtype, no step taken yet, a trainable parameter without state — named)
            or an invalid counter; checked before the first byte is written.
        OSError: from the file system.

    Example:
        >>> save_optimizer(opt, model, "opt.tladam")               # doctest: +SKIP
        3
    """
    module_or_params = reusable(module_or_params)
    if sharded(module_or_params):
        from . import sharded_optimizer

        return sharded_optimizer.save_optimizer(optimizer, module_or_params, path, random_counter)
    binding = bind_adam(optimizer, module_or_params)
    steps = checked_steps(binding)
    return write_adam(
        path,
        binding.slots.schema,
        binding.config,
        _LiveEntries(binding, steps),
        random_counter,
    )


class _MomentSink:
    """Lands each moment payload in a fresh tensor on its parameter's device.

    CPU moments are read straight into the new tensor's memory; device moments go through
    one reusable pinned host buffer and a synchronous copy.
    """

    def __init__(self, binding: AdamBinding):
        self.tensors = binding.slots.tensors
        self.staging = HostBuffer(pin=any(t.is_cuda for t in self.tensors))
        self.host: torch.Tensor | None = None

    def buffer(self, record: int, field: str, count: int, dtype: np.dtype) -> Any:
        device = self.tensors[record].device
        if device.type == "cpu":
            self.host = torch.empty(count, dtype=torch_dtype_of(dtype))
        else:
            self.host = self.staging.tensor(count, torch_dtype_of(dtype))
        return self.host.numpy()

    def done(self, record: int, field: str, buffer: Any) -> torch.Tensor:
        host, self.host = self.host, None
        device = self.tensors[record].device
        if device.type == "cpu":
            return host
        return host.to(device, copy=True)  # leaves the pinned buffer free for the next one


def shaped_like(flat: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    # Adam creates its moments with zeros_like(p, memory_format=preserve_format): keep the
    # parameter's layout (channels_last, ...) so the optimizer sees what it would have made.
    values = flat.view(param.shape)
    if param.is_contiguous():
        return values
    out = torch.empty_like(param, memory_format=torch.preserve_format, requires_grad=False)
    return out.copy_(values)


def _plan(binding: AdamBinding, entries: dict[int, AdamEntry]) -> dict[torch.Tensor, dict]:
    """The complete replacement state, built off to the side, in param-group order."""
    slots = binding.slots
    by_param: dict[int, dict] = {}
    for i in slots.schema.representative_slots:
        p, entry, group = slots.tensors[i], entries[i], binding.groups[i]
        if group is None:  # pragma: no cover - bind_adam guarantees a group for owners
            raise CheckpointError(f"{slots.label(i)} has no param group")
        by_param[id(p)] = {
            "step": step_tensor(group, p, entry.step, f"{slots.label(i)} step"),
            "exp_avg": shaped_like(entry.m, p),
            "exp_avg_sq": shaped_like(entry.v, p),
        }
    return in_group_order(binding.optimizer, by_param)


def in_group_order(optimizer: torch.optim.Optimizer, by_param: dict[int, dict]) -> dict:
    """The replacement state keyed by parameter, in param-group order (as torch keeps it)."""
    plan: dict[torch.Tensor, dict] = {}
    for group in optimizer.param_groups:
        for p in group["params"]:
            if id(p) in by_param:
                plan[p] = by_param[id(p)]
    return plan


def install_state(optimizer: torch.optim.Optimizer, plan: dict[torch.Tensor, dict]) -> None:
    """The commit of an optimizer load: the optimizer's state becomes ``plan``.

    Dictionary operations only, nothing that can fail halfway; Ctrl-C is held back so that
    it cannot land between the two and leave an optimizer without any state.
    """
    with deferred_interrupts():
        optimizer.state.clear()
        optimizer.state.update(plan)


@names_the_file()
@without_gc
def load_optimizer(
    optimizer: torch.optim.Optimizer,
    module_or_params: ModuleOrParams,
    path: PathOrFile,
    *,
    restore_random_counter: bool = False,
) -> int | None:
    """Load a TorchLean Adam/AdamW checkpoint into a live optimizer, all or nothing.

    The file's config must equal the optimizer's own (kind, betas, eps, weight decay bit for
    bit, moment dtype = the parameters' dtype); its schema must equal the parameters'. The
    whole file is read and checked into new tensors on each parameter's device, then the
    optimizer's state is replaced for all parameters at once (``step`` in the dtype and on
    the device that the optimizer's own ``step`` expects for its foreach / fused /
    capturable settings). The learning rate is left as the optimizer has it.

    Parameters that are DTensors (FSDP2 ``fully_shard``, ``distribute_tensor``) make this a
    collective: every rank calls it and rank 0 alone opens the file (see
    :mod:`tlckpt.runtime.sharded_optimizer`); errors are then raised on every rank alike.

    Args:
        optimizer: ``torch.optim.Adam`` or ``torch.optim.AdamW``.
        module_or_params: the parameters, as for :func:`save_optimizer`.
        path: file path, or a seekable binary file object read from its position.
        restore_random_counter: whether the caller restores the run's random counter.

    Returns:
        The file's random counter when ``restore_random_counter`` is true (``None``, with a
        :class:`MissingRandomCounterWarning`, if the file has none); else ``None``.

    Raises:
        CheckpointError: any refusal of the optimizer (see :func:`save_optimizer`), any
            rejection of the file (a subclass naming field, slot, offset and values), a file
            changed by another process while it was read (``FileChangedError``), or a file
            holding a random counter when ``restore_random_counter`` is false. The optimizer
            is then unchanged; a ``KeyboardInterrupt`` during the swap is raised after it.
        OSError: from the file system.

    Example:
        >>> load_optimizer(opt, model, "opt.tladam")                # doctest: +SKIP
    """
    module_or_params = reusable(module_or_params)
    if sharded(module_or_params):
        from . import sharded_optimizer

        return sharded_optimizer.load_optimizer(
            optimizer, module_or_params, path, restore_random_counter
        )
    binding = bind_adam(optimizer, module_or_params)
    checkpoint = read_adam(
        path,
        binding.slots.schema,
        dtype=binding.config.dtype,
        expected_config=binding.config,
        sink=_MomentSink(binding),
    )
    if checkpoint.random_counter is not None and not restore_random_counter:
        raise ConfigError(
            f"the file holds a random counter ({checkpoint.random_counter}) and the caller"
            " has nowhere to put it; pass restore_random_counter=True and restore it",
            field="random_counter",
            actual=checkpoint.random_counter,
        )
    plan = _plan(binding, checkpoint.entries)
    if restore_random_counter and checkpoint.random_counter is None:
        warnings.warn(
            "the checkpoint has no random counter: stochastic training cannot be resumed exactly",
            MissingRandomCounterWarning,
            stacklevel=2,
        )
    install_state(optimizer, plan)
    return checkpoint.random_counter if restore_random_counter else None
