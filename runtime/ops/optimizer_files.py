"""Adam/AdamW optimizer state ↔ files: TorchLean's ``TLADAMF`` when the state fits one of
its versions, tlckpt's own ``TLCKOPT`` family when it does not; the save, and the load as a
plan committed after.

Both are written once over a :class:`~.placement.Placement` (one process, or every rank of
sharded parameters with rank 0 at the file), and once for both families: they differ only in
the codec writer or reader called and in what an entry holds.

Saving decides the family from the binding (:meth:`~.adam_binding.AdamBinding.fit`): every
slot with state, its step and its moments (``exp_avg``, ``exp_avg_sq``, and
``max_exp_avg_sq`` where its group has amsgrad). A frozen slot whose parameter kept its state
(torch keeps it through a freeze) is one of them: its file is ``TLCKOPT`` version 2. Then it
streams one slot at a time: the codec asks for a slot's entry, and its moments arrive
(gathered, when sharded) and are written before the next (device moments through reusable
pinned host buffers).

Loading reads the file once, whichever family its magic names: the codec checks every rule
as it goes (a ``TLADAMF`` file against the optimizer's one TorchLean config, a ``TLCKOPT``
file against its param groups, slot by slot), and each moment payload goes through the
placement's :class:`~.placement.Receiver` as it is read (in the file's order), into new
tensors of the parameter's dtype on its device (as DTensors laid out like their parameters,
when sharded). Then the complete replacement state is built (``step`` in the form the
optimizer's settings expect; a slot without an entry gets no state, as torch has it before
the slot's first step); the plan's commit swaps it in, in one step. Any error before the
swap leaves the optimizer bit for bit as it was.

A load checks the file's hyperparameters against the live optimizer's bit for bit (a file
belongs to an optimizer of its own settings). A set restore passes ``adopt_config``: then the
file's betas, eps and weight decay are not compared (a scheduler such as ``CyclicLR`` changes
beta1 every step, and a fresh optimizer is built with the defaults) but taken, per param
group, into the plan's ``member_groups``, for the training state to check its document
against and install; the kind, amsgrad and maximize (what the optimizer is, and what state
each slot holds) and every other rule are checked as always.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any, BinaryIO

import numpy as np
import torch

from ...codec.errors import CheckpointError, ConfigError
from ...codec.families import families_differ
from ...codec.fileio.source import PathOrFile, open_regular, open_source
from ...codec.inspection import sniff_family
from ...codec.optimizers.adam import read_adam, validate_adam
from ...codec.optimizers.adam_types import AdamEntry
from ...codec.optimizers.adam_writer import adam_layout, write_adam
from ...codec.optimizers.tlckpt_optimizer import read_optimizer_state
from ...codec.optimizers.tlckpt_optimizer_writer import write_optimizer_state
from ...codec.values.config import AdamConfig
from ...codec.values.optimizer_types import (
    OWN_FAMILY,
    TORCHLEAN_FAMILY,
    OptimizerCheckpoint,
    OptimizerEntry,
    ParamGroupConfig,
)
from ...formats.primitives import bits_float, float_bits
from ...formats.tlckpt_optimizer import GROUP_FLOATS
from ..binding import adam_moments
from ..binding.adam_binding import AdamBinding, bind_optimizer
from ..binding.adam_moments import SlotState
from ..binding.dtensors import fingerprint, local_tensor, spec_of
from ..binding.slots import ModuleOrParams
from ..binding.tensors import HostBuffer, to_host
from ..commit.plans import OptimizerPlan
from ..placement.placement_protocol import Placement, Receiver, Route, Take
from ..placement.positional import read_pieces, save_pieces
from . import optimizer_bulk, optimizer_trees

__all__ = ["save", "plan_load"]


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
        kind, described, slots.schema.representatives, binding.state_group_index, settings, extra
    )


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
        states: dict[int, SlotState],
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
        self.staging = [HostBuffer(pin) for _ in adam_moments.STATE_KEYS]

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
        The version written (on every rank): 2 to 5 for ``TLADAMF``, 1 for ``TLCKOPT``;
        for any other optimizer an optimizer tree's (:mod:`.optimizer_trees`).
    """
    if not isinstance(optimizer, torch.optim.Adam):
        return optimizer_trees.save(
            optimizer,
            module_or_params,
            path,
            random_counter=random_counter,
            require_torchlean=require_torchlean,
        )

    def check() -> tuple[AdamBinding, dict[int, SlotState], Any, list[torch.Tensor]]:
        binding = bind_optimizer(optimizer, module_or_params)
        slots = binding.slots
        placement.check(zip(slots.names, slots.tensors))
        states = adam_moments.checked_states(binding)
        fit = binding.fit(has_state=states.__contains__)
        if require_torchlean and not fit.fits:
            raise fit.refusal()
        keys = [(slot, key) for slot, state in states.items() for key in state.keys]
        live = binding.optimizer.state
        moments = [live[slots.tensors[slot]][key] for slot, key in keys]
        placement.check((f"{slots.names[s]} {key}", m) for (s, key), m in zip(keys, moments))
        return binding, states, fit, moments

    def layout(
        checked: tuple[AdamBinding, dict[int, SlotState], Any, list[torch.Tensor]],
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
    why_not = None if fit.fits else "a TLCKOPT file"
    if placement.route(path, "save", moments, lambda: why_not) is Route.PARALLEL:
        steps = {slot: state.step for slot, state in states.items()}
        return _save_in_parallel(
            placement, binding, fit.config, steps, moments, path, random_counter
        )

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
        # A frozen slot names its group only when it kept state (then the file is version 2).
        slot_groups = [
            g if binding.group_index[i] is not None or i in states else None
            for i, g in enumerate(binding.state_group_index)
        ]
        return write_optimizer_state(
            path, schema, binding.group_configs, slot_groups, entries, random_counter
        )

    # The codec holds one entry's moments at a time: m and v (and max_exp_avg_sq).
    lanes = 2 if fit.fits else adam_moments.PER_SLOT
    version = placement.gather(moments, lanes, write)
    return int(placement.share(version))


def _save_in_parallel(
    placement: Placement,
    binding: AdamBinding,
    config: AdamConfig,
    steps: dict[int, int],
    moments: list[torch.Tensor],
    path: Any,
    random_counter: int | None,
) -> int:
    """A ``TLADAMF`` file, every rank writing its own part of each moment
    (:mod:`.positional`)."""
    schema = binding.slots.schema
    version, layout = placement.agree(lambda: adam_layout(schema, config, steps, random_counter))
    # The moments are m and v of each slot in increasing slot order: the payloads' order.
    staging = HostBuffer(pin=any(t.device.type == "cuda" for t in binding.slots.tensors))
    save_pieces(path, layout, moments, lambda i, local: _host_moment(local, staging))
    return version


class _MomentSink:
    """Payload sink of a load: each moment payload through the receiver, as it is read, in
    memory of the parameter's dtype (the readers have checked that the file's is the same)."""

    def __init__(self, receiver: Receiver, binding: AdamBinding):
        self.receiver = receiver
        self.tensors = binding.slots.tensors
        self.values = torch.empty(0)  # the buffer being read into

    def buffer(self, record: int, field: str, count: int, dtype: np.dtype) -> Any:
        item = adam_moments.item(record, field)
        torch_dtype = self.tensors[record].dtype
        if torch.empty((), dtype=torch_dtype).element_size() != dtype.itemsize:
            raise CheckpointError(  # pragma: no cover - the readers compare the dtypes first
                f"internal error: {dtype} payload for a {torch_dtype} parameter"
            )
        self.values = self.receiver.buffer(item, count, torch_dtype)
        return to_host(self.values)

    def done(self, record: int, field: str, buffer: Any) -> None:
        self.receiver.put(adam_moments.item(record, field), self.values)


#: The hyperparameters a set restore adopts from the optimizer member.
_ADOPTED = ("beta1", "beta2", "epsilon", "weight_decay")


def _member_floats(binding: AdamBinding, checkpoint: Any) -> list[list[int]]:
    """Per live param group, the bits of the file's :data:`_ADOPTED` values (JSON-able, to
    share across ranks): a ``TLADAMF`` file's one config for every group, a ``TLCKOPT``
    file's own groups (as many as the live ones: the reader checked)."""
    if isinstance(checkpoint, OptimizerCheckpoint):
        groups: Any = checkpoint.groups
    else:
        groups = [checkpoint.config] * len(binding.group_configs)
    return [[float_bits(getattr(g, name)) for name in _ADOPTED] for g in groups]


def _member_groups(binding: AdamBinding, floats: list[list[int]]) -> tuple[ParamGroupConfig, ...]:
    """The live groups' configs with the file's :data:`_ADOPTED` values (the kind, amsgrad
    and maximize the reader found equal; the lr stays the live one's)."""
    return tuple(
        dataclasses.replace(live, **{n: bits_float(b) for n, b in zip(_ADOPTED, bits)})
        for live, bits in zip(binding.group_configs, floats)
    )


def _read(
    binding: AdamBinding, path: PathOrFile, receiver: Receiver, adopt_config: bool
) -> dict[str, Any]:
    """Read the file, of either family, into ``receiver``; its steps, random counter and
    hyperparameters (:func:`_member_floats`)."""
    schema = binding.slots.schema
    sink = _MomentSink(receiver, binding)
    with open_source(path) as src:
        family = sniff_family(src.file)
        if family == TORCHLEAN_FAMILY:
            config = binding.fit().require()  # the one config a TLADAMF file can hold
            checkpoint: Any = read_adam(
                src.file,
                schema,
                dtype=config.dtype,
                expected_config=config,
                sink=sink,
                adopt_config=adopt_config,
            )
        elif family == OWN_FAMILY:
            checkpoint = read_optimizer_state(
                src.file,
                schema,
                groups=binding.group_configs,
                slot_groups=binding.state_group_index,
                dtypes=binding.dtypes,
                sink=sink,
                adopt_config=adopt_config,
            )
        else:
            raise families_differ(family, [TORCHLEAN_FAMILY, OWN_FAMILY])
    return _summary(binding, checkpoint)


def _summary(binding: AdamBinding, checkpoint: Any) -> dict[str, Any]:
    """A read file's steps, random counter and hyperparameters (:func:`_member_floats`)."""
    steps = [[slot, entry.step] for slot, entry in checkpoint.entries.items()]
    return {
        "steps": steps,
        "counter": checkpoint.random_counter,
        "groups": _member_floats(binding, checkpoint),
    }


def _family_of(path: PathOrFile) -> str | None:
    """The optimizer family this rank finds at ``path`` (``None``: a file object, or none it
    can read; the load itself then says why)."""
    if not isinstance(path, (str, os.PathLike)):
        return None
    try:
        with open_source(path) as src:
            return sniff_family(src.file)
    except (OSError, CheckpointError):
        return None


def _unasked_counter(counter: int | None, restore_random_counter: bool) -> None:
    if counter is not None and not restore_random_counter:
        raise ConfigError(
            f"the file holds a random counter ({counter}) and the caller has nowhere to"
            " put it; pass restore_random_counter=True and restore it",
            field="random_counter",
            actual=counter,
        )


def _load_in_parallel(
    placement: Placement,
    optimizer: torch.optim.Optimizer,
    binding: AdamBinding,
    path: Any,
    restore_random_counter: bool,
    adopt_config: bool,
) -> OptimizerPlan:
    """A ``TLADAMF`` file: every rank checks it itself, then reads its own part of each
    moment (:mod:`.positional`); every rank agrees before the plan is made."""
    slots = binding.slots
    with contextlib.ExitStack() as stack:

        def validate() -> tuple[BinaryIO, Any, dict[tuple[int, str], int], Any, AdamConfig]:
            f = stack.enter_context(open_regular(path))
            config = binding.fit().require()  # the one config a TLADAMF file can hold
            checkpoint, offsets, stamp = validate_adam(
                f,
                slots.schema,
                dtype=config.dtype,
                expected_config=config,
                adopt_config=adopt_config,
            )
            _unasked_counter(checkpoint.random_counter, restore_random_counter)
            return f, checkpoint, offsets, stamp, config

        def found(checked: tuple) -> bytes:
            _, checkpoint, offsets, stamp, _ = checked
            steps = sorted((slot, entry.step) for slot, entry in checkpoint.entries.items())
            return fingerprint(
                sorted(offsets.items()),
                steps,
                checkpoint.random_counter,
                stamp.size,
                _member_floats(binding, checkpoint),
            )

        f, checkpoint, offsets, stamp, config = placement.agree(validate, found)
        order = sorted(offsets)  # (slot, payload field) of every moment in the file
        tensors = [slots.tensors[slot] for slot, _ in order]
        parts: dict[int, torch.Tensor] = {}

        def keep(i: int, piece: np.ndarray) -> None:
            slot, name = order[i]
            device = local_tensor(tensors[i]).device
            parts[adam_moments.item(slot, name)] = torch.from_numpy(piece).to(device)

        placement.agree(
            lambda: read_pieces(
                f, stamp, [offsets[key] for key in order], tensors, config.dtype.numpy, keep
            )
        )
    steps = {slot: int(entry.step) for slot, entry in checkpoint.entries.items()}
    state = placement.agree(lambda: adam_moments.new_state(binding, steps, parts))
    member = _member_groups(binding, _member_floats(binding, checkpoint))
    return OptimizerPlan(optimizer, state, checkpoint.random_counter, member)


def plan_load(
    placement: Placement,
    optimizer: torch.optim.Optimizer,
    module_or_params: ModuleOrParams,
    path: PathOrFile,
    restore_random_counter: bool,
    adopt_config: bool = False,
) -> OptimizerPlan:
    """Read and check the optimizer's file and build its replacement state (see
    :func:`~tlckpt.runtime.load_optimizer`); nothing live changes.

    Args:
        adopt_config: don't require the file's betas, eps and weight decay to equal the live
            ones (a set restore: the member's are the truth, and the training state installs
            them); every other check stays.

    Returns:
        The plan, holding the file's random counter and hyperparameters
        (``member_groups``); its commit swaps the state in (and changes no param group).
    """
    if not isinstance(optimizer, torch.optim.Adam):
        return optimizer_trees.plan_load(optimizer, module_or_params, path, restore_random_counter)

    def check() -> AdamBinding:
        binding = bind_optimizer(optimizer, module_or_params)
        placement.check(zip(binding.slots.names, binding.slots.tensors))
        return binding

    binding = placement.agree(check, lambda b: _layout("load", b, restore_random_counter))
    items = [t for t in binding.slots.tensors for _ in range(adam_moments.PER_SLOT)]

    def why_not() -> str | None:
        family = _family_of(path)  # a small read, made only where the path is chosen
        if family == TORCHLEAN_FAMILY:
            return None
        return f"a {family} file" if family else "an unreadable file"

    route = placement.route(path, "load", binding.slots.tensors, why_not)
    if route is Route.PARALLEL:
        return _load_in_parallel(
            placement, optimizer, binding, path, restore_random_counter, adopt_config
        )
    bulk = None
    if route is Route.LOCAL_BULK:
        bulk = optimizer_bulk.read_adam_in_bulk(binding, path, adopt_config)
    if bulk is not None:  # this process's host tensors, a TLADAMF path: read in bulk
        checkpoint, parts = bulk
        _unasked_counter(checkpoint.random_counter, restore_random_counter)
        summary = _summary(binding, checkpoint)
    else:
        receiver = placement.receiver(items, in_order=False, on_device=True)

        def read() -> dict[str, Any]:
            summary = _read(binding, path, receiver, adopt_config)
            _unasked_counter(summary["counter"], restore_random_counter)
            return summary

        summary = placement.share(placement.transfer(receiver, read))
        parts = receiver.received()
    steps = {int(slot): int(step) for slot, step in summary["steps"]}
    state = placement.agree(lambda: adam_moments.new_state(binding, steps, parts))
    member = _member_groups(binding, summary["groups"])
    return OptimizerPlan(optimizer, state, summary["counter"], member)
