"""Checkpoint sets: a whole training state saved, verified, retained and resumed as one.

The run under test: AdamW with two param groups (their own learning rates), a warmup
scheduler, dropout drawing from torch's global generator, numpy and ``random`` draws, and a
random counter. Resumed from a set (saved blocking or in the background), it must continue
bit for bit like the run that was never interrupted.
"""

from __future__ import annotations

import math
import os
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from set_support import assert_same, build, seed_all, train

import tlckpt
from tlckpt import (
    CheckpointError,
    CheckpointManager,
    SchemaMismatchError,
    load_checkpoint,
    save_checkpoint,
    verify_checkpoint,
)
from tlckpt.formats.checkpoint_set import folder_name


@pytest.mark.parametrize("decay_split", [False, True], ids=["lr_groups", "decay_groups"])
@pytest.mark.parametrize("blocking", [True, False], ids=["sync", "async"])
def test_resume_is_bit_exact(tmp_path: Path, blocking: bool, decay_split: bool) -> None:
    seed_all(1)
    model, opt, sch = build(0, decay_split=decay_split)
    counter, _ = train(model, opt, sch, 0, 2)
    at_save = [g["lr"] for g in opt.param_groups]
    manager = CheckpointManager(tmp_path)
    handle = manager.save(
        3,
        model=model,
        optimizer=opt,
        scheduler=sch,
        random_counter=counter,
        extra={"epoch": 0, "note": "warmup"},
        blocking=blocking,
    )
    end, reference = train(model, opt, sch, counter, 4)
    assert handle.wait() == tmp_path / folder_name(3)
    family = tlckpt.inspect(tmp_path / folder_name(3) / "optimizer.tladam")["family"]
    assert family == ("tlckpt_optimizer" if decay_split else "adam")
    assert handle.done() and manager.steps() == [3] and manager.latest() == 3

    fresh, fresh_opt, fresh_sch = build(99, decay_split=decay_split)  # initialised differently
    seed_all(12345)  # and the global generators elsewhere
    restored = manager.restore(model=fresh, optimizer=fresh_opt, scheduler=fresh_sch, rng=True)
    assert (restored.step, restored.random_counter) == (3, counter)
    assert restored.extra == {"epoch": 0, "note": "warmup"}
    # Every group's learning rate came back with the set (mid-warmup).
    assert [g["lr"] for g in fresh_opt.param_groups] == at_save != [1e-2, 3e-3]
    resumed_end, resumed = train(fresh, fresh_opt, fresh_sch, restored.random_counter, 4)
    assert resumed_end == end
    assert all(torch.equal(a, b) for a, b in zip(reference, resumed))
    assert_same(model, opt, sch, fresh, fresh_opt, fresh_sch)


def test_without_rng_the_global_generators_are_left_alone(tmp_path: Path) -> None:
    model, opt, sch = build(0)
    train(model, opt, sch, 0, 1)
    save_checkpoint(tmp_path / "set", model=model, optimizer=opt, scheduler=sch, step=1)
    torch.manual_seed(7)
    before = torch.get_rng_state()
    fresh, fresh_opt, fresh_sch = build(5)
    torch.set_rng_state(before)
    load_checkpoint(tmp_path / "set", model=fresh, optimizer=fresh_opt, scheduler=fresh_sch)
    assert torch.equal(torch.get_rng_state(), before)


def test_async_set_holds_the_values_at_the_call(tmp_path: Path) -> None:
    model, opt, sch = build(0)
    train(model, opt, sch, 0, 2)
    at_call = {k: v.clone() for k, v in model.state_dict().items()}
    moments = {id(p): {k: v.clone() for k, v in s.items()} for p, s in opt.state.items()}
    lrs = [g["lr"] for g in opt.param_groups]
    manager = CheckpointManager(tmp_path)
    handle = manager.save(2, model=model, optimizer=opt, scheduler=sch, blocking=False)
    with torch.no_grad():  # right after the call returns: everything live changes
        for p in model.parameters():
            p.add_(1000.0)
        for s in opt.state.values():
            s["exp_avg"].mul_(-3.0)
            s["exp_avg_sq"].add_(7.0)
            s["step"].add_(5)
    for g in opt.param_groups:
        g["lr"] = 123.0
    handle.wait()
    fresh, fresh_opt, fresh_sch = build(3)
    manager.restore(model=fresh, optimizer=fresh_opt, scheduler=fresh_sch)
    for k, v in fresh.state_dict().items():
        assert torch.equal(v, at_call[k]), k
    for p, q in zip(
        [p for g in opt.param_groups for p in g["params"]],
        [q for g in fresh_opt.param_groups for q in g["params"]],
    ):
        for key, value in moments[id(p)].items():
            assert torch.equal(fresh_opt.state[q][key], value), key
    assert [g["lr"] for g in fresh_opt.param_groups] == lrs


def test_names_that_differ_are_refused_even_with_equal_shapes(tmp_path: Path) -> None:
    model, opt, sch = build(0)
    train(model, opt, sch, 0, 1)
    save_checkpoint(tmp_path / "set", model=model, optimizer=opt, scheduler=sch, step=1)
    other, other_opt, other_sch = build(4, order="ba")  # a and b registered the other way
    before = {k: v.clone() for k, v in other.state_dict().items()}
    with pytest.raises(SchemaMismatchError, match="names differ"):
        load_checkpoint(tmp_path / "set", model=other, optimizer=other_opt, scheduler=other_sch)
    assert all(torch.equal(v, before[k]) for k, v in other.state_dict().items())
    assert other_opt.state == {}


