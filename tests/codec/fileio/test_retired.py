"""A save over a large file frees the old one on a thread of its own, after the commit: the
old file keeps a second name, a locked temporary of the destination, until then; a failed
rename or a killed process leaves nothing that the next save does not remove."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tlckpt.codec.fileio import atomic, retired
from tlckpt.codec.fileio.atomic import (
    atomic_output,
    clean_temporaries,
    is_library_temporary,
    temporary_name,
    temporary_prefix,
)

BIG = retired.RETIRE_MIN_BYTES


def _write(path: Path, size: int, byte: bytes) -> None:
    with atomic_output(path) as f:
        f.write(byte * size)


def _others(folder: Path, keep: str) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name != keep)


def test_the_old_file_is_freed_on_a_thread_after_the_commit(tmp_path, monkeypatch) -> None:
    path = tmp_path / "model.tlsf32"
    _write(path, BIG, b"a")
    old = os.open(path, os.O_RDONLY)
    gate = threading.Event()
    drop = retired.Retired._drop

    def held(self: retired.Retired) -> None:
        gate.wait(30)
        drop(self)

    monkeypatch.setattr(retired.Retired, "_drop", held)
    try:
        _write(path, BIG, b"b")  # returns while the release waits
        with open(path, "rb") as f:
            assert f.read(4) == b"bbbb"
        (second,) = _others(tmp_path, path.name)  # the old file's second name, locked
        assert is_library_temporary(second) and second.startswith(temporary_prefix(path))
        assert os.fstat(old).st_nlink == 1
        assert clean_temporaries(path) == []  # a cleaner passes over the locked name
        gate.set()
        retired.wait_for_releases()
        assert os.fstat(old).st_nlink == 0  # no name left: freed once closed
        assert _others(tmp_path, path.name) == []
    finally:
        gate.set()
        os.close(old)


def test_small_files_absent_files_and_links_are_replaced_as_before(tmp_path) -> None:
    small = tmp_path / "small"
    small.write_bytes(b"x" * (BIG - 1))
    assert retired.retire(str(small), str(tmp_path / temporary_name(".s.tlckpt-"))) is None
    assert retired.retire(str(tmp_path / "absent"), str(tmp_path / "second")) is None
    big = tmp_path / "big"
    big.write_bytes(b"x" * BIG)
    link = tmp_path / "link"
    link.symlink_to(big)
    assert retired.retire(str(link), str(tmp_path / "second")) is None  # the link is replaced
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big", "link", "small"]


def test_an_old_file_someone_locked_is_replaced_as_before(tmp_path) -> None:
    path = tmp_path / "model.tlsf32"
    _write(path, BIG, b"a")
    holder = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(holder, fcntl.LOCK_SH)
        _write(path, BIG, b"b")
        assert _others(tmp_path, path.name) == []
        assert os.fstat(holder).st_nlink == 0
    finally:
        os.close(holder)


def test_a_failed_rename_keeps_the_old_file_under_its_name_alone(tmp_path, monkeypatch) -> None:
    path = tmp_path / "model.tlsf32"
    _write(path, BIG, b"a")

    def refused(src: str, dst: str) -> None:
        raise OSError(5, "injected: the rename failed", dst)

    monkeypatch.setattr(atomic.os, "replace", refused)
    with pytest.raises(OSError, match="injected"):
        _write(path, BIG, b"b")
    monkeypatch.undo()
    retired.wait_for_releases()
    assert _others(tmp_path, path.name) == []
    with open(path, "rb") as f:
        assert f.read(4) == b"aaaa"
    assert os.stat(path).st_nlink == 1


def test_a_second_name_a_killed_process_left_is_removed_by_the_next_save(tmp_path) -> None:
    path = tmp_path / "model.tlsf32"
    _write(path, BIG, b"a")
    code = (
        "import os, sys\n"
        "from tlckpt.codec.fileio.atomic import temporary_name, temporary_prefix\n"
        "from tlckpt.codec.fileio.retired import retire\n"
        "dest = sys.argv[1]\n"
        "second = os.path.join(os.path.dirname(dest), temporary_name(temporary_prefix(dest)))\n"
        "assert retire(dest, second) is not None\n"
        "os._exit(0)  # killed before the rename: the lock dies with the process\n"
    )
    subprocess.run([sys.executable, "-c", code, str(path)], check=True)
    (second,) = _others(tmp_path, path.name)
    assert is_library_temporary(second)
    _write(path, BIG, b"b")
    retired.wait_for_releases()
    assert _others(tmp_path, path.name) == []
    with open(path, "rb") as f:
        assert f.read(4) == b"bbbb"
