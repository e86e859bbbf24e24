"""Every scheduler of ``torch.optim.lr_scheduler`` resumes bit for bit through a checkpoint
set (issue #20, item 13).

The schedulers are enumerated from the module, so a scheduler that a new torch adds fails
:func:`test_every_scheduler_has_a_recipe` until it has one here. Each runs ``TOTAL`` steps
uninterrupted; and ``SAVE_AT`` steps, a save, fresh model/optimizer/scheduler (another
seed), a restore, and the remaining steps: the learning rates of every step (and momenta,
where the scheduler cycles them), the parameters and the optimizer's state must equal the
uninterrupted run's bit for bit. ``LambdaLR``/``MultiplicativeLR``'s lambdas are not state
(torch's ``state_dict`` drops them): the fresh scheduler brings its own.
"""

from __future__ import annotations

import inspect
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.optim import lr_scheduler as schedulers

from tlckpt import CheckpointManager, load_checkpoint, save_checkpoint

TOTAL = 12
SAVE_AT = 5

Recipe = Callable[[torch.optim.Optimizer], Any]

RECIPES: dict[str, Recipe] = {
    "LambdaLR": lambda o: schedulers.LambdaLR(o, lambda e: 0.9**e),
    "MultiplicativeLR": lambda o: schedulers.MultiplicativeLR(o, lambda e: 0.95),
    "StepLR": lambda o: schedulers.StepLR(o, step_size=3, gamma=0.5),
    # A repeated milestone: the Counter holds 2 for it (the lr drops by gamma**2 there).
    "MultiStepLR": lambda o: schedulers.MultiStepLR(o, milestones=[2, 6, 6, 9], gamma=0.5),
    "ConstantLR": lambda o: schedulers.ConstantLR(o, factor=0.3, total_iters=7),
    "LinearLR": lambda o: schedulers.LinearLR(o, start_factor=0.2, total_iters=8),
    "ExponentialLR": lambda o: schedulers.ExponentialLR(o, gamma=0.9),
    "PolynomialLR": lambda o: schedulers.PolynomialLR(o, total_iters=10, power=2.0),
    "CosineAnnealingLR": lambda o: schedulers.CosineAnnealingLR(o, T_max=7, eta_min=1e-4),
    "ChainedScheduler": lambda o: schedulers.ChainedScheduler(
        [schedulers.MultiStepLR(o, milestones=[3, 8]), schedulers.ExponentialLR(o, gamma=0.9)],
        optimizer=o,
    ),
    "SequentialLR": lambda o: schedulers.SequentialLR(
        o,
        [schedulers.LinearLR(o, start_factor=0.1, total_iters=3), schedulers.MultiStepLR(o, [7])],
        milestones=[4],
    ),
    "ReduceLROnPlateau": lambda o: schedulers.ReduceLROnPlateau(o, patience=1, factor=0.5),
    # Momentum cycling (their default) is tested apart: see MOMENTUM_CYCLING.
    "CyclicLR": lambda o: schedulers.CyclicLR(
        o, base_lr=0.001, max_lr=0.05, step_size_up=3, cycle_momentum=False
    ),
    "OneCycleLR": lambda o: schedulers.OneCycleLR(
        o, max_lr=0.05, total_steps=TOTAL + 1, cycle_momentum=False
    ),
    "CosineAnnealingWarmRestarts": lambda o: schedulers.CosineAnnealingWarmRestarts(
        o, T_0=3, T_mult=2, eta_min=1e-4
    ),
}


#: The schedulers that also cycle Adam's beta1 (their default ``cycle_momentum=True``).
MOMENTUM_CYCLING: dict[str, Recipe] = {
    "CyclicLR": lambda o: schedulers.CyclicLR(o, base_lr=0.001, max_lr=0.05, step_size_up=3),
    "OneCycleLR": lambda o: schedulers.OneCycleLR(o, max_lr=0.05, total_steps=TOTAL + 1),
}


def _all_schedulers() -> list[str]:
    """Every public scheduler class torch defines (its bases excluded)."""
    bases = {schedulers.LRScheduler, getattr(schedulers, "_LRScheduler", None)}
    return sorted(
        name
        for name, cls in vars(schedulers).items()
        if inspect.isclass(cls)
        and issubclass(cls, schedulers.LRScheduler)
        and cls not in bases
        and not name.startswith("_")
        and cls.__module__ == schedulers.__name__
    )


def test_every_scheduler_has_a_recipe() -> None:
    assert set(_all_schedulers()) == set(RECIPES)


def _build(
    name: str, seed: int, recipes: dict[str, Recipe] = RECIPES
) -> tuple[torch.nn.Module, torch.optim.Optimizer, Any]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2))
    groups = [
        {"params": model[0].parameters(), "lr": 0.02},
        {"params": model[2].parameters(), "lr": 0.01},
    ]
    optimizer = torch.optim.AdamW(groups, weight_decay=0.01)
    return model, optimizer, recipes[name](optimizer)


