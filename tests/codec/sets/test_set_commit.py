"""The atomic exchange under set overwrites: what it swaps, and the fallback where the
kernel or file system has none (``EINVAL``, ``ENOSYS``), taken without losing the set."""

from __future__ import annotations

import ctypes
import errno
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from tlckpt.codec.fileio import atomic
from tlckpt.codec.model_state.float32_state_writer import write_float32_state
from tlckpt.codec.sets import set_commit
from tlckpt.codec.sets.checkpoint_set import verify_checkpoint
from tlckpt.codec.sets.set_commit import SetWriter
from tlckpt.codec.sets.set_document_writing import build_training_state
from tlckpt.codec.sets.set_documents import parse_training_state
from tlckpt.formats.checkpoint_set import folder_name


def _write(path: Path, tag: int, *, overwrite: bool) -> None:
    with SetWriter(path, 1, overwrite=overwrite) as writer:
        with writer.member("model", "model.tlsf32", 1) as f:
            write_float32_state(f, [np.full(2, tag, np.float32)])
        with writer.member("training_state", "training_state.json", 1, "training_state") as f:
            f.write(build_training_state(1, None, None, None, None, {"tag": tag}))
        writer.commit([("w", (2,))])


def _tag(path: Path) -> int:
    verify_checkpoint(path)
    return parse_training_state((path / "training_state.json").read_bytes(), 1 << 20).extra["tag"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="renameat2 is Linux's")
def test_exchange_swaps_a_folder_and_a_link(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x").write_bytes(b"x")
    (tmp_path / "b").symlink_to(tmp_path / "elsewhere")
    assert atomic.exchange(tmp_path / "a", tmp_path / "b")
    assert (tmp_path / "a").is_symlink() and os.listdir(tmp_path / "b") == ["x"]
    with pytest.raises(FileNotFoundError) as caught:
        atomic.exchange(tmp_path / "a", tmp_path / "c")
    assert caught.value.filename2 == str(tmp_path / "c")


@pytest.mark.parametrize("code", [errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP])
def test_no_exchange_falls_back_and_keeps_the_set(
    code: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = []

    def refused(*args: object) -> int:
        calls.append(args)
        ctypes.set_errno(code)
        return -1

    monkeypatch.setattr(atomic, "_exchange_call", lambda: ("renameat2", refused))
    assert not atomic.exchange(tmp_path / "a", tmp_path / "b")
    path = tmp_path / folder_name(1)
    _write(path, 1, overwrite=False)
    _write(path, 2, overwrite=True)
    assert len(calls) == 2  # asked, refused, and the retired-set sequence took over
    assert _tag(path) == 2 and os.listdir(tmp_path) == [path.name]


def test_an_overwrite_failing_midway_puts_the_old_set_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / folder_name(1)
    _write(path, 1, overwrite=False)
    monkeypatch.setattr(set_commit, "exchange", lambda first, second: False)
    real_rename = os.rename

    def failing(src: str, dst: str) -> None:
        if os.path.basename(src).endswith(".tmp") and dst == str(path):
            raise OSError(errno.EIO, "injected", dst)
        real_rename(src, dst)

    monkeypatch.setattr(os, "rename", failing)
    with pytest.raises(OSError, match="injected"):
        _write(path, 2, overwrite=True)
    monkeypatch.undo()
    assert _tag(path) == 1 and os.listdir(tmp_path) == [path.name]
