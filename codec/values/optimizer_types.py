"""The values a ``TLCKOPT`` file holds (tlckpt's own optimizer family), shared by its reader,
its writer and the runtime.

:class:`ParamGroupConfig` is one param group's hyperparameters, checked by the spec's own
rules (:data:`~tlckpt.formats.tlckpt_optimizer.PARAM_GROUP`); :class:`OptimizerEntry` is one
slot's state; :class:`OptimizerCheckpoint` a checked file.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...formats.adam import AdamKind
from ...formats.primitives import Valid, float_bits, unwrap
from ...formats.tlckpt_optimizer import (
    GROUP_FLAGS,
    GROUP_FLOATS,
    MOMENT_ARRAYS,
    MOMENT_DTYPES,
    PARAM_GROUP,
)
from ..errors import ConfigError
from .schema import ParameterSchema

__all__ = [
    "MOMENT_DTYPE_NAMES",
    "TORCHLEAN_FAMILY",
    "OWN_FAMILY",
    "ParamGroupConfig",
    "OptimizerEntry",
    "OptimizerCheckpoint",
    "moment_array_dtype",
    "moment_tag",
    "validate_group",
]

#: The optimizer families' names, as ``sniff_family`` gives them: TorchLean's ``TLADAMF``
#: and tlckpt's own ``TLCKOPT``.
TORCHLEAN_FAMILY, OWN_FAMILY = "adam", "tlckpt_optimizer"

#: The moment dtypes the family holds, by name, in tag order.
MOMENT_DTYPE_NAMES: tuple[str, ...] = tuple(MOMENT_DTYPES.values())
_TAG_OF_NAME = {name: tag for tag, name in MOMENT_DTYPES.items()}


def moment_tag(dtype: str) -> int:
    """The ``dtype_tag`` of a moment dtype name.

    Raises:
        ConfigError: the family holds no moments of that dtype.
    """
    try:
        return _TAG_OF_NAME[dtype]
    except (KeyError, TypeError):
        raise ConfigError(
            f"moment dtype {dtype!r} cannot be stored; the family holds"
            f" {', '.join(MOMENT_DTYPE_NAMES)}",
            field="dtype",
            actual=dtype,
            expected=MOMENT_DTYPE_NAMES,
        ) from None


def moment_array_dtype(dtype: str) -> np.dtype:
    """The numpy dtype of a moment dtype's payload arrays (bfloat16: uint16 words)."""
    return np.dtype(MOMENT_ARRAYS[moment_tag(dtype)])


#: The spec's check of each group field, by name.
_CHECKS: dict[str, Valid] = {
    sc.name: unwrap(sc) for sc in PARAM_GROUP.subcons if isinstance(unwrap(sc), Valid)
}


