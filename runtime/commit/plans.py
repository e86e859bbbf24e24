"""Verified loads waiting to be committed, and the commit: the one place live state is written.

Every load is planned first and committed after. The plan reads and checks the whole file
and builds every new value off to the side (on every rank, for a sharded load); nothing live
changes. The commit then writes live state in one go, inside :func:`committing`: Ctrl-C (and
a Python-handled SIGTERM) is held back until the last tensor is written, so an interrupt
leaves all of the old state or all of the new.

A plan is a context manager (an in-place load's plan holds the open file its commit reads
from). Several plans may be committed in one :func:`committing` block (blocks nest): they
then land together or not at all.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from ...codec.fileio.interrupts import deferred_interrupts
from ...codec.values.optimizer_types import ParamGroupConfig

__all__ = [
    "committing",
    "overwrite",
    "commit",
    "install_state",
    "Plan",
    "StatePlan",
    "OptimizerPlan",
]


@contextlib.contextmanager
def committing() -> Iterator[None]:
    """The block in which live state is written: Ctrl-C held back, autograd off."""
    with deferred_interrupts(), torch.no_grad():
        yield


def overwrite(live: torch.Tensor, values: torch.Tensor) -> None:
    """``live.copy_(values)``, under ``no_grad`` held by the caller. An inference tensor
    accepts in-place writes only under inference mode."""
    if live.is_inference():
        with torch.inference_mode():
            live.copy_(values)
    else:
        live.copy_(values)


def commit(pairs: Iterable[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Copy each new value into its live tensor: all of them, or none if interrupted before
    this begins.

    The values are complete and checked, and ``copy_`` into a tensor of the same shape does
    not fail for a reason of the file's. Ctrl-C is held back until the last copy is done;
    ``pairs`` may be a generator, it is consumed inside.
    """
    with committing():
        for live, values in pairs:
            overwrite(live, values)


def install_state(optimizer: torch.optim.Optimizer, state: dict[torch.Tensor, dict]) -> None:
    """The commit of an optimizer load: the optimizer's state becomes ``state``.

    Dictionary operations only, nothing that can fail halfway; Ctrl-C is held back so that
    it cannot land between the two and leave an optimizer without any state.
    """
    with committing():
        optimizer.state.clear()
        optimizer.state.update(state)


class Plan:
    """A verified load, not yet committed. Use it as a context manager, so that whatever it
    holds (an open file) is released whether or not it is committed."""

    def commit(self) -> Any:
        """Write the new state into the live objects (see :func:`committing`)."""
        raise NotImplementedError

    def close(self) -> None:
        """Release what the plan holds (an in-place plan: its file, which a commit then
        can no longer read)."""

    def __enter__(self) -> Plan:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class StatePlan(Plan):
    """New values for live tensors, complete and checked, held off to the side.

    Args:
        pairs: ``(live memory, new value)``: a plain tensor or a DTensor's local shard, and
            this process's new value for it (same shape; copied with ``copy_``).
    """

    def __init__(self, pairs: list[tuple[torch.Tensor, torch.Tensor]]):
        self.pairs = pairs

    def commit(self) -> None:
        commit(self.pairs)


class OptimizerPlan(Plan):
    """An optimizer's complete replacement state, and the file's random counter.

    Args:
        optimizer: the live optimizer.
        state: its new state, keyed by parameter in param-group order (as torch keeps it).
        random_counter: the file's random counter, or ``None``.
        member_groups: per param group, the hyperparameters the file holds (the live
            group's where the file holds none: the learning rate). The commit leaves the
            param groups alone: a set restore installs these values with the training
            state's.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        state: dict[torch.Tensor, dict],
        random_counter: int | None,
        member_groups: tuple[ParamGroupConfig, ...] = (),
    ):
        self.optimizer = optimizer
        self.state = state
        self.random_counter = random_counter
        self.member_groups = member_groups

    def commit(self) -> None:
        install_state(self.optimizer, self.state)
