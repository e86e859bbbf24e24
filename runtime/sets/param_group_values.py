"""Which of a training-state document's param-group values a restore puts back into the
live optimizer, and the checks that come first.

A param group's keys are of three kinds:

* **the optimizer member's** (:data:`MEMBER_KEYS`: betas, eps, weight decay, amsgrad,
  maximize, and ``decoupled_weight_decay``, which is the kind): the optimizer file holds
  them too, and they are the truth (:func:`member_values`). The document must hold the
  member's values bit for bit (an edited document is refused, a ``ConfigError`` naming the
  group and key). The member's betas, eps and weight decay (:data:`INSTALLED_KEYS`) are
  installed, in the live value's form (a scheduler such as ``CyclicLR`` cycles beta1, and a
  fresh optimizer is built with its defaults: torch's ``load_state_dict`` restores them
  too). amsgrad, maximize and the kind are what the optimizer is (amsgrad: whether each
  slot holds ``max_exp_avg_sq``): the member's load requires the live ones to equal them,
  so nothing is installed;
* **execution flags** (:data:`EXECUTION_FLAGS`: ``fused``, ``foreach``, ``capturable``,
  ``differentiable``): how this run computes a step, not what it computes. They are the live
  run's, neither compared nor restored (a set saved by a GPU run with ``capturable=True``
  restores into a CPU run, whose steps would fail with it);
* **the others** (``lr``, the ``initial_lr`` a scheduler adds, a caller's own keys): restored,
  when the live group has the key and the saved value has the live value's form — a number
  for a number (a learning rate also not negative, not NaN, finite), a zero-dimensional
  tensor of the same dtype for a tensor (written into the live tensor in place), a bool for
  a bool, a string for a string, ``None`` for ``None``, a tuple or list of the same length
  for one, element by element.

A key the live group does not have is not restored (a set written under a newer torch may
hold some; nothing installs a key the optimizer never had). A key the document lacks leaves
the live value as it is (the :data:`INSTALLED_KEYS` aside: the member holds them).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping
from typing import Any

import torch

from ...codec.errors import ConfigError
from ...codec.sets.exact_values import TensorScalar
from ...codec.sets.set_document_checks import short
from ...codec.values.optimizer_types import ParamGroupConfig
from ...formats.adam import AdamKind

__all__ = ["MEMBER_KEYS", "INSTALLED_KEYS", "EXECUTION_FLAGS", "restored_values", "member_values"]

#: The hyperparameters the optimizer member holds: the document must agree with it.
MEMBER_KEYS = frozenset(
    {"betas", "eps", "weight_decay", "amsgrad", "maximize", "decoupled_weight_decay"}
)
#: The member's values a set restore installs into the live groups (the others of
#: :data:`MEMBER_KEYS` its load requires the live optimizer to hold already).
INSTALLED_KEYS = ("betas", "eps", "weight_decay")
#: How the live run computes a step: its own, never restored nor compared.
EXECUTION_FLAGS = frozenset({"fused", "foreach", "capturable", "differentiable"})
#: Keys holding a learning rate: numbers must also be finite and not negative.
_RATES = frozenset({"lr", "initial_lr"})


def _number(value: Any) -> float | None:
    """A number's value as a float (an int, a float, a zero-dimensional tensor, saved or
    live), or ``None`` for anything else (a bool is not a number here)."""
    if isinstance(value, TensorScalar):
        value = value.value
    elif isinstance(value, torch.Tensor):
        if value.dim() != 0:
            return None
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        return float(value)
    except OverflowError:
        return None


def _bits(x: float) -> bytes:
    return struct.pack("<d", x)


def _agrees(saved: Any, live: Any) -> bool:
    """Whether a member key's saved value is the live one, bit for bit (forms aside: a
    tensor beta agrees with the float of its value)."""
    if isinstance(live, bool) or isinstance(saved, bool):
        return type(saved) is bool and type(live) is bool and saved == live
    if saved is None or live is None:  # Adafactor's eps is (None, 1e-3)
        return saved is None and live is None
    if type(live) in (tuple, list):
        return (
            type(saved) in (tuple, list)
            and len(saved) == len(live)
            and all(_agrees(s, v) for s, v in zip(saved, live))
        )
    a, b = _number(saved), _number(live)
    return a is not None and b is not None and _bits(a) == _bits(b)


def _shown(value: Any) -> str:
    if isinstance(value, torch.Tensor) and value.dim() == 0:
        return f"tensor({value.item()!r}, {str(value.dtype).removeprefix('torch.')})"
    if isinstance(value, TensorScalar):
        return f"tensor({value.value!r}, {value.dtype})"
    if type(value) in (tuple, list):
        inner = ", ".join(_shown(v) for v in value)
        return f"({inner})" if type(value) is tuple else f"[{inner}]"
    return short(value)


def _differs(
    field: str, saved: Any, live: Any, why: str, where: str = "the optimizer"
) -> ConfigError:
    return ConfigError(
        f"{field} is {_shown(saved)} in the set's training state, {_shown(live)} in {where}: {why}",
        field=field,
        actual=_shown(live),
        expected=_shown(saved),
    )


def _tensor(saved: Any, live: torch.Tensor, field: str) -> torch.Tensor:
    """A saved zero-dimensional tensor for a live one: same dtype, exactly its value, on the
    live tensor's device."""
    dtype_name = str(live.dtype).removeprefix("torch.")
    if not isinstance(saved, TensorScalar) or saved.dtype != dtype_name or live.dim() != 0:
        raise _differs(field, saved, live, f"a zero-dimensional {dtype_name} tensor is restored")
    if type(saved.value) not in (bool, int, float):
        raise _differs(field, saved, live, "a tensor's value must be a number")
    try:
        value = torch.tensor(saved.value, dtype=live.dtype, device=live.device)
    except (RuntimeError, TypeError, OverflowError) as exc:
        raise _differs(field, saved, live, f"torch refuses the value ({exc})") from None
    if value.item() != saved.value and saved.value == saved.value:  # NaN is never equal
        raise _differs(field, saved, live, f"the value is not exactly a {dtype_name}")
    return value


