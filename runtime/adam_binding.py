"""What a live ``torch.optim.Adam``/``AdamW`` means in TorchLean's terms, or why it cannot.

The config a checkpoint carries is read off the optimizer's own param groups (kind from the
class and ``decoupled_weight_decay``; betas, eps and weight decay bit for bit; the moment
dtype from the parameters). Everything the format cannot express faithfully is refused here,
before any file is opened: ``amsgrad``, groups that differ, Adam with L2 weight decay, moment
dtypes other than float32/float64, parameters the optimizer and the module disagree on.

It also knows the form of the ``step`` tensor each optimizer setting expects (mirroring
``torch.optim.Adam._init_group`` in torch 2.x), so that installed state is exactly what the
optimizer would have created itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..codec.config import AdamConfig, AdamKind, MomentDtype, float_bits
from ..codec.errors import CheckpointError, ConfigError, EntryError, SchemaMismatchError
from .slots import ModuleOrParams, ParameterSlots, parameter_slots

__all__ = ["AdamBinding", "bind_adam", "step_tensor", "step_value"]

_MOMENT_DTYPES = {torch.float32: MomentDtype.FLOAT32, torch.float64: MomentDtype.FLOAT64}


@dataclass(frozen=True)
class AdamBinding:
    """A live optimizer matched to the destination's parameter slots.

    Attributes:
        optimizer: the ``torch.optim.Adam`` (or ``AdamW``).
        slots: the parameter slots (``module_or_params``).
        config: the optimizer's config in TorchLean's terms (validated).
        groups: per slot, the param group managing the slot's tensor (``None`` when the
            optimizer does not manage it: frozen slots, aliases).
    """

    optimizer: torch.optim.Optimizer
    slots: ParameterSlots
    config: AdamConfig
    groups: tuple[dict[str, Any] | None, ...]


def _float(value: Any) -> float:
    # torch allows tensor betas (capturable); their value, not the tensor, is the config.
    if isinstance(value, torch.Tensor):
        return float(value.item())
    return float(value)


def _group_config(optimizer: torch.optim.Optimizer, index: int, group: dict) -> dict[str, Any]:
    if group.get("amsgrad", False):
        raise ConfigError(
            f"param group {index} has amsgrad=True: its max_exp_avg_sq history has no place"
            " in a TorchLean Adam checkpoint",
            field=f"param_groups[{index}].amsgrad",
            actual=True,
            expected=False,
        )
    beta1, beta2 = group["betas"]
    decoupled = isinstance(optimizer, torch.optim.AdamW) or bool(
        group.get("decoupled_weight_decay", False)
    )
    return {
        "kind": AdamKind.ADAMW if decoupled else AdamKind.ADAM,
        "beta1": _float(beta1),
        "beta2": _float(beta2),
        "epsilon": _float(group["eps"]),
        "weight_decay": _float(group["weight_decay"]),
    }


def _same(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    out = []
    for key, x in a.items():
        y = b[key]
        if key == "kind":
            if x is not y:
                out.append(f"kind {x.name} vs {y.name}")
        elif float_bits(x) != float_bits(y):
            out.append(f"{key} {x!r} vs {y!r}")
    return out


def _moment_dtype(slots: ParameterSlots) -> MomentDtype:
    owners = slots.schema.representative_slots
    if not owners:
        # Nothing trainable: no moment exists, but the file's dtype still follows the model.
        dtypes = {t.dtype for t in slots.tensors}
        if len(dtypes) == 1:
            return _MOMENT_DTYPES.get(dtypes.pop(), MomentDtype.FLOAT32)
        return MomentDtype.FLOAT32
    found: dict[torch.dtype, int] = {}
    for i in owners:
        found.setdefault(slots.tensors[i].dtype, i)
    if len(found) > 1:
        listed = ", ".join(f"{slots.label(i)} is {d}" for d, i in found.items())
        raise ConfigError(
            f"parameters have different dtypes ({listed}); one checkpoint has one moment dtype",
            actual=[str(d) for d in found],
        )
    ((dtype, i),) = found.items()
    if dtype not in _MOMENT_DTYPES:
        raise ConfigError(
            f"{slots.label(i)} is {dtype}: Adam moments of that dtype cannot be stored"
            " (TorchLean checkpoints hold float32 or float64 moments)",
            actual=str(dtype),
            expected="torch.float32 or torch.float64",
        )
    return _MOMENT_DTYPES[dtype]


def _config_of(optimizer: torch.optim.Optimizer, slots: ParameterSlots) -> AdamConfig:
    # Empty groups take no step: their hyperparameters never touch a moment.
    groups = [(i, g) for i, g in enumerate(optimizer.param_groups) if g["params"]]
    groups = groups or [(0, optimizer.param_groups[0])]
    first_index, first_group = groups[0]
    first = _group_config(optimizer, first_index, first_group)
    for index, group in groups[1:]:
        diffs = _same(first, _group_config(optimizer, index, group))
        if diffs:
            raise ConfigError(
                f"param group {index} differs from group {first_index} ({'; '.join(diffs)});"
                " a checkpoint has one config for all parameters",
                field=f"param_groups[{index}]",
            )
    if first["kind"] is AdamKind.ADAM and first["weight_decay"] != 0.0:
        raise ConfigError(
            f"torch.optim.Adam with weight_decay={first['weight_decay']!r} adds L2 decay to"
            " the gradient, which TorchLean's Adam does not have; use torch.optim.AdamW"
            " (decoupled weight decay) or weight_decay=0",
            field="weight_decay",
            actual=first["weight_decay"],
            expected=0.0,
        )
    config = AdamConfig(dtype=_moment_dtype(slots), **first)
    config.validate()
    return config


def bind_adam(optimizer: torch.optim.Optimizer, module_or_params: ModuleOrParams) -> AdamBinding:
    """Match ``optimizer`` to the parameter slots and read its config; refuse what the
    format cannot hold.

    Args:
        optimizer: a ``torch.optim.Adam`` or ``torch.optim.AdamW``.
        module_or_params: the parameters, as for :func:`~tlckpt.runtime.schema_of`.

    Returns:
        The :class:`AdamBinding`.

    Raises:
        CheckpointError: not an Adam optimizer; the optimizer manages a tensor that is not a
            slot, or misses a trainable slot, or tracks two tied slots separately.
        ConfigError: amsgrad, differing groups, Adam with weight decay, a moment dtype other
            than float32/float64, or an invalid config (eps that rounds to 0, ...).
    """
    if not isinstance(optimizer, torch.optim.Adam):
        raise CheckpointError(
            f"{type(optimizer).__name__} is not supported: TorchLean checkpoints hold"
            " torch.optim.Adam and torch.optim.AdamW state"
        )
    slots = parameter_slots(module_or_params)
    schema = slots.schema
    group_of: dict[int, dict[str, Any]] = {}
    for group in optimizer.param_groups:
        for p in group["params"]:
            group_of[id(p)] = group
    slot_ids = {id(t) for t in slots.tensors}
    for index, group in enumerate(optimizer.param_groups):
        for k, p in enumerate(group["params"]):
            if id(p) not in slot_ids:
                raise SchemaMismatchError(
                    f"the optimizer manages param_groups[{index}]['params'][{k}] (shape"
                    f" {tuple(p.shape)}), which is not among the given parameters",
                    field=f"param_groups[{index}].params[{k}]",
                )
    groups: list[dict[str, Any] | None] = []
    for i, t in enumerate(slots.tensors):
        r = schema.representative(i)
        if r is None:
            groups.append(None)
            continue
        if r != i:
            if t is not slots.tensors[r] and id(t) in group_of:
                raise SchemaMismatchError(
                    f"{slots.label(i)} is tied to {slots.label(r)} but the optimizer tracks"
                    " them as two parameters with separate histories",
                    field=f"slot {i}",
                )
            groups.append(None)
            continue
        if id(t) not in group_of:
            raise SchemaMismatchError(
                f"trainable {slots.label(i)} is not managed by the optimizer",
                field=f"slot {i}",
            )
        groups.append(group_of[id(t)])
    config = _config_of(optimizer, slots)
    return AdamBinding(optimizer, slots, config, tuple(groups))


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
