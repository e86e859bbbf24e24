"""Putting objects back exactly as they were, in place, after code that changed them
half-way raised.

A scheduler's restore calls its ``load_state_dict``: user code, which commonly updates
``__dict__`` with the saved keys first and then fails on one (``LambdaLR`` with a lambda
list of another length; ``SequentialLR`` updating its child schedulers one by one). Loading
the previous ``state_dict`` back does not undo that: the keys it added stay (a saved
``"step": 0`` shadows the ``step`` method). :class:`Rollback` records, before, the contents
of every mutable container reachable from its roots — each object's attribute dictionary,
each list, dict, set and deque — and :meth:`Rollback.restore` writes those contents back
into the very same containers: attributes added are removed, attributes rebound are
rebound, a child scheduler changed in place is changed back, and every object keeps its
identity (a caller holding a child scheduler holds the restored one).

Tensors, optimizers, modules, functions and classes are not walked into: a scheduler
refers to its optimizer, whose parameters are not the scheduler's to change.
"""

from __future__ import annotations

import collections
import types
from collections.abc import Iterable
from typing import Any

import torch

__all__ = ["Rollback"]

# Values that are immutable, or not a scheduler's to change (their contents are not saved).
_OPAQUE = (
    type(None),
    bool,
    int,
    float,
    complex,
    str,
    bytes,
    type,
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodType,
    types.ModuleType,
    torch.Tensor,
    torch.dtype,
    torch.device,
    torch.optim.Optimizer,
    torch.nn.Module,
)


class Rollback:
    """The contents of every mutable container reachable from ``roots``, as of now.

    Args:
        roots: the objects to put back on :meth:`restore` (a scheduler, the optimizer's
            param group dictionaries).
    """

    def __init__(self, roots: Iterable[Any]):
        self._records: list[tuple[Any, Any]] = []
        seen: set[int] = set()
        stack = list(roots)
        while stack:
            obj = stack.pop()
            if isinstance(obj, _OPAQUE) or id(obj) in seen:
                continue
            seen.add(id(obj))  # the records hold every object seen: no id is reused meanwhile
            if isinstance(obj, dict):
                self._records.append((obj, dict(obj)))
                stack.extend(obj.values())
            elif isinstance(obj, (list, collections.deque, set)):
                self._records.append((obj, list(obj)))
                stack.extend(obj)
            elif isinstance(obj, (tuple, frozenset)):
                stack.extend(obj)
            else:
                attributes = getattr(obj, "__dict__", None)
                if isinstance(attributes, dict):
                    self._records.append((obj, None))  # keeps it alive, and its id unique
                    stack.append(attributes)

    def restore(self) -> None:
        """Write every recorded container's contents back, in place (dictionary and list
        operations only: nothing here calls user code or can fail)."""
        for container, contents in self._records:
            if contents is None:
                continue
            # The base types' own methods: a subclass's update (Counter's adds) is not a copy.
            if isinstance(container, dict):
                dict.clear(container)
                dict.update(container, contents)
            elif isinstance(container, list):
                list.__setitem__(container, slice(None), contents)
            elif isinstance(container, set):
                set.clear(container)
                set.update(container, contents)
            else:
                collections.deque.clear(container)
                collections.deque.extend(container, contents)