def _restored(saved: Any, live: Any, field: str) -> Any:
    """The value to install for a restored key, of the live value's form, or why not."""
    if isinstance(live, torch.Tensor):
        return _tensor(saved, live, field)
    if type(live) is bool or live is None or type(live) is str:
        if type(saved) is not type(live):
            raise _differs(field, saved, live, f"a {type(live).__name__} is restored")
        return saved
    if isinstance(live, (int, float)):  # bool handled above; numpy floats are floats
        if type(saved) not in (int, float):
            raise _differs(field, saved, live, "a number is restored")
        return saved
    if type(live) in (tuple, list):
        if type(saved) is not type(live) or len(saved) != len(live):
            raise _differs(
                field, saved, live, f"a {type(live).__name__} of {len(live)} is restored"
            )
        return type(live)(
            _restored(s, v, f"{field}[{i}]") for i, (s, v) in enumerate(zip(saved, live))
        )
    raise _differs(field, saved, live, f"a live {type(live).__name__} is not restored")


def _check_rate(value: Any, live: Any, field: str) -> None:
    rate = _number(value)
    if rate is not None and not (math.isfinite(rate) and rate >= 0.0):
        raise _differs(field, value, live, "a learning rate is finite and not negative")


def restored_values(
    saved: Mapping[str, Any], live: Mapping[str, Any], index: int
) -> dict[str, Any]:
    """Param group ``index``'s values to install, checked (see the module's docstring).

    Args:
        saved: the document's values for the group (``params`` excluded).
        live: the live param group.
        index: the group's index, for errors.

    Returns:
        Key → value to install (tensors already of the live tensor's dtype and device).

    Raises:
        ConfigError: a restored key whose saved value is not of the live value's form (or
            a learning rate negative, NaN or infinite); the group and key named. (The
            :data:`MEMBER_KEYS` are left to :func:`member_values`, once the member is read.)
    """
    out: dict[str, Any] = {}
    for key, value in saved.items():
        field = f"param_groups[{index}].{key}"
        if key in EXECUTION_FLAGS or key in MEMBER_KEYS or key not in live:
            continue
        out[key] = _restored(value, live[key], field)
        if key in _RATES:
            _check_rate(value, live[key], field)
    return out


