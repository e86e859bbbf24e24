"""Checkpoint sets: a whole training state saved, verified, retained and resumed as one.

The run under test: AdamW with two param groups (their own learning rates), a warmup
scheduler, dropout drawing from torch's global generator, numpy and ``random`` draws, and a
random counter. Resumed from a set (saved blocking or in the background), it must continue
bit for bit like the run that was never interrupted.
"""

from __future__ import annotations

import errno
import math
import os
import random
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import tlckpt
from tlckpt import (
    CheckpointError,
    CheckpointManager,
    IntegrityError,
    SchemaMismatchError,
    SkippedCheckpointWarning,
    load_checkpoint,
    save_checkpoint,
    verify_checkpoint,
)
from tlckpt.codec.checkpoint_set import DigestingWriter, clean_leftovers
from tlckpt.formats.checkpoint_set import folder_name


class Net(torch.nn.Module):
    def __init__(self, order: str = "ab") -> None:
        super().__init__()
        layers = {"a": torch.nn.Linear(6, 6), "b": torch.nn.Linear(6, 6)}
        for name in order:  # the registration order decides the state's names' order
            setattr(self, name, layers[name])
        self.drop = torch.nn.Dropout(0.25)
        self.head = torch.nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.drop(torch.tanh(self.b(torch.tanh(self.a(x))))))


def build(seed: int, order: str = "ab", decay_split: bool = False):
    """Two groups differing in lr (a TorchLean file), or with ``decay_split`` also in weight
    decay, as Hugging Face's Trainer splits them (tlckpt's own optimizer family)."""
    torch.manual_seed(seed)
    model = Net(order)
    groups = [
        {"params": list(model.a.parameters()) + list(model.head.parameters()), "lr": 1e-2},
        {"params": list(model.b.parameters()), "lr": 3e-3},
    ]
    if decay_split:
        groups[1]["weight_decay"] = 0.0
    optimizer = torch.optim.AdamW(groups, weight_decay=0.01)
    warmup = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 4))
    return model, optimizer, warmup


def train(model, optimizer, scheduler, counter: int, steps: int) -> tuple[int, list]:
    """``steps`` steps; the data come from the counter, dropout from the global generator,
    a noise scale from numpy's and ``random``'s global states."""
    losses = []
    for _ in range(steps):
        g = torch.Generator().manual_seed(counter)
        x = torch.randn(5, 6, generator=g)
        scale = float(np.random.rand()) + random.random()
        counter += 1
        loss = (model(x) * scale).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        losses.append(loss.detach().clone())
    return counter, losses


def seed_all(seed: int) -> None:
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)


def assert_same(model_a, opt_a, sch_a, model_b, opt_b, sch_b) -> None:
    for (na, a), (nb, b) in zip(model_a.state_dict().items(), model_b.state_dict().items()):
        assert na == nb and torch.equal(a, b), na
    for ga, gb in zip(opt_a.param_groups, opt_b.param_groups):
        assert {k: v for k, v in ga.items() if k != "params"} == {
            k: v for k, v in gb.items() if k != "params"
        }
        for p, q in zip(ga["params"], gb["params"]):
            sa, sb = opt_a.state[p], opt_b.state[q]
            assert sorted(sa) == sorted(sb)
            for key in sa:
                assert torch.equal(sa[key], sb[key]), key
    assert sch_a.state_dict() == sch_b.state_dict()


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


def _members(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.name != "manifest.json")


