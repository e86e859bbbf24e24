"""Pausing the cyclic garbage collector while a file is parsed or built.

Parsing a file of many small records creates many short-lived, acyclic objects (headers,
contexts, arrays). Each burst triggers collections that walk the caller's whole heap — a
model with tens of thousands of tensors makes that the dominant cost of a load (measured:
15.5 → 9.5 µs per tensor for 20,000 tensors). Reference counting frees these objects
anyway; the collector is re-enabled (if it was enabled) on the way out, exceptions
included.
"""

from __future__ import annotations

import contextlib
import functools
import gc
from collections.abc import Callable, Iterator
from typing import ParamSpec, TypeVar

__all__ = ["gc_paused", "without_gc"]

_P = ParamSpec("_P")
_R = TypeVar("_R")


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Disable the cyclic collector for the block; restore its previous state after."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def without_gc(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """Decorator: run ``fn`` with the cyclic collector paused (see :func:`gc_paused`)."""

    @functools.wraps(fn)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        with gc_paused():
            return fn(*args, **kwargs)

    return wrapper
