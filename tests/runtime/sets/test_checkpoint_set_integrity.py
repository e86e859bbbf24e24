"""Checkpoint sets under damage and failure: a flipped byte, a truncated or missing member, a
missing manifest, an existing step, retention, leftovers of killed saves, a background save
that fails. Each is caught and named, and never becomes the latest set.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from set_support import build, train

from tlckpt import (
    CheckpointError,
    CheckpointManager,
    IntegrityError,
    SkippedCheckpointWarning,
    save_checkpoint,
    verify_checkpoint,
)
from tlckpt.codec.sets.set_commit import clean_leftovers
from tlckpt.codec.sets.set_digests import DigestingWriter
from tlckpt.formats.checkpoint_set import folder_name


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