def test_training_state_values_round_trip_exactly(tmp_path: Path) -> None:
    model, opt, sch = build(0)
    train(model, opt, sch, 0, 1)
    nan = np.frombuffer(np.uint64(0x7FF0000000000123).tobytes(), np.float64)[0].item()
    extra = {
        "inf": math.inf,
        "neg": -math.inf,
        "nan": nan,
        "zero": -0.0,
        "big": 2**100,
        "tuple": (1, (2.5, None)),
        7: "int key",
        "$odd": True,
        "nested": [{"a": [1, 2]}, "x"],
    }
    save_checkpoint(tmp_path / "s", model=model, optimizer=opt, scheduler=sch, extra=extra)
    got = load_checkpoint(tmp_path / "s", model=model, optimizer=opt, scheduler=sch).extra
    assert got.keys() == extra.keys()
    assert np.float64(got["nan"]).view(np.uint64) == 0x7FF0000000000123
    assert math.copysign(1.0, got["zero"]) == -1.0
    assert got["tuple"] == (1, (2.5, None)) and type(got["tuple"][1]) is tuple
    assert got["big"] == 2**100 and got[7] == "int key" and got["$odd"] is True
    assert got["inf"] == math.inf and got["neg"] == -math.inf


def test_values_json_cannot_hold_are_refused_by_path(tmp_path: Path) -> None:
    model, _, _ = build(0)
    with pytest.raises(CheckpointError, match=r"extra\.w\[1\] is a torch\.Tensor"):
        save_checkpoint(tmp_path / "s", model=model, extra={"w": [1, torch.ones(2)]})
    with pytest.raises(CheckpointError, match=r"extra\.b is a builtins\.bytes"):
        save_checkpoint(tmp_path / "s", model=model, extra={"b": b"x"})
    assert not (tmp_path / "s").exists() and os.listdir(tmp_path) == []


def test_plateau_scheduler_with_infinities(tmp_path: Path) -> None:
    model, opt, _ = build(0)
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, patience=0)
    train(model, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0), 0, 1)
    save_checkpoint(tmp_path / "s", model=model, optimizer=opt, scheduler=plateau)
    fresh, fresh_opt, _ = build(1)
    fresh_plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(fresh_opt, patience=3)
    load_checkpoint(tmp_path / "s", model=fresh, optimizer=fresh_opt, scheduler=fresh_plateau)
    assert fresh_plateau.state_dict() == plateau.state_dict()
    assert fresh_plateau.best == math.inf and fresh_plateau.patience == 0


def test_a_restore_that_does_not_fit_changes_nothing(tmp_path: Path) -> None:
    model, opt, sch = build(0)
    train(model, opt, sch, 0, 2)
    save_checkpoint(tmp_path / "s", model=model, optimizer=opt, scheduler=sch, step=2)
    fresh, _, _ = build(1)
    other_opt = torch.optim.AdamW(fresh.parameters(), betas=(0.8, 0.9))  # another config
    other_sch = torch.optim.lr_scheduler.LambdaLR(other_opt, lambda s: 1.0)
    before = {k: v.clone() for k, v in fresh.state_dict().items()}
    lrs = [g["lr"] for g in other_opt.param_groups]
    with pytest.raises(CheckpointError):
        load_checkpoint(tmp_path / "s", model=fresh, optimizer=other_opt, scheduler=other_sch)
    assert all(torch.equal(v, before[k]) for k, v in fresh.state_dict().items())
    assert other_opt.state == {} and [g["lr"] for g in other_opt.param_groups] == lrs


def test_non_float32_models_use_exact_bits_json_in_torchlean_format(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2).to(torch.bfloat16)
    folder = save_checkpoint(tmp_path / "s", model=model, step=4, model_format="torchlean")
    assert sorted(p.name for p in folder.iterdir()) == [
        "manifest.json",
        "model.json",
        "training_state.json",
    ]
    assert verify_checkpoint(folder).members["model"].family == "state_bits"
    fresh = torch.nn.Linear(3, 2).to(torch.bfloat16)
    assert load_checkpoint(folder, model=fresh).step == 4
    assert torch.equal(fresh.weight, model.weight)


def test_no_warning_on_a_clean_directory(tmp_path: Path) -> None:
    model, _, _ = build(0)
    manager = CheckpointManager(tmp_path)
    manager.save(0, model=model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert manager.latest() == 0


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_background_save_holds_the_values_at_the_call(tmp_path: Path) -> None:
    """Device tensors are copied on a side stream into pinned memory; kernels the training
    stream runs after the call cannot reach the copy."""
    model, _, _ = build(0)
    model.cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(5, 6, device="cuda")).sum().backward()
    opt.step()
    at_call = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    manager = CheckpointManager(tmp_path)
    handle = manager.save(1, model=model, optimizer=opt, blocking=False)
    with torch.no_grad():  # queued right behind the copies on the training stream
        for p in model.parameters():
            p.mul_(-2.0).add_(1.0)
    handle.wait()
    fresh, _, _ = build(3)
    fresh.cuda()
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=1e-2)
    manager.restore(model=fresh, optimizer=fresh_opt)
    for k, v in fresh.state_dict().items():
        assert v.is_cuda and torch.equal(v.cpu(), at_call[k]), k
    assert all(s["exp_avg"].is_cuda for s in fresh_opt.state.values())
