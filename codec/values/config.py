"""Adam configuration: kind, the four moment-defining floats and the moment dtype (§3)."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import numpy as np

from ...formats.adam import DTYPE_TAGS, AdamKind, DtypeTag
from ...formats.primitives import float_bits
from ..errors import ConfigError

__all__ = ["MomentDtype", "AdamConfig"]


class MomentDtype(enum.Enum):
    """The dtype of the moment buffers; ``tag`` is v5's dtype tag."""

    FLOAT32 = "float32"
    FLOAT64 = "float64"

    @property
    def numpy(self) -> np.dtype:
        """The payloads' numpy dtype, as the Adam specs store it."""
        return np.dtype(DTYPE_TAGS[self.tag])

    @property
    def tag(self) -> int:
        """v5's ``dtype_tag`` for this dtype."""
        return int(DtypeTag[self.name])

    @classmethod
    def from_tag(cls, tag: int) -> MomentDtype:
        """The dtype a (checked) v5 ``dtype_tag`` names."""
        return cls[DtypeTag(tag).name]


@dataclass(frozen=True)
class AdamConfig:
    """Moment-defining hyperparameters; the learning rate is deliberately not one.

    Floats are kept bit-exact: ``-0.0`` stays ``-0.0`` and NaN payloads survive (NaN never
    validates, but a caller comparing configs sees its exact bits).
    """

    kind: AdamKind
    beta1: float
    beta2: float
    epsilon: float
    weight_decay: float
    dtype: MomentDtype = MomentDtype.FLOAT32

    def __post_init__(self) -> None:
        for name, enum_type in (("kind", AdamKind), ("dtype", MomentDtype)):
            value = getattr(self, name)
            try:
                object.__setattr__(self, name, enum_type(value))
            except (ValueError, TypeError):
                choices = ", ".join(repr(m.value) for m in enum_type)
                raise ConfigError(
                    f"{name} must be one of {choices}, got {value!r}",
                    field=name,
                    actual=value,
                    expected=choices,
                ) from None
        for name in ("beta1", "beta2", "epsilon", "weight_decay"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ConfigError(f"{name} must be a float, got {value!r}", field=name)
            object.__setattr__(self, name, float(value))

    def validate(self) -> None:
        """Check FORMAT.md §3's rules; raise :class:`ConfigError` naming the first bad field."""
        for name in ("beta1", "beta2"):
            b = getattr(self, name)
            if not (math.isfinite(b) and 0.0 <= b < 1.0):
                raise ConfigError(
                    f"{name} must be finite and in [0, 1), got {b!r}",
                    field=name,
                    actual=b,
                    expected="0 <= b < 1",
                )
        with np.errstate(over="ignore", under="ignore"):
            eps = float(self.dtype.numpy.type(self.epsilon))
        if not (math.isfinite(eps) and eps > 0.0):
            raise ConfigError(
                f"epsilon {self.epsilon!r} is {eps!r} in {self.dtype.value}; it must be finite"
                " and > 0",
                field="epsilon",
                actual=self.epsilon,
                expected=f"finite and > 0 in {self.dtype.value}",
            )
        wd = self.weight_decay
        if self.kind is AdamKind.ADAM:
            if wd != 0.0:
                raise ConfigError(
                    f"Adam has no weight decay (got {wd!r}); use AdamW for decoupled decay",
                    field="weight_decay",
                    actual=wd,
                    expected="0.0",
                )
        elif not (math.isfinite(wd) and wd >= 0.0):
            raise ConfigError(
                f"AdamW weight_decay must be finite and >= 0, got {wd!r}",
                field="weight_decay",
                actual=wd,
                expected=">= 0",
            )

    def same_bits(self, other: AdamConfig) -> bool:
        """True only if dtype, kind and all four floats are equal bit for bit."""
        return (
            self.dtype is other.dtype
            and self.kind is other.kind
            and all(
                float_bits(getattr(self, n)) == float_bits(getattr(other, n))
                for n in ("beta1", "beta2", "epsilon", "weight_decay")
            )
        )

    def differences(self, other: AdamConfig) -> list[str]:
        """Human-readable list of the fields whose bits differ (for error messages)."""
        out = []
        if self.dtype is not other.dtype:
            out.append(f"dtype {self.dtype.value} vs {other.dtype.value}")
        if self.kind is not other.kind:
            out.append(f"kind {self.kind.name} vs {other.kind.name}")
        for n in ("beta1", "beta2", "epsilon", "weight_decay"):
            a, b = getattr(self, n), getattr(other, n)
            if float_bits(a) != float_bits(b):
                out.append(f"{n} {a!r} (0x{float_bits(a):016x}) vs {b!r} (0x{float_bits(b):016x})")
        return out