def test_any_flipped_byte_is_caught_and_latest_falls_back(tmp_path: Path) -> None:
    model, opt, sch = build(0)
    train(model, opt, sch, 0, 1)
    manager = CheckpointManager(tmp_path)
    manager.save(1, model=model, optimizer=opt, scheduler=sch)
    train(model, opt, sch, 1, 1)
    manager.save(2, model=model, optimizer=opt, scheduler=sch)
    newest = tmp_path / folder_name(2)
    rng = np.random.default_rng(0)
    for member in _members(newest):
        data = member.read_bytes()
        # Every byte of a small member, a spread of positions in a larger one.
        positions = range(len(data)) if len(data) < 600 else rng.choice(len(data), 300, False)
        for pos in positions:
            damaged = bytearray(data)
            damaged[pos] ^= 1 << int(rng.integers(8))
            member.write_bytes(damaged)
            with pytest.raises(IntegrityError) as caught:
                verify_checkpoint(newest)
            assert caught.value.check == "digest" and member.name in str(caught.value)
        member.write_bytes(data)
    manifest = newest / "manifest.json"
    data = manifest.read_bytes()
    for pos in range(len(data)):  # the manifest checks itself: every byte of it
        manifest.write_bytes(data[:pos] + bytes([data[pos] ^ 0x01]) + data[pos + 1 :])
        with pytest.raises(CheckpointError):
            verify_checkpoint(newest)
    with pytest.warns(SkippedCheckpointWarning, match="step 2"):
        assert manager.latest() == 1
    manifest.write_bytes(data)
    verify_checkpoint(newest)

    target = _members(newest)[0]
    data = target.read_bytes()
    target.write_bytes(data[:10] + bytes([data[10] ^ 0x80]) + data[11:])
    fresh, fresh_opt, fresh_sch = build(8)
    before = {k: v.clone() for k, v in fresh.state_dict().items()}
    with pytest.raises(IntegrityError, match=target.name):
        manager.restore(model=fresh, optimizer=fresh_opt, scheduler=fresh_sch, step=2)
    assert all(torch.equal(v, before[k]) for k, v in fresh.state_dict().items())
    with pytest.warns(SkippedCheckpointWarning, match=f"step 2 .*{target.name}.*digest"):
        assert manager.latest() == 1
    with pytest.warns(SkippedCheckpointWarning, match="step 2"):
        restored = manager.restore(model=fresh, optimizer=fresh_opt, scheduler=fresh_sch)
    assert restored.step == 1


