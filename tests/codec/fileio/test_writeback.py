"""Early writeback (``codec/fileio/writeback.py``): when it asks the kernel to start writing,
for which files, and that a file it cannot serve (a pipe) or a missing call changes nothing
but the timing. The bytes written are the same either way (checked here against the file
read back; the codec tests check them against ``safetensors``)."""

from __future__ import annotations

import errno
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from tlckpt.codec.fileio import writeback
from tlckpt.codec.fileio.writeback import WINDOW_BYTES, Writeback
from tlckpt.codec.safetensors import write_safetensors
from tlckpt.codec.sets.set_commit import SetWriter

linux_only = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="sync_file_range is Linux's"
)


class _Calls:
    """Records each request (``fd``, offset, length, flags) and makes the real call."""

    def __init__(self, real):
        self.real = real
        self.calls: list[tuple[int, int, int, int]] = []

    def __call__(self, fd: int, offset: int, length: int, flags: int) -> int:
        self.calls.append((fd, offset, length, flags))
        return 0 if self.real is None else self.real(fd, offset, length, flags)


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> _Calls:
    recorder = _Calls(writeback._SYNC_FILE_RANGE)
    monkeypatch.setattr(writeback, "_SYNC_FILE_RANGE", recorder)
    return recorder


def test_one_request_per_window_of_bytes(tmp_path: Path, calls: _Calls) -> None:
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        wb = Writeback(fd)
        chunk = b"\x5a" * (WINDOW_BYTES // 4)
        for _ in range(9):  # 2.25 windows
            wb.wrote(os.write(fd, chunk))
        assert calls.calls == [(fd, 0, 0, 2), (fd, 0, 0, 2)]  # the whole file, WRITE only
        assert wb.fd == fd
    finally:
        os.close(fd)
    assert (tmp_path / "f").read_bytes() == b"\x5a" * (9 * WINDOW_BYTES // 4)


@linux_only
def test_the_kernel_takes_the_request_for_a_file(tmp_path: Path) -> None:
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        wb = Writeback(fd)
        wb.wrote(os.write(fd, bytes(WINDOW_BYTES)))
        assert wb.fd == fd  # the call succeeded: asked again at the next window
    finally:
        os.close(fd)


@linux_only
def test_a_pipe_is_asked_once_then_left_alone() -> None:
    r, w = os.pipe()
    try:
        wb = Writeback(w)
        wb.wrote(WINDOW_BYTES)  # ESPIPE: not for this file, no error
        assert wb.fd is None
    finally:
        os.close(r)
        os.close(w)


@linux_only
def test_a_descriptor_that_is_not_open_is_a_bug_and_raised(tmp_path: Path) -> None:
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT, 0o600)
    os.close(fd)
    with pytest.raises(OSError) as caught:
        Writeback(fd).wrote(WINDOW_BYTES)
    assert caught.value.errno == errno.EBADF


def test_no_call_no_requests(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(writeback, "_SYNC_FILE_RANGE", None)  # a platform without it
    arrays = {"w": np.arange(WINDOW_BYTES, dtype=np.uint8)}
    write_safetensors(tmp_path / "x.safetensors", arrays)
    with_call = tmp_path / "y.safetensors"
    monkeypatch.undo()
    write_safetensors(with_call, arrays)
    assert (tmp_path / "x.safetensors").read_bytes() == with_call.read_bytes()


def test_durable_path_saves_ask_and_others_do_not(tmp_path: Path, calls: _Calls) -> None:
    arrays = {f"t{i}": np.full(WINDOW_BYTES // 2, i, np.uint8) for i in range(4)}
    write_safetensors(tmp_path / "a.safetensors", arrays)
    assert len(calls.calls) == 2  # 2 windows of payload (the header is under a window)
    calls.calls.clear()
    write_safetensors(tmp_path / "b.safetensors", arrays, durable=False)
    with open(tmp_path / "c.safetensors", "wb") as f:  # a caller's file: written as it is
        write_safetensors(f, arrays)
    assert calls.calls == []
    data = (tmp_path / "a.safetensors").read_bytes()
    assert data == (tmp_path / "b.safetensors").read_bytes()
    assert data == (tmp_path / "c.safetensors").read_bytes()


@pytest.mark.parametrize("durable", [True, False])
def test_set_members_ask_when_durable(tmp_path: Path, calls: _Calls, durable: bool) -> None:
    arrays = {f"t{i}": np.full(WINDOW_BYTES // 2, i, np.uint8) for i in range(4)}
    with SetWriter(tmp_path / "set", 1, durable=durable) as writer:
        with writer.member("model", "model.safetensors", 1, "safetensors") as f:
            write_safetensors(f, arrays)
        assert len(calls.calls) == (2 if durable else 0)
        member = (Path(writer.path) / "model.safetensors").read_bytes()
        assert writer.records()["model"].size == len(member)
    write_safetensors(tmp_path / "alone.safetensors", arrays, durable=False)
    assert member == (tmp_path / "alone.safetensors").read_bytes()
