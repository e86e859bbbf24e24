"""A set restore takes the optimizer member's hyperparameters (issue #20, item 7): a set
saved with ``betas=(0.8, 0.95)`` resumes an optimizer built with the defaults, bit for bit
like the uninterrupted run (torch's ``load_state_dict`` restores them too), in either
optimizer family; what the optimizer *is* (amsgrad, the Adam/AdamW kind) must still match,
and a single optimizer file still requires its hyperparameters to equal the live ones.
"""

from __future__ import annotations

import copy
import json
import struct
from pathlib import Path
from typing import Any

import pytest
import torch

from tlckpt import ConfigError, load_checkpoint, load_optimizer, save_checkpoint, save_optimizer
from tlckpt.formats.checkpoint_set import MANIFEST_FILE
from tlckpt.testing.models import quadratic_steps

SAVED = {"betas": (0.8, 0.95), "eps": 1e-6, "weight_decay": 0.03}


def _run(seed: int, family: str, kind: type = torch.optim.AdamW, **adam: Any) -> tuple:
    """A model and its optimizer: one config (a ``TLADAMF`` member) or two groups of
    different learning rates and weight decay (a ``TLCKOPT`` member)."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    if family == "tladamf":
        optimizer = kind(model.parameters(), lr=1e-2, **adam)
    else:
        decay = adam.pop("weight_decay", 0.01)
        groups = [
            {"params": model[0].parameters(), "lr": 1e-2, "weight_decay": decay},
            {"params": model[1].parameters(), "lr": 3e-3, "weight_decay": 2 * decay},
        ]
        optimizer = kind(groups, **adam)
    return model, optimizer


def _train(model: torch.nn.Module, optimizer: Any, steps: int, seed: int = 0) -> list[bytes]:
    losses = quadratic_steps(model, optimizer, steps, seed=seed)
    return [struct.pack("<f", loss.item()) for loss in losses]


def _bits(value: Any) -> Any:
    """A value's exact form: tensors by dtype and bytes, floats by bits, containers typed."""
    if isinstance(value, torch.Tensor):
        return ("tensor", value.dtype, bytes(value.detach().reshape(-1).view(torch.uint8)))
    if isinstance(value, float):
        return ("float", struct.pack("<d", value))
    if isinstance(value, dict):
        return {k: _bits(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, [_bits(v) for v in value])
    return (type(value).__name__, value)


def _groups(optimizer: Any) -> Any:
    return _bits([{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups])


def _everything(model: torch.nn.Module, optimizer: Any) -> Any:
    return _bits(copy.deepcopy(model.state_dict())), _bits(copy.deepcopy(optimizer.state_dict()))


@pytest.mark.parametrize("family", ["tladamf", "tlckopt"])
def test_a_set_restores_the_members_betas_into_a_default_optimizer(
    tmp_path: Path, family: str
) -> None:
    """The issue's case: built with the defaults, the fresh optimizer takes the set's betas,
    eps and weight decay, and the run goes on bit for bit like the uninterrupted one."""
    reference, reference_opt = _run(0, family, **SAVED)
    uninterrupted = _train(reference, reference_opt, 7)

    model, optimizer = _run(0, family, **SAVED)
    assert _train(model, optimizer, 4) == uninterrupted[:4]
    save_checkpoint(tmp_path / "s", model=model, optimizer=optimizer, step=4)
    manifest = json.loads((tmp_path / "s" / MANIFEST_FILE).read_text())
    member = "adam" if family == "tladamf" else "tlckpt_optimizer"
    assert manifest["members"]["optimizer"]["family"] == member

    fresh, fresh_opt = _run(1, family)  # torch's default betas, eps, weight decay
    assert fresh_opt.param_groups[0]["betas"] == (0.9, 0.999)
    load_checkpoint(tmp_path / "s", model=fresh, optimizer=fresh_opt)
    assert _groups(fresh_opt) == _groups(optimizer)
    assert _everything(fresh, fresh_opt) == _everything(model, optimizer)
    g = torch.Generator().manual_seed(0)
    for _ in range(4):  # the data the first four steps drew
        torch.randn(5, 4, generator=g)
    resumed = []
    for _ in range(3):
        loss = fresh(torch.randn(5, 4, generator=g)).pow(2).mean()
        fresh_opt.zero_grad()
        loss.backward()
        fresh_opt.step()
        resumed.append(struct.pack("<f", loss.item()))
    assert resumed == uninterrupted[4:]
    assert _everything(fresh, fresh_opt) == _everything(reference, reference_opt)


def test_tensor_betas_take_the_members_values_in_place(tmp_path: Path) -> None:
    """Live betas that are tensors stay the same tensors (a captured step holds them) and
    take the member's values."""
    model, optimizer = _run(0, "tladamf", betas=(0.8, 0.95))
    _train(model, optimizer, 2)
    save_checkpoint(tmp_path / "s", model=model, optimizer=optimizer)
    betas = (torch.tensor(0.9, dtype=torch.float64), torch.tensor(0.999, dtype=torch.float64))
    fresh, fresh_opt = _run(1, "tladamf", betas=betas, foreach=False)
    load_checkpoint(tmp_path / "s", model=fresh, optimizer=fresh_opt)
    live = fresh_opt.param_groups[0]["betas"]
    assert live[0] is betas[0] and live[1] is betas[1]
    assert [b.item() for b in live] == [0.8, 0.95]


def test_a_member_beta_a_live_tensor_cannot_hold_is_refused(tmp_path: Path) -> None:
    """0.95 is no float32: live float32 tensor betas cannot take it exactly. Refused, the
    group and key named, with nothing live changed."""
    model, optimizer = _run(0, "tladamf", betas=(0.75, 0.95))
    _train(model, optimizer, 2)
    save_checkpoint(tmp_path / "s", model=model, optimizer=optimizer)
    betas = (torch.tensor(0.5), torch.tensor(0.5))  # float32
    fresh, fresh_opt = _run(1, "tladamf", betas=betas, foreach=False)
    before = _everything(fresh, fresh_opt), _groups(fresh_opt)
    with pytest.raises(ConfigError, match="not exactly a float32") as caught:
        load_checkpoint(tmp_path / "s", model=fresh, optimizer=fresh_opt)
    assert caught.value.field == "param_groups[0].betas[1]"
    assert (_everything(fresh, fresh_opt), _groups(fresh_opt)) == before


@pytest.mark.parametrize("family", ["tladamf", "tlckopt"])
def test_what_the_optimizer_is_must_still_match(tmp_path: Path, family: str) -> None:
    """amsgrad (which moments each slot holds) and the kind are not adopted: refused, with
    nothing live changed."""
    if family == "tladamf":  # TorchLean's files hold no amsgrad: the kind differs instead
        model, optimizer = _run(0, family, kind=torch.optim.Adam)
        fresh, fresh_opt = _run(1, family, kind=torch.optim.AdamW, weight_decay=0.0)
    else:
        model, optimizer = _run(0, family, amsgrad=True)
        fresh, fresh_opt = _run(1, family)
    _train(model, optimizer, 2)
    save_checkpoint(tmp_path / "s", model=model, optimizer=optimizer)
    before = _everything(fresh, fresh_opt), _groups(fresh_opt)
    with pytest.raises(ConfigError):
        load_checkpoint(tmp_path / "s", model=fresh, optimizer=fresh_opt)
    assert (_everything(fresh, fresh_opt), _groups(fresh_opt)) == before


def test_a_single_optimizer_file_still_requires_its_config(tmp_path: Path) -> None:
    """``load_optimizer`` keeps TorchLean's rule: the file belongs to an optimizer of its own
    hyperparameters."""
    model, optimizer = _run(0, "tladamf", betas=(0.8, 0.95))
    _train(model, optimizer, 2)
    save_optimizer(optimizer, model, tmp_path / "opt.tladam")
    fresh, fresh_opt = _run(1, "tladamf")
    with pytest.raises(ConfigError, match="beta1"):
        load_optimizer(fresh_opt, fresh, tmp_path / "opt.tladam")
    assert fresh_opt.param_groups[0]["betas"] == (0.9, 0.999)
