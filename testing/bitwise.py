"""Bit-for-bit comparisons of tensors, modules and optimizers, and snapshots to compare
against later (needs torch).

Floating tensors are compared through their storage words, so NaN payloads, ``-0.0`` and
subnormals count: ``torch.equal`` would call two NaNs different and ``-0.0`` equal to ``0.0``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

__all__ = [
    "bits",
    "same",
    "snapshot_module",
    "module_unchanged",
    "modules_equal",
    "snapshot_optimizer",
    "optimizer_unchanged",
    "optimizer_states_equal",
]

#: An element size in bytes → the integer dtype of that width.
_WORDS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bits(t: torch.Tensor) -> torch.Tensor:
    """The storage words of ``t`` (so NaN payloads and -0.0 compare exactly).

    Args:
        t: Any tensor; a complex one is taken as its real and imaginary parts.

    Returns:
        A floating tensor as the integers of its width; any other tensor as it is.
    """
    t = t.detach()
    if t.is_complex():
        t = torch.view_as_real(t.contiguous())
    if t.dtype.is_floating_point:
        return t.contiguous().view(_WORDS[t.element_size()])
    return t


def same(a: Any, b: Any) -> bool:
    """Bit-for-bit equality of tensors (dtype, shape, device, words) or plain values."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and a.device == b.device
            and torch.equal(bits(a).cpu(), bits(b).cpu())
        )
    return type(a) is type(b) and a == b


def snapshot_module(model: torch.nn.Module | Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Clones of every state tensor (state_dict order) or of the given tensors."""
    if isinstance(model, torch.nn.Module):
        return [t.detach().clone() for t in model.state_dict().values()]
    return [t.detach().clone() for t in model]


def module_unchanged(model: Any, snapshot: list[torch.Tensor]) -> bool:
    """Whether a module (or tensors) still holds exactly a :func:`snapshot_module`."""
    current = snapshot_module(model)
    return len(current) == len(snapshot) and all(same(a, b) for a, b in zip(current, snapshot))


def modules_equal(a: torch.nn.Module, b: torch.nn.Module) -> list[str]:
    """The names of the state entries in which two modules differ (in state_dict order)."""
    out = []
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        if not same(x, y):
            out.append(name)
    return out


def snapshot_optimizer(opt: torch.optim.Optimizer) -> dict[str, Any]:
    """Everything an optimizer holds: per parameter (in group order) its state, cloned."""
    order = [p for g in opt.param_groups for p in g["params"]]
    state = []
    for p in order:
        entry = opt.state.get(p)
        state.append(
            None
            if entry is None
            else {
                k: (v.detach().clone() if isinstance(v, torch.Tensor) else v)
                for k, v in entry.items()
            }
        )
    groups = [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]
    return {"state": state, "keys": len(opt.state), "groups": groups}


def optimizer_unchanged(opt: torch.optim.Optimizer, snap: dict[str, Any]) -> bool:
    """Whether an optimizer still holds exactly a :func:`snapshot_optimizer`."""
    now = snapshot_optimizer(opt)
    if now["keys"] != snap["keys"] or now["groups"] != snap["groups"]:
        return False
    for a, b in zip(now["state"], snap["state"]):
        if (a is None) != (b is None):
            return False
        if a is None:
            continue
        if list(a) != list(b) or not all(same(a[k], b[k]) for k in a):
            return False
    return True


def optimizer_states_equal(a: torch.optim.Optimizer, b: torch.optim.Optimizer) -> list[str]:
    """Differences between two optimizers' states, matched by parameter position."""
    out = []
    pa = [p for g in a.param_groups for p in g["params"]]
    pb = [p for g in b.param_groups for p in g["params"]]
    for i, (x, y) in enumerate(zip(pa, pb)):
        sa, sb = a.state.get(x, {}), b.state.get(y, {})
        if list(sa) != list(sb):
            out.append(f"param {i}: keys {list(sa)} vs {list(sb)}")
            continue
        for k in sa:
            if not same(sa[k], sb[k]):
                out.append(f"param {i}: {k} differs ({sa[k]!r} vs {sb[k]!r})")
    return out
