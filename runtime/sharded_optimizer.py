"""Adam/AdamW state of sharded parameters (DTensor moments: FSDP2, ``distribute_tensor``).

The public :func:`~tlckpt.runtime.save_optimizer` / :func:`~tlckpt.runtime.load_optimizer`
come here when the parameters hold a DTensor; they are then collectives (every rank calls
them; rank 0 alone opens the file), and the file is the one a single process holding the
full moments would write.

Saving: each representative slot's moments are gathered to rank 0 when the codec asks for
that slot's entry (``m`` and ``v`` of one parameter at a time), and written before the next.

Loading: rank 0 reads the whole file once without keeping a payload (every rule of
FORMAT.md §3, and the order of the payloads, since entries may come in any order); every
rank learns the verdict, the steps, the random counter and that order; rank 0 then reads
the payloads again and broadcasts each, every rank keeping its shard of each moment as a
DTensor laid out like its parameter; the complete replacement state is swapped in on every
rank only when all of it has arrived everywhere.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch

from ..codec.adam import AdamEntry, read_adam, write_adam
from ..codec.config import float_bits
from ..codec.errors import CheckpointError, ConfigError
from ..codec.source import PathOrFile
from .adam_binding import AdamBinding, bind_adam, step_tensor
from .collectives import (
    GatherStream,
    ScatterStream,
    broadcast_json,
    check_mesh,
    is_writer,
    share_verdict,
    writer_runs,
)
from .dtensors import fingerprint, is_dtensor, like_dtensor, spec_of
from .optimizer import (
    MissingRandomCounterWarning,
    checked_steps,
    host_moment,
    in_group_order,
    install_state,
    shaped_like,
)
from .sharded_state import open_handle
from .slots import ModuleOrParams
from .tensors import HostBuffer

__all__ = ["save_optimizer", "load_optimizer"]

_FIELDS = ("m", "v")


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


def _check_meshes(binding: AdamBinding) -> None:
    for name, t in zip(binding.slots.names, binding.slots.tensors):
        check_mesh(name, t)


class _GatheredEntries(Mapping[int, AdamEntry]):
    """The codec's entries on rank 0: each slot's full moments, gathered when asked for."""

    def __init__(self, binding: AdamBinding, steps: dict[int, int], stream: GatherStream):
        self.binding = binding
        self.steps = steps
        self.stream = stream
        # Increasing slot order, the codec's and the stream's: m of the k-th at item 2k.
        self.first_item = {slot: 2 * k for k, slot in enumerate(steps)}
        pin = any(t.device.type == "cuda" for t in binding.slots.tensors)
        self.m_host = HostBuffer(pin)
        self.v_host = HostBuffer(pin)

    def __getitem__(self, slot: int) -> AdamEntry:
        if slot not in self.steps:
            raise KeyError(slot)
        k = self.first_item[slot]
        m = host_moment(self.stream.take(k), self.m_host)
        v = host_moment(self.stream.take(k + 1), self.v_host)
        return AdamEntry(self.steps[slot], m, v)

    def __iter__(self) -> Iterator[int]:
        return iter(self.steps)

    def __len__(self) -> int:
        return len(self.steps)


def save_optimizer(
    optimizer: torch.optim.Optimizer,
    module_or_params: ModuleOrParams,
    path: PathOrFile,
    random_counter: int | None,
) -> int:
    """Collective :func:`~tlckpt.runtime.save_optimizer` for sharded parameters.

    Returns:
        The version written (on every rank).
    """
    error: BaseException | None = None
    layout = b""
    moments: list[torch.Tensor] = []
    steps: dict[int, int] = {}
    binding = None
    try:
        binding = bind_adam(optimizer, module_or_params)
        _check_meshes(binding)
        steps = checked_steps(binding)
        state = binding.optimizer.state
        described = []
        for slot, step in steps.items():
            entry = state[binding.slots.tensors[slot]]
            moments += [entry["exp_avg"], entry["exp_avg_sq"]]
            check_mesh(f"{binding.slots.names[slot]} exp_avg", moments[-2])
            check_mesh(f"{binding.slots.names[slot]} exp_avg_sq", moments[-1])
            described.append((slot, step, spec_of(moments[-2]), spec_of(moments[-1])))
        layout = _layout("save", binding, described)
    except Exception as exc:
        error = exc
    share_verdict(error, layout)

    stream = GatherStream(moments, lanes=2)  # one entry is m and v of a parameter
    version = writer_runs(
        stream,
        lambda: write_adam(
            path,
            binding.slots.schema,
            binding.config,
            _GatheredEntries(binding, steps, stream),
            random_counter,
        ),
    )
    return int(broadcast_json(version))


class _Order:
    """Payload sink of the writer's first pass: keeps no payload, notes their order."""

    def __init__(self) -> None:
        self.order: list[tuple[int, str]] = []

    def buffer(self, record: int, field: str, count: int, dtype: np.dtype) -> Any:
        self.order.append((record, field))
        return None

    def done(self, record: int, field: str, buffer: Any) -> None:  # pragma: no cover
        """Never called: every payload is skipped."""


