"""The open handle's stamp: what counts as the file changing under a reader, and what not."""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tlckpt.codec import (
    AdamEntry,
    FileChangedError,
    ParameterSchema,
    read_adam,
    read_float32_state,
    read_state_bits,
    write_adam,
    write_float32_state,
    write_state_bits,
)
from tlckpt.codec.fileio.source import open_source
from tlckpt.codec.model_state import float32_state as float32_module
from tlckpt.codec.model_state import state_bits as state_bits_module
from tlckpt.codec.spec import framed as framed_module
from tlckpt.testing.adam import adamw_config


def _write(path: Path, value: float) -> None:
    write_float32_state(path, [np.full(1000, value, np.float32)])


def _in_place(path: Path, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.write(data)


def _changes(path: Path) -> dict[str, Callable[[], None]]:
    other = path.with_suffix(".other")
    _write(other, 2.0)
    new = other.read_bytes()
    size = path.stat().st_size

    def rewrite_then_restore_mtime() -> None:
        st = path.stat()
        _in_place(path, new)
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))

    return {
        "same-size rewrite": lambda: _in_place(path, new),
        "same bytes written again": lambda: _in_place(path, path.read_bytes()[:1]),
        "truncated": lambda: os.truncate(path, size - 4),
        "extended": lambda: open(path, "ab").write(b"\0"),
        "rewritten, mtime set back": rewrite_then_restore_mtime,
    }


@pytest.mark.parametrize(
    "change",
    [
        "same-size rewrite",
        "same bytes written again",
        "truncated",
        "extended",
        "rewritten, mtime set back",
    ],
)
def test_changes_of_the_contents_are_seen(tmp_path: Path, change: str) -> None:
    path = tmp_path / "f.tlsf32"
    _write(path, 1.0)
    changes = _changes(path)
    with (
        open(path, "rb") as f,
        pytest.raises(FileChangedError, match="changed while it was being read"),
        open_source(f),
    ):
        changes[change]()


@pytest.mark.parametrize("change", ["renamed over", "unlinked", "hard-linked"])
def test_link_changes_leave_the_open_file_as_it_was(tmp_path: Path, change: str) -> None:
    path = tmp_path / "f.tlsf32"
    _write(path, 1.0)
    other = tmp_path / "g.tlsf32"
    _write(other, 2.0)
    with open(path, "rb") as f, open_source(f) as src:
        before = os.fstat(f.fileno()).st_ctime_ns
        if change == "renamed over":  # how every tlckpt writer replaces a file
            os.replace(other, path)
        elif change == "unlinked":
            path.unlink()
        else:
            os.link(path, tmp_path / "h.tlsf32")
        assert os.fstat(f.fileno()).st_ctime_ns != before  # the kernel did move it
        arrays = read_float32_state(src.file, [(1000,)])
    assert np.all(arrays[0] == 1.0)


def test_a_stamp_from_an_earlier_pass_is_checked_on_entry(tmp_path: Path) -> None:
    path = tmp_path / "f.tlsf32"
    _write(path, 1.0)
    with open(path, "rb") as f:
        with open_source(f) as first:
            stamp = first.stamp
        _in_place(path, b"\0")
        with (
            pytest.raises(FileChangedError, match="before reading on"),
            open_source(f, since=stamp),
        ):
            pytest.fail("the block must not run")


def test_file_objects_without_a_descriptor_compare_sizes() -> None:
    buffer = io.BytesIO(b"x" * 10)
    with open_source(buffer) as src:
        assert (src.stamp.size, src.stamp.mtime_ns) == (10, None)
    with pytest.raises(FileChangedError), open_source(buffer):
        buffer.write(b"more than ten bytes")


def _versions(tmp_path: Path, reader: str) -> tuple[Path, bytes, Callable[[Path], object]]:
    """A file, the bytes of a same-size other version, and a read of it."""
    path, other = tmp_path / "a", tmp_path / "b"
    if reader == "float32":
        _write(path, 1.0)
        _write(other, 2.0)
        return path, other.read_bytes(), lambda p: read_float32_state(p, [(1000,)])
    if reader == "json":
        write_state_bits(path, [np.full(4, 1.5, np.float32)], "float32")
        write_state_bits(other, [np.full(4, 2.5, np.float32)], "float32")
        return path, other.read_bytes(), lambda p: read_state_bits(p, [(4,)], "float32")
    schema = ParameterSchema([(1000,)], [True], [0])
    config = adamw_config()
    for p, value in ((path, 1.0), (other, 2.0)):
        m = np.full(1000, value, np.float32)
        write_adam(p, schema, config, {0: AdamEntry(3, m, m)})
    return path, other.read_bytes(), lambda p: read_adam(p, schema)


@pytest.mark.parametrize("reader", ["float32", "adam", "json"])
def test_every_codec_reader_notices_a_change_mid_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reader: str
) -> None:
    """The change lands after the payloads were read, before the reader returns (the JSON
    reader reads its document in one call and parses it after): noticed at the end."""
    path, other, read = _versions(tmp_path, reader)
    assert len(other) == path.stat().st_size
    # The optimizer readers walk their files through framed.read_framed.
    module = {"float32": float32_module, "adam": framed_module, "json": state_bits_module}[reader]
    name = "read_document" if reader == "json" else "check_trailing"
    real = getattr(module, name)

    def change_then(*args: Any, **kwargs: Any) -> Any:
        if reader == "json":  # the whole document read, not yet parsed
            document = real(*args, **kwargs)
            _in_place(path, other)
            return document
        _in_place(path, other)
        return real(*args, **kwargs)

    read(path)  # unchanged: reads
    monkeypatch.setattr(module, name, change_then)
    with pytest.raises(FileChangedError):
        read(path)
