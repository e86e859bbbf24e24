"""What a live ``torch.optim.Adam``/``AdamW`` means in the files' terms, or why it cannot.

:func:`bind_optimizer` matches the optimizer to the parameter slots and reads every param
group's hyperparameters bit for bit (kind from the class and ``decoupled_weight_decay``;
betas, eps, weight decay, lr, amsgrad, maximize) and each slot's dtype. What no file can hold
is refused there, before any file is opened: another optimizer, parameters the optimizer and
the module disagree on, tied slots tracked separately, moments of a dtype neither family has
(complex, float8, integers). Whether the state also fits one of TorchLean's ``TLADAMF``
versions is :meth:`AdamBinding.fit`'s verdict (:mod:`tlckpt.codec.optimizers.torchlean_fit`);
:func:`bind_adam` requires it.

It also knows the form of the ``step`` tensor each optimizer setting expects (mirroring
``torch.optim.Adam._init_group`` in torch 2.x), so that installed state is exactly what the
optimizer would have created itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch

from ...codec.errors import CheckpointError, ConfigError, EntryError, SchemaMismatchError
from ...codec.optimizers.torchlean_fit import TorchLeanFit, torchlean_fit
from ...codec.values.config import AdamConfig
from ...codec.values.optimizer_types import MOMENT_DTYPE_NAMES, ParamGroupConfig, validate_group
from ...formats.adam import AdamKind
from .slots import ModuleOrParams, ParameterSlots, parameter_slots

__all__ = [
    "AdamBinding",
    "bind_optimizer",
    "bind_adam",
    "dtype_name",
    "step_tensor",
    "step_value",
]


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` → ``"bfloat16"``: a moment dtype as the files name it."""
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class AdamBinding:
    """A live optimizer matched to the destination's parameter slots.

    Attributes:
        optimizer: the ``torch.optim.Adam`` (or ``AdamW``).
        slots: the parameter slots (``module_or_params``).
        groups: per slot, the param group managing the slot's tensor (``None`` when the
            optimizer does not manage it: frozen slots, aliases).
        group_index: per slot, that group's index in ``optimizer.param_groups``.
        group_configs: every param group's hyperparameters, in order.
        dtypes: per slot, its parameter's dtype name (the moment dtype).
        config: the TorchLean config (:func:`bind_adam`), or ``None`` (:func:`bind_optimizer`).
        frozen_group_index: per slot, for a frozen slot the index of the param group managing
            its tensor (the first slot of that tensor: torch keys state by tensor), where
            state it kept from before it was frozen lives; ``None`` for the other slots, and
            for a frozen tensor the optimizer does not manage.
    """

    optimizer: torch.optim.Optimizer
    slots: ParameterSlots
    groups: tuple[dict[str, Any] | None, ...]
    group_index: tuple[int | None, ...]
    group_configs: tuple[ParamGroupConfig, ...]
    dtypes: tuple[str, ...]
    config: AdamConfig | None = None
    frozen_group_index: tuple[int | None, ...] = ()

    @cached_property  # asked once per slot by a load: computed once
    def state_group_index(self) -> tuple[int | None, ...]:
        """Per slot, the index of the param group its state would live in: ``group_index``,
        and ``frozen_group_index`` for frozen slots (``None``: the slot holds no state)."""
        if not self.frozen_group_index:
            return self.group_index
        return tuple(
            g if g is not None else f for g, f in zip(self.group_index, self.frozen_group_index)
        )

    @cached_property
    def state_slots(self) -> tuple[int, ...]:
        """The slots that may hold state, ascending: the representative slots, and the
        frozen slots whose tensor the optimizer manages (state from before the freeze)."""
        return tuple(i for i, g in enumerate(self.state_group_index) if g is not None)

    def group_of(self, slot: int) -> dict[str, Any] | None:
        """The param group that holds the state of ``slot`` (``None``: none)."""
        index = self.state_group_index[slot]
        return None if index is None else self.optimizer.param_groups[index]

    def fit(self, has_state: Callable[[int], bool] | None = None) -> TorchLeanFit:
        """Whether the state fits TorchLean's versions (``has_state``: whether a slot of
        :attr:`state_slots` has state; ``None``: every representative slot has, no frozen
        one)."""
        return torchlean_fit(
            self.slots.schema,
            self.group_configs,
            self.state_group_index,
            self.dtypes,
            has_state=has_state,
            label=self.slots.label,
        )


