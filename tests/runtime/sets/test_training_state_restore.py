"""What a restore puts into the live optimizer and scheduler from the training state (issue
#20, item 7): execution flags stay the live run's, learning rates come back in the live
form, and a scheduler whose ``load_state_dict`` fails half-way is put back exactly — a
``KeyboardInterrupt`` included — with nothing else changed.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch

from tlckpt import ConfigError, load_checkpoint, save_checkpoint
from tlckpt.testing.models import quadratic_steps

_FLAGS = ("foreach", "fused", "capturable", "differentiable")


def _run(seed: int, scheduler_type: type = torch.optim.lr_scheduler.LambdaLR, **adamw: Any):
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.AdamW(model.parameters(), **{"lr": 1e-2, **adamw})
    scheduler = scheduler_type(optimizer, lambda s: 0.5**s)
    return model, optimizer, scheduler


def _train(model: torch.nn.Module, optimizer: Any, scheduler: Any, steps: int) -> list:
    return quadratic_steps(model, optimizer, steps, scheduler=scheduler, rows=3)


def test_a_gpu_runs_capturable_set_steps_on_cpu(tmp_path: Path) -> None:
    """The document of a run built with ``AdamW(capturable=True, foreach=True)`` (a GPU run's
    flags) restored into a CPU run: its flags stay, and it steps like the run it resumes."""
    model, optimizer, scheduler = _run(0)
    _train(model, optimizer, scheduler, 2)
    for group in optimizer.param_groups:  # what a GPU run's groups hold
        group.update(capturable=True, foreach=True, fused=None)
    save_checkpoint(tmp_path / "s", model=model, optimizer=optimizer, scheduler=scheduler)
    for group in optimizer.param_groups:
        group.update(capturable=False, foreach=None)
    fresh, fresh_opt, fresh_sch = _run(1)
    load_checkpoint(tmp_path / "s", model=fresh, optimizer=fresh_opt, scheduler=fresh_sch)
    assert [[g[k] for k in _FLAGS] for g in fresh_opt.param_groups] == [[None, None, False, False]]
    assert [g["lr"] for g in fresh_opt.param_groups] == [g["lr"] for g in optimizer.param_groups]
    resumed = _train(fresh, fresh_opt, fresh_sch, 3)  # capturable=True would fail on CPU here
    expected = _train(model, optimizer, scheduler, 3)
    assert all(torch.equal(a, b) for a, b in zip(resumed, expected))


def test_a_tensor_learning_rate_is_written_in_place(tmp_path: Path) -> None:
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=torch.tensor(0.02))
    model(torch.ones(1, 4)).sum().backward()
    optimizer.step()
    optimizer.param_groups[0]["lr"].fill_(0.005)  # as a scheduler would
    save_checkpoint(tmp_path / "s", model=model, optimizer=optimizer)
    fresh = torch.nn.Linear(4, 2)
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=torch.tensor(0.02))
    live_lr = fresh_opt.param_groups[0]["lr"]
    load_checkpoint(tmp_path / "s", model=fresh, optimizer=fresh_opt)
    assert fresh_opt.param_groups[0]["lr"] is live_lr  # a captured step holds this tensor
    assert torch.equal(live_lr, torch.tensor(0.005))
    float_opt = torch.optim.AdamW(fresh.parameters(), lr=0.02)  # not of the set's form
    with pytest.raises(ConfigError) as caught:
        load_checkpoint(tmp_path / "s", model=fresh, optimizer=float_opt)
    assert caught.value.field == "param_groups[0].lr"
    assert float_opt.param_groups[0]["lr"] == 0.02 and float_opt.state == {}


class _HalfWay(torch.optim.lr_scheduler.LambdaLR):
    """A scheduler whose ``load_state_dict`` changes things, then raises ``raised``."""

    raised: BaseException = ValueError("refused half-way")

    def load_state_dict(self, state_dict: dict) -> None:
        self.__dict__.update(state_dict)
        self.__dict__["added"] = True
        self.base_lrs.append(99.0)  # in place
        self.optimizer.param_groups[0]["lr"] = 123.0
        raise self.raised


@pytest.mark.parametrize("raised", [ValueError("no"), KeyboardInterrupt()], ids=["error", "ctrl_c"])
def test_a_scheduler_failing_half_way_changes_nothing(tmp_path: Path, raised: Any) -> None:
    model, optimizer, scheduler = _run(0)
    _train(model, optimizer, scheduler, 3)
    save_checkpoint(tmp_path / "s", model=model, optimizer=optimizer, scheduler=scheduler)
    fresh, fresh_opt, fresh_sch = _run(1, type("Raising", (_HalfWay,), {"raised": raised}))
    base_lrs = fresh_sch.base_lrs
    attributes = dict(fresh_sch.__dict__)
    values = copy.deepcopy({k: v for k, v in attributes.items() if k != "optimizer"})
    groups = copy.deepcopy(
        [{k: v for k, v in g.items() if k != "params"} for g in fresh_opt.param_groups]
    )
    weights = {k: v.clone() for k, v in fresh.state_dict().items()}
    with pytest.raises(ConfigError if isinstance(raised, Exception) else KeyboardInterrupt):
        load_checkpoint(tmp_path / "s", model=fresh, optimizer=fresh_opt, scheduler=fresh_sch)
    assert fresh_sch.__dict__.keys() == attributes.keys()
    assert all(fresh_sch.__dict__[k] is v for k, v in attributes.items())  # the same objects
    assert fresh_sch.base_lrs is base_lrs
    assert {k: v for k, v in fresh_sch.__dict__.items() if k != "optimizer"} == values
    assert [{k: v for k, v in g.items() if k != "params"} for g in fresh_opt.param_groups] == groups
    assert all(torch.equal(v, weights[k]) for k, v in fresh.state_dict().items())
    assert fresh_opt.state == {}
