"""A set's documents are read with memory bounded by the file, not by the document limit."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest

from tlckpt.codec import CheckpointError
from tlckpt.codec.sets.set_folders import _read_bounded, read_manifest
from tlckpt.formats.checkpoint_set import MAX_MANIFEST_BYTES


def _peak_while(call) -> int:
    tracemalloc.start()
    try:
        call()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_small_document_read_allocates_about_its_size(tmp_path: Path) -> None:
    path = tmp_path / "manifest.json"
    path.write_bytes(b"x" * 1000)
    assert _read_bounded(str(path), MAX_MANIFEST_BYTES, "manifest") == b"x" * 1000
    peak = _peak_while(lambda: _read_bounded(str(path), MAX_MANIFEST_BYTES, "manifest"))
    # The limit is 256 MiB; a read asking for limit + 1 bytes allocated all of it.
    assert peak < 64 * 1024, peak


def test_hostile_small_manifest_is_refused_without_a_limit_sized_buffer(tmp_path: Path) -> None:
    folder = tmp_path / "step-00000001"
    folder.mkdir()
    (folder / "manifest.json").write_bytes(b'{"format": "not a manifest"}')

    def read() -> None:
        with pytest.raises(CheckpointError):
            read_manifest(folder)

    assert _peak_while(read) < 1024 * 1024


def test_document_at_the_limit_edge(tmp_path: Path) -> None:
    path = tmp_path / "doc.json"
    path.write_bytes(b"y" * 4097)
    data = _read_bounded(str(path), 4096 * 1024, "manifest")
    assert len(data) == 4097