def _member_value(member: ParamGroupConfig, key: str) -> Any:
    """The member's value for a :data:`MEMBER_KEYS` key, as torch names and forms it."""
    if key == "betas":
        return (member.beta1, member.beta2)
    if key == "eps":
        return member.epsilon
    if key == "decoupled_weight_decay":
        return member.kind is AdamKind.ADAMW
    return getattr(member, key)  # weight_decay, amsgrad, maximize


def _in_live_form(value: Any, live: Any, field: str) -> Any:
    """The member's ``value`` (a float, or a tuple of them) in the live value's form: a
    zero-dimensional tensor of the live dtype and device for a tensor (exactly the value,
    else refused), an int for an int when the value is one exactly, else a float."""
    if type(live) in (tuple, list) and type(value) is tuple and len(live) == len(value):
        return type(live)(
            _in_live_form(v, x, f"{field}[{i}]") for i, (v, x) in enumerate(zip(value, live))
        )
    if isinstance(live, torch.Tensor) and live.dim() == 0 and type(value) is float:
        try:
            out = torch.tensor(value, dtype=live.dtype, device=live.device)
        except (RuntimeError, TypeError, OverflowError) as exc:
            raise _member_differs(field, value, live, f"torch refuses the value ({exc})") from None
        if _bits(out.item()) != _bits(value):
            dtype = str(live.dtype).removeprefix("torch.")
            raise _member_differs(field, value, live, f"the value is not exactly a {dtype}")
        return out
    if isinstance(live, (int, float)) and not isinstance(live, bool) and type(value) is float:
        if type(live) is int and math.isfinite(value) and _bits(float(int(value))) == _bits(value):
            return int(value)  # torch's own default (``weight_decay=0``) keeps its form
        return value
    raise _member_differs(field, value, live, f"a live {type(live).__name__} is not restored")


def _member_differs(field: str, member: Any, live: Any, why: str) -> ConfigError:
    return ConfigError(
        f"{field} is {_shown(member)} in the set's optimizer member, {_shown(live)} in the"
        f" optimizer: {why}",
        field=field,
        actual=_shown(live),
        expected=_shown(member),
    )


def member_values(
    saved: Mapping[str, Any], live: Mapping[str, Any], member: ParamGroupConfig, index: int
) -> dict[str, Any]:
    """Param group ``index``'s :data:`INSTALLED_KEYS` values to install, the member's, once
    the document is found to agree with the member (see the module's docstring).

    Args:
        saved: the document's values for the group.
        live: the live param group.
        member: the optimizer member's hyperparameters for the group.
        index: the group's index, for errors.

    Returns:
        Key → value to install, for the :data:`INSTALLED_KEYS` the live group has, in the
        live value's form.

    Raises:
        ConfigError: a :data:`MEMBER_KEYS` value of the document that differs from the
            member's, or a member value the live form cannot hold exactly (a beta a live
            float16 tensor cannot hold); the group and key named.
    """
    for key in sorted(MEMBER_KEYS & saved.keys()):
        want = _member_value(member, key)
        if not _agrees(saved[key], want):
            raise _differs(
                f"param_groups[{index}].{key}",
                saved[key],
                want,
                "the optimizer member holds the hyperparameters a set restores, and the"
                " training state must agree with it bit for bit",
                where="the set's optimizer member",
            )
    return {
        key: _in_live_form(_member_value(member, key), live[key], f"param_groups[{index}].{key}")
        for key in INSTALLED_KEYS
        if key in live
    }
