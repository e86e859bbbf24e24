"""The checks of an optimizer-tree load against the live optimizer, beyond its class and
groups (:mod:`.optimizer_trees`): state keys consistent within a group and equal to the live
optimizer's where it has state, and group options of the live values' forms. Each raises a
:class:`~tlckpt.codec.errors.CheckpointError` subclass naming the parameter, key or group;
none changes anything.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from ...codec.errors import ConfigError, SchemaMismatchError
from ...codec.optimizers.optimizer_tree import TreeDocument, is_placeholder

__all__ = ["check_entries", "check_live", "check_form"]


def _walk(value: Any, path: str) -> Iterator[tuple[str, Any]]:
    """``(path, leaf)`` of a decoded value, containers descended (lists, tuples, dicts)."""
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _walk(v, f"{path}[{i}]")
    elif type(value) is dict:
        for k, v in value.items():
            yield from _walk(v, f"{path}.{k}")
    else:
        yield path, value


def _shape_of(value: Any) -> Any:
    """What must agree between two state entries: container kinds and lengths, and
    whether each leaf is a tensor (its values may differ)."""
    if isinstance(value, torch.Tensor) or is_placeholder(value):
        return "tensor"
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, len(value))
    if type(value) is dict:
        return ("dict", tuple(value))
    return "value"


def check_entries(document: TreeDocument) -> None:
    """Within a group, every parameter of one rank with state has the same keys, each with a
    value of the same kind (a tensor or not). By rank, because optimizers factor by it
    (Adafactor keeps ``row_var``/``col_var`` for a matrix, ``variance`` for a vector)."""
    for g, group in enumerate(document.groups):
        firsts: dict[int, tuple[str, dict[str, Any]]] = {}
        for name, _, shape in group.params:
            entry = document.state.get(name)
            if not entry:  # no state, or an empty entry (a parameter looked up, never stepped)
                continue
            first = firsts.get(len(shape))
            if first is None:
                firsts[len(shape)] = (name, {k: _shape_of(v) for k, v in entry.items()})
                continue
            kinds = {k: _shape_of(v) for k, v in entry.items()}
            if set(kinds) != set(first[1]):
                raise SchemaMismatchError(
                    f"the state of {name!r} has keys {sorted(kinds)}; {first[0]!r} of the same"
                    f" group has {sorted(first[1])}",
                    field=f"state.{name}",
                    actual=sorted(kinds),
                    expected=sorted(first[1]),
                )
            for k, kind in kinds.items():
                if (kind == "tensor") != (first[1][k] == "tensor"):
                    raise SchemaMismatchError(
                        f"state {name!r}.{k} and {first[0]!r}.{k} (group {g}) differ in kind",
                        field=f"state.{name}.{k}",
                    )


def check_live(name: str, new: dict[str, Any], live: dict[str, Any]) -> None:
    """The file's state of a parameter against the live optimizer's (a resumed run): the
    same keys; tensors of the same shape and dtype where both have one."""
    if set(new) != set(live):
        raise SchemaMismatchError(
            f"the file's state of {name!r} has keys {sorted(new)}; the optimizer's has"
            f" {sorted(live)}",
            field=f"state.{name}",
            actual=sorted(new),
            expected=sorted(live),
        )
    for key in new:
        pairs = zip(_walk(new[key], f"{name}.{key}"), _walk(live[key], f"{name}.{key}"))
        for (where, a), (_, b) in pairs:
            tensors = isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
            if tensors and (a.shape != b.shape or a.dtype != b.dtype):
                raise SchemaMismatchError(
                    f"state {where} is {a.dtype} {list(a.shape)} in the file; the"
                    f" optimizer's is {b.dtype} {list(b.shape)}",
                    field=f"state.{where}",
                    actual=(str(a.dtype), list(a.shape)),
                    expected=(str(b.dtype), list(b.shape)),
                )


def check_form(saved: Any, live: Any, field: str) -> None:
    """Refuse a group option whose saved value is not of the live value's form: a number
    for a number, a bool for a bool, a string for a string, a tensor of the same dtype and
    shape for a tensor, a tuple or list of the same length for one (element by element);
    ``None`` on either side takes anything (Muon's ``adjust_lr_fn``, a scheduler's key).

    Raises:
        ConfigError: naming the group and key.
    """
    if saved is None or live is None:
        return
    if isinstance(live, torch.Tensor):
        ok = isinstance(saved, torch.Tensor) and (saved.dtype, saved.shape) == (
            live.dtype,
            live.shape,
        )
    elif isinstance(live, bool) or isinstance(saved, bool):
        ok = type(saved) is bool and type(live) is bool
    elif isinstance(live, (int, float)):
        ok = type(saved) in (int, float)
    elif isinstance(live, str):
        ok = type(saved) is str
    elif type(live) in (tuple, list):
        ok = type(saved) is type(live) and len(saved) == len(live)
        if ok:
            for i, (a, b) in enumerate(zip(saved, live)):
                check_form(a, b, f"{field}[{i}]")
    else:
        ok = True  # a caller's own kind of value: the file's, as torch would take it
    if not ok:
        raise ConfigError(
            f"{field} is {type(saved).__name__} {saved!r:.60} in the file; the optimizer's is"
            f" {type(live).__name__} {live!r:.60}",
            field=field,
            actual=type(saved).__name__,
            expected=type(live).__name__,
        )