@dataclass(frozen=True)
class ParamGroupConfig:
    """One param group's hyperparameters, as a ``TLCKOPT`` file stores them.

    Floats are kept bit-exact (``-0.0``, NaN payloads); ``lr`` is the learning rate when the
    state was saved, which a load leaves to the live optimizer.

    Attributes:
        kind: Adam (weight decay added to the gradient) or AdamW (decoupled).
        beta1, beta2, epsilon, weight_decay, lr: the group's values.
        amsgrad: whether its entries hold ``max_exp_avg_sq``.
        maximize: whether it maximises its objective.
    """

    kind: AdamKind
    beta1: float
    beta2: float
    epsilon: float
    weight_decay: float
    lr: float
    amsgrad: bool = False
    maximize: bool = False

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "kind", AdamKind(self.kind))
        except (ValueError, TypeError):
            raise ConfigError(
                f"kind must be Adam or AdamW, got {self.kind!r}", field="kind", actual=self.kind
            ) from None
        for name in GROUP_FLOATS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ConfigError(f"{name} must be a float, got {value!r}", field=name)
            object.__setattr__(self, name, float(value))
        for name in GROUP_FLAGS:
            value = getattr(self, name)
            if not isinstance(value, (bool, np.bool_)):
                raise ConfigError(f"{name} must be a bool, got {value!r}", field=name)
            object.__setattr__(self, name, bool(value))

    def values(self) -> dict[str, Any]:
        """The group as the spec's record (``kind`` and the flags as their u64 tags)."""
        out: dict[str, Any] = {"kind": int(self.kind)}
        out.update((name, getattr(self, name)) for name in GROUP_FLOATS)
        out.update((name, int(getattr(self, name))) for name in GROUP_FLAGS)
        return out

    @classmethod
    def from_values(cls, record: Any) -> ParamGroupConfig:
        """A group from the spec's (checked) record."""
        return cls(
            AdamKind(record["kind"]),
            *(record[name] for name in GROUP_FLOATS),
            *(bool(record[name]) for name in GROUP_FLAGS),
        )

    def validate(self) -> None:
        """Apply the spec's checks (torch.optim.Adam's own rules: betas in [0, 1), eps,
        weight decay and lr >= 0, none NaN).

        Raises:
            ConfigError: naming the first field that breaks its rule.
        """
        for name, value in self.values().items():
            check = _CHECKS.get(name)
            if check is not None and not check.check(value, None):
                raise ConfigError(
                    f"{name} must be {check.expected}, got {value!r}",
                    field=name,
                    actual=value,
                    expected=check.expected,
                )

    def differences(self, other: ParamGroupConfig, *, lr: bool = True) -> list[str]:
        """The fields whose bits differ, readably (file vs other); ``lr=False`` leaves the
        learning rate out."""
        out = []
        if self.kind is not other.kind:
            out.append(f"kind {self.kind.name} vs {other.kind.name}")
        for name in GROUP_FLOATS:
            if name == "lr" and not lr:
                continue
            a, b = getattr(self, name), getattr(other, name)
            if float_bits(a) != float_bits(b):
                out.append(
                    f"{name} {a!r} (0x{float_bits(a):016x}) vs {b!r} (0x{float_bits(b):016x})"
                )
        for name in GROUP_FLAGS:
            a, b = getattr(self, name), getattr(other, name)
            if a != b:
                out.append(f"{name} {a} vs {b}")
        return out

    def same_bits(self, other: ParamGroupConfig, *, lr: bool = True) -> bool:
        """True only if every field is equal bit for bit (``lr=False``: all but the lr)."""
        return not self.differences(other, lr=lr)

    def is_finite(self) -> bool:
        """Whether every float is finite (torch accepts an infinite eps or lr; TorchLean's
        config does not)."""
        return all(math.isfinite(getattr(self, name)) for name in GROUP_FLOATS)


def validate_group(group: ParamGroupConfig, index: int, where: str) -> None:
    """:meth:`ParamGroupConfig.validate` for the optimizer's param group ``index``, whose
    groups the caller calls ``where`` (``"groups"``, ``"param_groups"``).

    Raises:
        ConfigError: its message starts ``param group <index>:``, its field is
            ``<where>[<index>].<field>``.
    """
    try:
        group.validate()
    except ConfigError as exc:
        raise ConfigError(
            f"param group {index}: {exc.reason}",
            field=f"{where}[{index}].{exc.field}",
            actual=exc.actual,
            expected=exc.expected,
        ) from None


@dataclass
class OptimizerEntry:
    """One slot's state: step counter, moment dtype, and flat moment arrays of the dtype's
    array form (:func:`moment_array_dtype`; bfloat16 as uint16 words).

    ``max_exp_avg_sq`` is present exactly when the slot's group has amsgrad.
    """

    step: int
    dtype: str
    m: Any
    v: Any
    max_exp_avg_sq: Any = None


@dataclass
class OptimizerCheckpoint:
    """A fully checked ``TLCKOPT`` file.

    Attributes:
        version: the format version of the file.
        groups: the param groups, in the optimizer's order.
        slot_groups: per slot, its group's index (``None``: frozen or an alias).
        entries: slot id → :class:`OptimizerEntry`, for the slots that have state.
        random_counter: the stored counter, or ``None`` if the file has none.
        schema: the parameter schema stored in the file.
    """

    version: int
    groups: tuple[ParamGroupConfig, ...]
    slot_groups: tuple[int | None, ...]
    entries: dict[int, OptimizerEntry]
    random_counter: int | None = None
    schema: ParameterSchema | None = None
    fields: dict[str, Any] = field(default_factory=dict)