def _float(value: Any) -> float:
    # torch allows tensor betas and lr (capturable); their value, not the tensor, is the config.
    if isinstance(value, torch.Tensor):
        return float(value.item())
    return float(value)


def _group_config(optimizer: torch.optim.Optimizer, index: int, group: dict) -> ParamGroupConfig:
    beta1, beta2 = group["betas"]
    decoupled = isinstance(optimizer, torch.optim.AdamW) or bool(
        group.get("decoupled_weight_decay", False)
    )
    config = ParamGroupConfig(
        AdamKind.ADAMW if decoupled else AdamKind.ADAM,
        _float(beta1),
        _float(beta2),
        _float(group["eps"]),
        _float(group["weight_decay"]),
        _float(group["lr"]),
        bool(group.get("amsgrad", False)),
        bool(group.get("maximize", False)),
    )
    validate_group(config, index, "param_groups")
    return config


def _check_dtypes(slots: ParameterSlots) -> tuple[str, ...]:
    names = tuple(dtype_name(t.dtype) for t in slots.tensors)
    for i in slots.schema.representative_slots:
        if names[i] not in MOMENT_DTYPE_NAMES:
            raise ConfigError(
                f"{slots.label(i)} is {slots.tensors[i].dtype}: Adam moments of that dtype"
                f" cannot be stored (tlckpt holds {', '.join(MOMENT_DTYPE_NAMES)} moments;"
                " TorchLean checkpoints float32 or float64)",
                field=f"slot {i}",
                actual=names[i],
                expected=MOMENT_DTYPE_NAMES,
            )
    return names


def bind_optimizer(
    optimizer: torch.optim.Optimizer, module_or_params: ModuleOrParams
) -> AdamBinding:
    """Match ``optimizer`` to the parameter slots and read its param groups; refuse what
    no file can hold.

    Args:
        optimizer: a ``torch.optim.Adam`` or ``torch.optim.AdamW``.
        module_or_params: the parameters, as for :func:`~tlckpt.runtime.schema_of`.

    Returns:
        The :class:`AdamBinding` (``config`` is ``None``: see :meth:`AdamBinding.fit`).

    Raises:
        CheckpointError: not an Adam optimizer; the optimizer manages a tensor that is not a
            slot, or misses a trainable slot, or tracks two tied slots separately.
        ConfigError: a trainable parameter of a dtype no file holds; a param group whose
            values torch.optim.Adam itself would refuse.
    """
    if not isinstance(optimizer, torch.optim.Adam):
        raise CheckpointError(
            f"{type(optimizer).__name__} is not supported: tlckpt's optimizer files hold"
            " torch.optim.Adam and torch.optim.AdamW state"
        )
    slots = parameter_slots(module_or_params)
    schema = slots.schema
    index_of: dict[int, int] = {}
    for index, group in enumerate(optimizer.param_groups):
        for p in group["params"]:
            index_of[id(p)] = index
    slot_ids = {id(t) for t in slots.tensors}
    for index, group in enumerate(optimizer.param_groups):
        for k, p in enumerate(group["params"]):
            if id(p) not in slot_ids:
                raise SchemaMismatchError(
                    f"the optimizer manages param_groups[{index}]['params'][{k}] (shape"
                    f" {tuple(p.shape)}), which is not among the given parameters",
                    field=f"param_groups[{index}].params[{k}]",
                )
    group_index: list[int | None] = []
    frozen_group_index: list[int | None] = [None] * len(slots.tensors)
    seen: set[int] = set()  # tensors of earlier slots: a tied frozen tensor's state is one
    for i, t in enumerate(slots.tensors):
        r = schema.representative(i)
        first = id(t) not in seen
        seen.add(id(t))
        if r is None:
            group_index.append(None)
            # Frozen: torch keeps the state it had before the freeze (gradual unfreezing).
            if first:
                frozen_group_index[i] = index_of.get(id(t))
            continue
        if r != i:
            if t is not slots.tensors[r] and id(t) in index_of:
                raise SchemaMismatchError(
                    f"{slots.label(i)} is tied to {slots.label(r)} but the optimizer tracks"
                    " them as two parameters with separate histories",
                    field=f"slot {i}",
                )
            group_index.append(None)
            continue
        if id(t) not in index_of:
            raise SchemaMismatchError(
                f"trainable {slots.label(i)} is not managed by the optimizer",
                field=f"slot {i}",
            )
        group_index.append(index_of[id(t)])
    dtypes = _check_dtypes(slots)
    configs = tuple(
        _group_config(optimizer, index, group) for index, group in enumerate(optimizer.param_groups)
    )
    groups = tuple(None if g is None else optimizer.param_groups[g] for g in group_index)
    return AdamBinding(
        optimizer,
        slots,
        groups,
        tuple(group_index),
        configs,
        dtypes,
        frozen_group_index=tuple(frozen_group_index),
    )


