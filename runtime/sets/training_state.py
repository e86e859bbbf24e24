"""The training-state member of a checkpoint set: what is captured at a save, and how a
restore puts it back.

Captured: the scheduler's ``state_dict``, every optimizer param group's hyperparameters
(``lr`` included, so a restore puts every group's learning rate back even where the
scheduler's own state would not), the random counter, the global random states (torch's CPU
generator, each initialised CUDA device's, numpy's legacy global generator, Python's
``random``), the step and the caller's ``extra``. Values travel as exact JSON
(:mod:`tlckpt.codec.sets.exact_values`); one that JSON cannot hold exactly is refused, naming
where it is, before anything is written.

A restore is prepared first (:func:`prepare`: every value checked against the live objects,
the param groups' values sorted into checked, restored and left alone
(:mod:`.param_group_values`), the random states checked whole (:mod:`.rng_states`)) and
applied after (:class:`Application`, inside the commit block, the scheduler's load staged
and rolled back on failure), so that nothing live changes unless everything fits.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ...codec.errors import CheckpointError, ConfigError
from ...codec.sets.exact_values import TensorScalar
from ...codec.sets.rng_states import check_random_state
from ...codec.sets.set_document_writing import build_training_state
from ...codec.sets.set_documents import TrainingState
from ...codec.values.optimizer_types import ParamGroupConfig
from ..commit.rollback import Rollback
from . import rng_states
from .param_group_values import member_values, restored_values

__all__ = ["capture", "current_rng_states", "prepare", "Application", "load_schedulers"]


def load_schedulers(
    pairs: Sequence[tuple[Any, Any]], optimizers: Sequence[torch.optim.Optimizer]
) -> None:
    """Load each scheduler's saved state, staged together: everything a scheduler's
    ``load_state_dict`` could change (the schedulers' attributes, their child schedulers, the
    optimizers' param group dictionaries) is recorded first, and put back exactly, in place,
    if one raises — a ``KeyboardInterrupt`` included.

    Args:
        pairs: ``(scheduler, its saved state_dict)`` each.
        optimizers: the optimizers whose param groups the schedulers may change.

    Raises:
        ConfigError: a scheduler refused its state.
        BaseException: what ``load_state_dict`` raised, if not an ``Exception``
            (``KeyboardInterrupt``), after the rollback.
    """
    if not pairs:
        return
    lists = [o.param_groups for o in optimizers]
    before = Rollback([*(s for s, _ in pairs), *lists, *(g for gs in lists for g in gs)])
    try:
        for scheduler, saved in pairs:
            scheduler.load_state_dict(copy.deepcopy(saved))
    except BaseException as exc:  # user code: put everything back, whatever it raised
        before.restore()
        if not isinstance(exc, Exception):
            raise
        which = "the scheduler" if len(pairs) == 1 else "a scheduler"
        raise ConfigError(
            f"{which} refused the saved state: {type(exc).__name__}: {exc}",
            field="scheduler",
        ) from exc


_GROUP_SKIP = ("params",)


def _scalars(value: Any, path: str) -> Any:
    """A hyperparameter with its zero-dimensional tensors (a tensor ``lr``, capturable
    betas) as :class:`TensorScalar`; a larger tensor is refused."""
    if isinstance(value, torch.Tensor):
        if value.dim() != 0:
            raise ConfigError(
                f"{path} is a tensor of shape {tuple(value.shape)}; a hyperparameter tensor must"
                " be zero-dimensional to be saved",
                field=path,
            )
        name = str(value.dtype).removeprefix("torch.")
        return TensorScalar(name, value.item())
    if type(value) in (list, tuple):
        return type(value)(_scalars(v, f"{path}[{i}]") for i, v in enumerate(value))
    return value


def _param_groups(optimizer: torch.optim.Optimizer) -> list[dict[str, Any]]:
    return [
        {k: _scalars(v, f"param_groups[{i}].{k}") for k, v in g.items() if k not in _GROUP_SKIP}
        for i, g in enumerate(optimizer.param_groups)
    ]


def _plain(value: Any) -> Any:
    """numpy's state with arrays and numpy scalars as Python lists and numbers."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v) for v in value)
    return value


def _cuda_states() -> list[bytes]:
    # Only devices this process has initialised have a state worth keeping, and asking an
    # uninitialised CUDA for one would initialise it (seconds, and memory on every device).
    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return []
    return [torch.cuda.get_rng_state(i).numpy().tobytes() for i in range(torch.cuda.device_count())]


def current_rng_states() -> dict[str, Any]:
    """The global random states now — torch's CPU generator, each initialised CUDA device's,
    numpy's legacy global generator, Python's ``random`` — as the training-state document
    holds them (``rng``)."""
    return {
        "torch": torch.get_rng_state().numpy().tobytes(),
        "cuda": _cuda_states(),
        "numpy": _plain(np.random.get_state(legacy=False)),
        "random": random.getstate(),
    }


def capture(
    step: int,
    optimizer: torch.optim.Optimizer | None,
    scheduler: Any,
    random_counter: int | None,
    extra: Any,
) -> bytes:
    """The training-state member's bytes, as of now.

    Raises:
        CheckpointError: a value JSON cannot hold exactly (the message names where: the
            scheduler's ``state_dict`` key path, the param group and key, ``extra``'s path),
            or a random counter outside the u64 range.
    """
    scheduler_state = None
    if scheduler is not None:
        scheduler_state = scheduler.state_dict()
    groups = None if optimizer is None else _param_groups(optimizer)
    return build_training_state(
        step, random_counter, scheduler_state, groups, current_rng_states(), extra
    )


# --------------------------------------------------------------------------- restore


def _in_place(live: Any, value: Any) -> Any:
    """What to store for ``value`` where ``live`` is: a live tensor of the same shape and
    dtype takes the value in place and stays (a compiled or captured step holds it), also
    inside a tuple or list (tensor betas)."""
    if (
        isinstance(live, torch.Tensor)
        and isinstance(value, torch.Tensor)
        and live.shape == value.shape
        and live.dtype == value.dtype
    ):
        live.copy_(value)
        return live
    if type(live) in (tuple, list) and type(value) is type(live) and len(value) == len(live):
        return type(live)(_in_place(a, b) for a, b in zip(live, value))
    return value


def _set_group_value(group: dict[str, Any], key: str, value: Any) -> None:
    """Put a hyperparameter back; a live zero-dimensional tensor keeps its identity (a
    compiled or captured step holds it) and takes the value in place."""
    group[key] = _in_place(group.get(key), value)


@dataclass
class Application:
    """A prepared restore of the training state: :meth:`apply` writes it into the live
    objects (inside the caller's commit block) and cannot fail for a reason of the file's."""

    groups: list[dict[str, Any]] | None
    optimizer: torch.optim.Optimizer | None
    scheduler: Any
    scheduler_state: Any
    rng: dict[str, Any] | None
    saved_groups: list[dict[str, Any]] | None = None

    def apply_scheduler(self) -> None:
        """Load the scheduler's state (first in the commit: the one step that calls user
        code). It is staged: everything the scheduler's ``load_state_dict`` could change
        (the scheduler's attributes, its child schedulers, the optimizer's param group
        dictionaries) is recorded first, and put back exactly, in place, if it raises — a
        ``KeyboardInterrupt`` included; nothing else has changed by then.

        Raises:
            CheckpointError: the scheduler refused the state.
            BaseException: what ``load_state_dict`` raised, if not an ``Exception``
                (``KeyboardInterrupt``), after the rollback.
        """
        if self.scheduler is not None:
            optimizers = [] if self.optimizer is None else [self.optimizer]
            load_schedulers([(self.scheduler, self.scheduler_state)], optimizers)

    def adopt_member(self, member_groups: Sequence[ParamGroupConfig]) -> None:
        """Check the document's param groups against the optimizer member's hyperparameters
        (per group, as the member's plan read them) and add the member's values to those
        :meth:`apply` installs (:func:`~.param_group_values.member_values`); change nothing
        live.

        Raises:
            ConfigError: the document disagrees with the member, or a member value the live
                form cannot hold (the group and key named).
        """
        if self.optimizer is None or self.groups is None:
            return
        saved_groups = self.saved_groups or []
        for i, (values, saved, live, member) in enumerate(
            zip(self.groups, saved_groups, self.optimizer.param_groups, member_groups)
        ):
            values.update(member_values(saved, live, member, i))

    def apply(self) -> None:
        """Param groups' hyperparameters and the random states (dictionary assignments and
        state copies only)."""
        if self.optimizer is not None and self.groups is not None:
            for group, values in zip(self.optimizer.param_groups, self.groups):
                for key, value in values.items():
                    _set_group_value(group, key, value)
        if self.rng is not None:
            torch.set_rng_state(self.rng["torch"])
            for i, state in enumerate(self.rng["cuda"]):
                torch.cuda.set_rng_state(state, i)
            np.random.set_state(self.rng["numpy"])
            random.setstate(self.rng["random"])


def _prepared_rng(saved: dict[str, Any] | None) -> dict[str, Any]:
    """Every random state checked whole (:mod:`.rng_states`), in the form it is installed:
    installing them in the commit cannot fail, nor corrupt a generator."""
    if saved is None:
        raise CheckpointError("the set holds no random states (rng=True asks for them)")
    return {
        "torch": rng_states.cpu_state(saved["torch"]),
        "cuda": rng_states.cuda_states(saved["cuda"]),
        "numpy": rng_states.numpy_state(saved["numpy"]),
        "random": check_random_state(saved["random"]),
    }


def prepare(
    state: TrainingState,
    optimizer: torch.optim.Optimizer | None,
    scheduler: Any,
    rng: bool,
) -> Application:
    """Check the training state against the live objects; change nothing.

    Param groups: the execution flags stay the live run's, and only keys the live group has
    are restored, in the live value's form (:mod:`.param_group_values`); the values the
    optimizer member holds are checked and added once it is read
    (:meth:`Application.adopt_member`).

    Raises:
        CheckpointError: a scheduler is given and the set has none; the set's param groups
            do not match the optimizer's in number, or a group's value disagrees with the
            optimizer (``ConfigError``, the group and key named); ``rng`` and a random state
            that is malformed or does not fit (the field named).
    """
    if scheduler is not None and state.scheduler is None:
        raise CheckpointError("a scheduler was given, and the set holds no scheduler state")
    if scheduler is not None and type(state.scheduler) is not dict:
        raise ConfigError("the set's scheduler state is not a mapping", field="scheduler")
    groups = None
    if optimizer is not None:
        if state.param_groups is None:
            raise CheckpointError("an optimizer was given, and the set holds no param groups")
        if len(state.param_groups) != len(optimizer.param_groups):
            raise ConfigError(
                f"the set holds {len(state.param_groups)} param groups, the optimizer has"
                f" {len(optimizer.param_groups)}",
                field="param_groups",
                actual=len(optimizer.param_groups),
                expected=len(state.param_groups),
            )
        groups = [
            restored_values(saved, live, i)
            for i, (saved, live) in enumerate(zip(state.param_groups, optimizer.param_groups))
        ]
    return Application(
        groups=groups,
        optimizer=optimizer,
        scheduler=scheduler,
        scheduler_state=state.scheduler,
        rng=_prepared_rng(state.rng) if rng else None,
        saved_groups=None if optimizer is None else list(state.param_groups),
    )
