"""Adam settings shared by tests that write Adam checkpoints by hand (numpy only, no torch)."""

from __future__ import annotations

from ..codec import AdamConfig, AdamKind, MomentDtype

__all__ = ["adamw_config"]


def adamw_config(dtype: MomentDtype = MomentDtype.FLOAT32) -> AdamConfig:
    """The AdamW configuration the tests write when the values do not matter.

    Args:
        dtype: the moments' dtype.

    Returns:
        AdamW with beta1 0.9, beta2 0.999, epsilon 1e-8 and weight decay 0.01.
    """
    return AdamConfig(AdamKind.ADAMW, 0.9, 0.999, 1e-8, 0.01, dtype)