def test_large_members_are_verified_while_they_load(tmp_path: Path) -> None:
    """Members above the inline size are hashed as the staged loads read them: a flip in a
    header (the plan fails first), a payload or the last byte is still reported as the
    member's digest, nothing live changes, and the latest restore falls back."""
    torch.manual_seed(0)
    big = torch.nn.Linear(1200, 1200)  # 5.8 MB of float32 state: streamed
    opt = torch.optim.AdamW(big.parameters(), lr=1e-3)
    big(torch.randn(2, 1200)).sum().backward()
    opt.step()
    manager = CheckpointManager(tmp_path)
    manager.save(1, model=big, optimizer=opt)
    first_bias = big.bias.detach().clone()
    with torch.no_grad():
        big.bias.add_(1.0)
    manager.save(2, model=big, optimizer=opt)
    fresh = torch.nn.Linear(1200, 1200)
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=1e-3)
    assert manager.restore(model=fresh, optimizer=fresh_opt).step == 2
    assert torch.equal(fresh.weight, big.weight) and torch.equal(fresh.bias, big.bias)

    newest = tmp_path / folder_name(2)
    for name in ("model.tlsf32", "optimizer.tladam"):
        member = newest / name
        data = member.read_bytes()
        for pos in (12, len(data) // 2, len(data) - 1):
            member.write_bytes(data[:pos] + bytes([data[pos] ^ 0x10]) + data[pos + 1 :])
            torch.nn.init.zeros_(fresh.bias)
            with pytest.raises(IntegrityError, match=name) as caught:
                manager.restore(model=fresh, optimizer=fresh_opt, step=2)
            assert caught.value.check == "digest"
            assert not fresh.bias.any()  # nothing live changed
            with pytest.warns(SkippedCheckpointWarning, match=f"step 2 .*{name}.*digest"):
                assert manager.restore(model=fresh, optimizer=fresh_opt).step == 1
            assert torch.equal(fresh.bias, first_bias)
        member.write_bytes(data)


def test_missing_member_truncation_and_no_manifest(tmp_path: Path) -> None:
    model, opt, sch = build(0)
    train(model, opt, sch, 0, 1)
    folder = save_checkpoint(tmp_path / "s", model=model, optimizer=opt, step=1)
    (folder / "optimizer.tladam").rename(tmp_path / "away")
    with pytest.raises(IntegrityError, match="missing") as caught:
        verify_checkpoint(folder)
    assert caught.value.check == "present"
    (tmp_path / "away").rename(folder / "optimizer.tladam")
    data = (folder / "model.tlsf32").read_bytes()
    (folder / "model.tlsf32").write_bytes(data[:-1])
    with pytest.raises(IntegrityError) as caught:
        verify_checkpoint(folder)
    assert caught.value.check == "size"
    (folder / "manifest.json").unlink()
    with pytest.raises(IntegrityError, match="never committed"):
        verify_checkpoint(folder)


def test_existing_step_needs_overwrite_and_retention(tmp_path: Path) -> None:
    model, opt, sch = build(0)
    train(model, opt, sch, 0, 1)
    manager = CheckpointManager(tmp_path, keep_last=2, keep_every=4)
    for step in range(1, 10):
        manager.save(step, model=model, optimizer=opt, scheduler=sch)
    assert manager.steps() == [4, 8, 9]
    with pytest.raises(FileExistsError):
        manager.save(9, model=model)
    with torch.no_grad():
        model.head.bias.fill_(0.5)
    manager.save(9, model=model, optimizer=opt, scheduler=sch, overwrite=True)
    fresh, fresh_opt, fresh_sch = build(1)
    manager.restore(model=fresh, optimizer=fresh_opt, scheduler=fresh_sch, step=9)
    assert torch.equal(fresh.head.bias, torch.full((3,), 0.5))
    assert sorted(os.listdir(tmp_path)) == [folder_name(s) for s in (4, 8, 9)]


def test_leftovers_of_killed_saves_are_removed(tmp_path: Path) -> None:
    stale = tmp_path / f".{folder_name(5)}.tlckpt-abcdefgh.tmp"
    stale.mkdir()
    (stale / "model.tlsf32").write_bytes(b"partial")
    keep = tmp_path / ".not-ours"
    keep.mkdir()
    manager = CheckpointManager(tmp_path)
    assert not stale.exists() and keep.exists()
    assert manager.steps() == [] and manager.latest() is None
    assert clean_leftovers(tmp_path) == []


@pytest.mark.parametrize("code", [errno.EIO, errno.ENOSPC])
def test_background_failure_surfaces_and_never_becomes_latest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    model, opt, sch = build(0)
    train(model, opt, sch, 0, 1)
    manager = CheckpointManager(tmp_path)
    manager.save(1, model=model, optimizer=opt, scheduler=sch)
    real_write = DigestingWriter.write
    written = {"bytes": 0}

    def failing(self, data):  # the device fills up (or fails) partway through a member
        written["bytes"] += memoryview(data).nbytes
        if written["bytes"] > 2000:
            raise OSError(code, os.strerror(code))
        return real_write(self, data)

    monkeypatch.setattr(DigestingWriter, "write", failing)
    handle = manager.save(2, model=model, optimizer=opt, scheduler=sch, blocking=False)
    with pytest.raises(OSError) as caught:
        handle.wait()
    assert caught.value.errno == code and handle.done()
    assert manager.latest() == 1 and manager.steps() == [1]
    assert os.listdir(tmp_path) == [folder_name(1)]  # its temporary folder is gone too
    # Reported by the handle already: the manager does not raise it a second time.
    manager.wait()
    written["bytes"] = 0
    manager.save(3, model=model, optimizer=opt, scheduler=sch, blocking=False)
    with pytest.raises(OSError):  # unreported: raised by the next save
        manager.save(4, model=model, optimizer=opt, scheduler=sch, blocking=False)
    monkeypatch.setattr(DigestingWriter, "write", real_write)
    manager.save(4, model=model, optimizer=opt, scheduler=sch, blocking=False)
    manager.wait()
    assert manager.steps() == [1, 4]

    def failing_fsync(fd: int) -> None:  # the device fails at the commit's fsyncs
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "fsync", failing_fsync)
    manager.save(5, model=model, optimizer=opt, scheduler=sch, blocking=False)
    with pytest.raises(OSError) as caught:  # unreported: raised by the manager's wait
        manager.wait()
    assert caught.value.errno == code
    monkeypatch.undo()
    assert manager.steps() == [1, 4] and manager.latest() == 4
    assert sorted(os.listdir(tmp_path)) == [folder_name(1), folder_name(4)]


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


def test_non_float32_models_use_exact_bits_json(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2).to(torch.bfloat16)
    folder = save_checkpoint(tmp_path / "s", model=model, step=4)
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