def _bits(x: Any) -> Any:
    if isinstance(x, float):
        return struct.pack("<d", x)
    if isinstance(x, torch.Tensor):
        return x.detach().clone()
    if isinstance(x, (tuple, list)):
        return tuple(_bits(v) for v in x)
    return x


def _hyper(optimizer: torch.optim.Optimizer) -> list[Any]:
    """Each group's lr and betas (CyclicLR and OneCycleLR cycle beta1), as bits."""
    return [(_bits(g["lr"]), _bits(g["betas"])) for g in optimizer.param_groups]


def _steps(name: str, model, optimizer, scheduler, start: int, stop: int) -> list[Any]:
    seen = []
    for i in range(start, stop):
        g = torch.Generator().manual_seed(i)
        x, y = torch.randn(8, 4, generator=g), torch.randn(8, 2, generator=g)
        loss = (model(x) - y).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if name == "ReduceLROnPlateau":
            scheduler.step(round(loss.item(), 1))  # plateaus, so the lr is cut
        else:
            scheduler.step()
        seen.append(_hyper(optimizer))
    return seen


def _same_tensors(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(
        x.dtype == y.dtype and torch.equal(x.view(torch.int32), y.view(torch.int32))
        for x, y in zip(a.state_dict().values(), b.state_dict().values())
    )


def _same_optimizer_state(a: torch.optim.Optimizer, b: torch.optim.Optimizer) -> bool:
    for ga, gb in zip(a.param_groups, b.param_groups):
        for p, q in zip(ga["params"], gb["params"]):
            sa, sb = a.state[p], b.state[q]
            if sorted(sa) != sorted(sb):
                return False
            if not all(torch.equal(sa[k].view(torch.int32), sb[k].view(torch.int32)) for k in sa):
                return False
    return True


def _resume(name: str, tmp_path: Path, recipes: dict[str, Recipe] = RECIPES) -> None:
    model, optimizer, scheduler = _build(name, 0, recipes)
    reference = _steps(name, model, optimizer, scheduler, 0, TOTAL)

    run_model, run_opt, run_sch = _build(name, 0, recipes)
    before = _steps(name, run_model, run_opt, run_sch, 0, SAVE_AT)
    assert before == reference[:SAVE_AT]
    manager = CheckpointManager(tmp_path / "run", keep_last=1)
    manager.save(SAVE_AT, model=run_model, optimizer=run_opt, scheduler=run_sch)

    fresh_model, fresh_opt, fresh_sch = _build(name, 1, recipes)
    restored = manager.restore(model=fresh_model, optimizer=fresh_opt, scheduler=fresh_sch)
    assert restored.step == SAVE_AT
    _same_state_dicts(fresh_sch.state_dict(), run_sch.state_dict())
    after = _steps(name, fresh_model, fresh_opt, fresh_sch, SAVE_AT, TOTAL)
    assert after == reference[SAVE_AT:]
    assert _same_tensors(fresh_model, model) and _same_optimizer_state(fresh_opt, optimizer)


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_resume_through_a_set_is_bit_exact(name: str, tmp_path: Path) -> None:
    _resume(name, tmp_path)


@pytest.mark.parametrize("name", sorted(MOMENTUM_CYCLING))
def test_momentum_cycling_resume_is_bit_exact(name: str, tmp_path: Path) -> None:
    _resume(name, tmp_path, MOMENTUM_CYCLING)


def _same_state_dicts(got: Any, want: Any) -> None:
    """Equal, with the same container types (a Counter stays a Counter)."""
    assert type(got) is type(want), (type(got), type(want))
    if isinstance(want, dict):
        assert list(got) == list(want)
        for k in want:
            _same_state_dicts(got[k], want[k])
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want)
        for a, b in zip(got, want):
            _same_state_dicts(a, b)
    elif isinstance(want, float):
        assert struct.pack("<d", got) == struct.pack("<d", want)
    else:
        assert got == want


def test_multistep_milestones_come_back_a_counter(tmp_path: Path) -> None:
    """The issue's case: MultiStepLR was refused ("a collections.Counter, which JSON cannot
    hold exactly")."""
    model, optimizer, scheduler = _build("MultiStepLR", seed=0)
    _steps("MultiStepLR", model, optimizer, scheduler, 0, 3)
    save_checkpoint(tmp_path / "s", model=model, optimizer=optimizer, scheduler=scheduler)
    fresh_model, fresh_opt, fresh_sch = _build("MultiStepLR", seed=1)
    fresh_sch.milestones = None  # whatever the fresh one holds is replaced
    load_checkpoint(tmp_path / "s", model=fresh_model, optimizer=fresh_opt, scheduler=fresh_sch)
    assert type(fresh_sch.milestones) is type(scheduler.milestones)
    assert list(fresh_sch.milestones.items()) == [(2, 1), (6, 2), (9, 1)]