class _Sender:
    """Payload sink of the writer's second pass: each moment into the scatter stream."""

    def __init__(self, binding: AdamBinding, order: list[tuple[int, str]], stream: ScatterStream):
        self.tensors = binding.slots.tensors
        self.order = order
        self.stream = stream
        self.staging = HostBuffer(pin=any(t.device.type == "cuda" for t in self.tensors))

    def buffer(self, record: int, field: str, count: int, dtype: np.dtype) -> Any:
        k = self.stream.position
        if k >= len(self.order) or self.order[k] != (record, field):
            raise CheckpointError(
                f"the file changed while it was being loaded: payload {k} is entry {record}"
                f" {field}, the first pass found {self.order[k] if k < len(self.order) else None}"
            )
        return self.staging.array(count, dtype)

    def done(self, record: int, field: str, buffer: Any) -> None:
        values = torch.from_numpy(buffer).view(self.tensors[record].shape)
        self.stream.put(self.stream.position, values)


def _plan(
    binding: AdamBinding, steps: dict[int, int], parts: dict[tuple[int, str], torch.Tensor]
) -> dict[torch.Tensor, dict]:
    """The complete replacement state on this rank, in param-group order."""
    slots = binding.slots
    by_param: dict[int, dict] = {}
    for i in slots.schema.representative_slots:
        p, group = slots.tensors[i], binding.groups[i]
        if group is None:  # pragma: no cover - bind_adam guarantees a group for owners
            raise CheckpointError(f"{slots.label(i)} has no param group")
        moments = []
        for field in _FIELDS:
            part = parts[(i, field)]
            moments.append(like_dtensor(part, p) if is_dtensor(p) else shaped_like(part, p))
        by_param[id(p)] = {
            "step": step_tensor(group, p, steps[i], f"{slots.label(i)} step"),
            "exp_avg": moments[0],
            "exp_avg_sq": moments[1],
        }
    return in_group_order(binding.optimizer, by_param)


def load_optimizer(
    optimizer: torch.optim.Optimizer,
    module_or_params: ModuleOrParams,
    path: PathOrFile,
    restore_random_counter: bool,
) -> int | None:
    """Collective :func:`~tlckpt.runtime.load_optimizer` for sharded parameters.

    Returns:
        As :func:`~tlckpt.runtime.load_optimizer`, on every rank.
    """
    error: BaseException | None = None
    layout = b""
    binding = None
    summary: dict[str, Any] | None = None
    with contextlib.ExitStack() as stack:
        try:
            binding = bind_adam(optimizer, module_or_params)
            _check_meshes(binding)
            layout = _layout("load", binding, restore_random_counter)
            if is_writer():
                f, start = stack.enter_context(open_handle(path))
                order = _Order()
                checkpoint = read_adam(
                    f,
                    binding.slots.schema,
                    dtype=binding.config.dtype,
                    expected_config=binding.config,
                    sink=order,
                )
                if checkpoint.random_counter is not None and not restore_random_counter:
                    raise ConfigError(
                        f"the file holds a random counter ({checkpoint.random_counter}) and"
                        " the caller has nowhere to put it; pass restore_random_counter=True"
                        " and restore it",
                        field="random_counter",
                        actual=checkpoint.random_counter,
                    )
                summary = {
                    "order": order.order,
                    "steps": [[s, e.step] for s, e in checkpoint.entries.items()],
                    "counter": checkpoint.random_counter,
                }
        except Exception as exc:
            error = exc
        share_verdict(error, layout)  # go / no-go, the same on every rank
        summary = broadcast_json(summary)

        order = [(int(s), str(f)) for s, f in summary["order"]]
        stream = ScatterStream([binding.slots.tensors[s] for s, _ in order])
        if is_writer():
            try:
                f.seek(start)
                read_adam(
                    f,
                    binding.slots.schema,
                    dtype=binding.config.dtype,
                    expected_config=binding.config,
                    sink=_Sender(binding, order, stream),
                )
            except Exception as exc:
                error = exc
            stream.drain()
        else:
            stream.serve()
        plan: dict[torch.Tensor, dict] = {}
        error = error or stream.error
        if error is None:
            try:
                parts = {key: part for key, (_, part) in zip(order, stream)}
                steps = {int(s): int(step) for s, step in summary["steps"]}
                plan = _plan(binding, steps, parts)
            except Exception as exc:
                error = exc
        share_verdict(error)

    counter = summary["counter"]
    if restore_random_counter and counter is None:
        warnings.warn(
            "the checkpoint has no random counter: stochastic training cannot be resumed exactly",
            MissingRandomCounterWarning,
            stacklevel=3,
        )
    install_state(optimizer, plan)  # the commit, on every rank
    return counter if restore_random_counter else None
