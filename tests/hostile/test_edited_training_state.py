"""An edited training-state document no longer overrides the optimizer (issue #20, item 7).

The optimizer member holds betas, eps, weight decay, amsgrad and maximize; the document's
copy used to be installed after the member's load, unchecked. The member's values are the
truth: a set restore installs its betas, eps and weight decay (a scheduler cycling beta1, a
fresh optimizer built with the defaults: the live values need not equal them), requires the
live amsgrad, maximize and kind to equal its own, and the document must agree with the
member bit for bit — so an edited document is refused even when it agrees with the live
optimizer instead. Execution flags stay the live run's, and only keys the live group has are
restored, in the live value's form. Every set here is edited and resealed (its digests
recomputed).
"""

from __future__ import annotations

import copy
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from set_editing import edit_training_state

from tlckpt import ConfigError, load_checkpoint, save_checkpoint
from tlckpt.testing.models import quadratic_steps


def _run(seed: int, **adamw: Any) -> tuple[torch.nn.Module, torch.optim.Optimizer, Any]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    groups = [
        {"params": model[0].parameters(), "lr": 1e-2},
        {"params": model[1].parameters(), "lr": 3e-3, "note": "head"},  # a caller's own key
    ]
    optimizer = torch.optim.AdamW(groups, weight_decay=0.01, **adamw)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 0.5**s)
    return model, optimizer, scheduler


def _train(model: torch.nn.Module, optimizer: Any, scheduler: Any, steps: int) -> None:
    quadratic_steps(model, optimizer, steps, scheduler=scheduler)