def bind_adam(optimizer: torch.optim.Optimizer, module_or_params: ModuleOrParams) -> AdamBinding:
    """:func:`bind_optimizer`, requiring one of TorchLean's configs (a ``TLADAMF`` file's).

    Raises:
        CheckpointError: as :func:`bind_optimizer`.
        ConfigError: amsgrad, maximize, differing groups, Adam with weight decay, a moment
            dtype other than float32/float64 or two dtypes, or an invalid TorchLean config
            (eps that rounds to 0, ...): the first reason.
    """
    binding = bind_optimizer(optimizer, module_or_params)
    config = binding.fit().require()
    return AdamBinding(
        binding.optimizer,
        binding.slots,
        binding.groups,
        binding.group_index,
        binding.group_configs,
        binding.dtypes,
        config,
        binding.frozen_group_index,
    )


def _scalar_dtype(fused: bool) -> torch.dtype:
    # torch.optim.optimizer._get_scalar_dtype: fused kernels take float32 steps; otherwise
    # the step follows the default dtype (float64 only when that is the default).
    if fused:
        return torch.float32
    return torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32


def step_tensor(group: dict[str, Any], param: torch.Tensor, step: int, label: str) -> torch.Tensor:
    """The ``step`` tensor ``torch.optim.Adam`` itself keeps for ``param`` in ``group``.

    Fused or capturable: a 0-dim tensor on the parameter's device (float32 when fused);
    otherwise a 0-dim tensor on the CPU (kernel launches for a scalar are costly).

    Raises:
        EntryError: ``step`` is not exactly representable in that dtype.
    """
    fused = bool(group.get("fused"))
    on_device = fused or bool(group.get("capturable"))
    dtype = _scalar_dtype(fused)
    device = param.device if on_device else torch.device("cpu")
    value = torch.tensor(float(step), dtype=dtype, device=device)
    if value.item() != step:
        raise EntryError(
            f"{label}: step {step} is not exactly representable in the optimizer's {dtype}"
            " step counter",
            field=label,
            actual=step,
        )
    return value


def step_value(step: Any, label: str) -> int:
    """The integer Adam step count of a live ``state['step']`` (tensor or number).

    Raises:
        EntryError: not a whole number >= 1.
    """
    value = step.item() if isinstance(step, torch.Tensor) else step
    try:
        as_int = int(value)
    except (TypeError, ValueError, OverflowError):
        as_int = None
    if as_int is None or as_int != value or as_int < 1:
        raise EntryError(
            f"{label}: optimizer step {value!r} is not a whole number >= 1",
            field=label,
            actual=value,
        )
    return as_int