@pytest.fixture(scope="module")
def saved_set(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("groups") / "s"
    model, optimizer, scheduler = _run(0)
    _train(model, optimizer, scheduler, 3)
    save_checkpoint(folder, model=model, optimizer=optimizer, scheduler=scheduler, step=3)
    return folder


#: A scheduler's references to other objects, compared on their own.
_OWNED = ("optimizer", "_schedulers")


def _snapshot(model: torch.nn.Module, optimizer: Any, scheduler: Any) -> Any:
    return (
        copy.deepcopy(model.state_dict()),
        copy.deepcopy(optimizer.state_dict()),
        [
            {k: copy.deepcopy(v) for k, v in g.items() if k != "params"}
            for g in optimizer.param_groups
        ],
        {k: copy.deepcopy(v) for k, v in scheduler.__dict__.items() if k not in _OWNED},
    )


def _same(a: Any, b: Any) -> bool:
    """Equal bit for bit: tensors by dtype and bytes, containers element by element."""
    if isinstance(a, torch.Tensor):
        return (
            isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and bytes(a.detach().cpu().reshape(-1).contiguous().view(torch.uint8).numpy())
            == bytes(b.detach().cpu().reshape(-1).contiguous().view(torch.uint8).numpy())
        )
    if isinstance(a, dict):
        return type(a) is type(b) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    if callable(a):
        return a is b
    return type(a) is type(b) and (a == b or (a != a and b != b))


def _edited(saved_set: Path, tmp_path: Path, edit: Callable[[list], None]) -> Path:
    folder = tmp_path / "edited"
    shutil.copytree(saved_set, folder)
    edit_training_state(folder, lambda d: edit(d["param_groups"]))
    return folder


def _setting(group: int, key: str, value: Any) -> tuple[str, Callable[[list], None]]:
    """An edit of the document's param groups: ``key`` of group ``group`` set to ``value``
    (a JSON value as the document holds it), and the field a refusal names."""
    return f"param_groups[{group}].{key}", lambda g: g[group].__setitem__(key, value)


REFUSED = {
    "betas": _setting(0, "betas", {"$tuple": [0.8, 0.999]}),
    "eps": _setting(1, "eps", 1e-6),
    "weight_decay": _setting(0, "weight_decay", 0.0),
    "amsgrad": _setting(0, "amsgrad", True),
    "maximize": _setting(1, "maximize", 1),
    "kind": _setting(0, "decoupled_weight_decay", False),
    "lr_text": _setting(0, "lr", "abc"),
    "lr_bool": _setting(0, "lr", True),
    "lr_negative": _setting(1, "lr", -0.5),
    "lr_nan": _setting(1, "lr", {"$float": "0x7ff8000000000000"}),
    "lr_list": _setting(0, "lr", [0.1]),
    "lr_tensor": _setting(0, "lr", {"$tensor": ["float32", 0.25]}),
    "initial_lr_text": _setting(0, "initial_lr", "x"),
    "own_key": _setting(1, "note", 7),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_document_that_disagrees_is_refused(saved_set: Path, tmp_path: Path, name: str) -> None:
    field, edit = REFUSED[name]
    folder = _edited(saved_set, tmp_path, edit)
    model, optimizer, scheduler = _run(1)
    before = _snapshot(model, optimizer, scheduler)
    with pytest.raises(ConfigError) as caught:
        load_checkpoint(folder, model=model, optimizer=optimizer, scheduler=scheduler)
    assert caught.value.field == field, caught.value
    assert _same(_snapshot(model, optimizer, scheduler), before)


@pytest.fixture(scope="module")
def other_betas_set(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A set whose optimizer member's betas and eps are not the ones :func:`_run` builds."""
    folder = tmp_path_factory.mktemp("other") / "s"
    model, optimizer, scheduler = _run(0, betas=(0.8, 0.95), eps=1e-6)
    _train(model, optimizer, scheduler, 3)
    save_checkpoint(folder, model=model, optimizer=optimizer, scheduler=scheduler, step=3)
    return folder


#: Edits that make the document agree with the live optimizer, not with the member.
LIVE_NOT_MEMBER = {
    "betas": _setting(1, "betas", {"$tuple": [0.9, 0.999]}),
    "eps": _setting(0, "eps", 1e-8),
}


@pytest.mark.parametrize("name", sorted(LIVE_NOT_MEMBER))
def test_a_document_agreeing_with_the_live_optimizer_not_the_member_is_refused(
    other_betas_set: Path, tmp_path: Path, name: str
) -> None:
    """The member is the truth: a document edited to the live optimizer's own values (which
    the restore would otherwise leave alone) is refused, the group and key named, with
    nothing live changed."""
    field, edit = LIVE_NOT_MEMBER[name]
    folder = _edited(other_betas_set, tmp_path, edit)
    model, optimizer, scheduler = _run(1)
    before = _snapshot(model, optimizer, scheduler)
    with pytest.raises(ConfigError, match="optimizer member") as caught:
        load_checkpoint(folder, model=model, optimizer=optimizer, scheduler=scheduler)
    assert caught.value.field == field, caught.value
    assert _same(_snapshot(model, optimizer, scheduler), before)


def test_the_unedited_document_installs_the_members_values(other_betas_set: Path) -> None:
    """The same set, unedited, restores into the default-built optimizer with the member's
    betas and eps."""
    model, optimizer, scheduler = _run(1)
    load_checkpoint(other_betas_set, model=model, optimizer=optimizer, scheduler=scheduler)
    assert [(g["betas"], g["eps"]) for g in optimizer.param_groups] == [((0.8, 0.95), 1e-6)] * 2


def test_unknown_keys_and_execution_flags_are_not_installed(
    saved_set: Path, tmp_path: Path
) -> None:
    def edit(groups: list) -> None:
        groups[0]["evil"] = "installed"
        groups[0]["foreach"] = True
        groups[1]["fused"] = True
        groups[1]["capturable"] = True
        groups[1]["differentiable"] = True

    folder = _edited(saved_set, tmp_path, edit)
    model, optimizer, scheduler = _run(1)
    flags = [
        {k: g[k] for k in ("foreach", "fused", "capturable", "differentiable")}
        for g in optimizer.param_groups
    ]
    load_checkpoint(folder, model=model, optimizer=optimizer, scheduler=scheduler)
    assert all("evil" not in g for g in optimizer.param_groups)
    assert [{k: g[k] for k in flags[0]} for g in optimizer.param_groups] == flags
    _train(model, optimizer, scheduler, 1)  # steps as the live run was built to


def test_a_genuine_document_restores_the_learning_rates(saved_set: Path) -> None:
    model, optimizer, scheduler = _run(0)
    _train(model, optimizer, scheduler, 3)
    fresh, fresh_opt, fresh_sch = _run(1)
    load_checkpoint(saved_set, model=fresh, optimizer=fresh_opt, scheduler=fresh_sch)
    # The scheduler's lambdas are this run's own functions: compare its state.
    assert _same(
        _snapshot(fresh, fresh_opt, fresh_sch)[:3], _snapshot(model, optimizer, scheduler)[:3]
    )
    assert fresh_sch.state_dict() == scheduler.state_dict()


# --------------------------------------------------------------------------- scheduler


def test_a_scheduler_refusing_half_way_is_rolled_back(saved_set: Path, tmp_path: Path) -> None:
    """``LambdaLR.load_state_dict`` updates ``__dict__`` first, then fails on a lambda list
    longer than the groups: the keys it added (``step`` shadowing the method) used to stay."""
    folder = tmp_path / "edited"
    shutil.copytree(saved_set, folder)

    def edit(document: dict) -> None:
        document["scheduler"]["step"] = 0
        document["scheduler"]["last_epoch"] = 1000
        document["scheduler"]["lr_lambdas"] = [None, None, {"x": 1}]

    edit_training_state(folder, edit)
    model, optimizer, scheduler = _run(1)
    before = _snapshot(model, optimizer, scheduler)
    with pytest.raises(ConfigError, match="scheduler refused"):
        load_checkpoint(folder, model=model, optimizer=optimizer, scheduler=scheduler)
    assert _same(_snapshot(model, optimizer, scheduler), before)
    assert "step" not in scheduler.__dict__
    _train(model, optimizer, scheduler, 1)


def test_child_schedulers_changed_in_place_are_put_back(tmp_path: Path) -> None:
    """``SequentialLR`` loads its children one by one; a third saved child fails after two
    were changed in place (one given a key it never had)."""

    def run(seed: int) -> tuple[Any, Any, Any, list]:
        model, optimizer, _ = _run(seed)
        children = [
            torch.optim.lr_scheduler.LinearLR(optimizer, 0.5, total_iters=2),
            torch.optim.lr_scheduler.StepLR(optimizer, 2),
        ]
        sequential = torch.optim.lr_scheduler.SequentialLR(optimizer, children, [2])
        return model, optimizer, sequential, children

    model, optimizer, sequential, _ = run(0)
    _train(model, optimizer, sequential, 3)
    save_checkpoint(tmp_path / "s", model=model, optimizer=optimizer, scheduler=sequential)

    def edit(document: dict) -> None:
        children = document["scheduler"]["_schedulers"]
        children[0]["added"] = 1
        children.append(children[1])

    edit_training_state(tmp_path / "s", edit)
    model, optimizer, sequential, children = run(1)
    before = [_snapshot(model, optimizer, s) for s in (sequential, *children)]
    with pytest.raises(ConfigError, match="scheduler refused"):
        load_checkpoint(tmp_path / "s", model=model, optimizer=optimizer, scheduler=sequential)
    assert sequential._schedulers[0] is children[0] and "added" not in children[0].__dict__
    after = [_snapshot(model, optimizer, s) for s in (sequential, *children)]
    assert all(_same(a, b) for a, b in zip(after, before))
