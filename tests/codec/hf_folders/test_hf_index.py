"""Reading a Hugging Face folder's index: bounds, JSON, and every path confined to the
folder (numpy only)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from tlckpt.codec import FileTooLargeError, IntegrityError, MalformedError
from tlckpt.codec.hf_folders import hf_index
from tlckpt.codec.hf_folders.hf_index import read_hf_folder
from tlckpt.codec.safetensors import write_safetensors

INDEX = "model.safetensors.index.json"


@pytest.fixture
def folder(tmp_path):
    out = tmp_path / "hf"
    out.mkdir()
    write_safetensors(out / "a.safetensors", {"x": np.zeros(2, "<f4")})
    write_safetensors(out / "b.safetensors", {"y": np.ones(3, "<f4")})
    return out


def index(folder, weight_map, raw=None):
    text = (
        raw
        if raw is not None
        else json.dumps({"metadata": {"total_size": 20}, "weight_map": weight_map})
    )
    (folder / INDEX).write_bytes(text if isinstance(text, bytes) else text.encode())


def test_a_good_index(folder):
    index(folder, {"x": "a.safetensors", "y": "b.safetensors"})
    layout = read_hf_folder(folder)
    assert list(layout.files) == ["a.safetensors", "b.safetensors"]
    assert layout.weight_map == {"x": "a.safetensors", "y": "b.safetensors"}


def test_one_file(folder):
    os.rename(folder / "a.safetensors", folder / "model.safetensors")
    assert read_hf_folder(folder).weight_map is None


def test_neither(tmp_path):
    with pytest.raises(IntegrityError, match="neither"):
        read_hf_folder(tmp_path)


@pytest.mark.parametrize(
    "name",
    ["../b.safetensors", "/etc/passwd", "sub/../../x", "..", "", "a\\b", "C:x", "a\x00b"],
)
def test_paths_outside_are_refused(folder, name):
    index(folder, {"x": name})
    with pytest.raises(MalformedError):
        read_hf_folder(folder)


def test_a_symlink_out_is_refused(folder, tmp_path):
    (tmp_path / "secret").write_bytes(b"x")
    os.symlink(tmp_path / "secret", folder / "c.safetensors")
    index(folder, {"x": "c.safetensors"})
    with pytest.raises(MalformedError, match="a link to"):
        read_hf_folder(folder)


def test_a_symlink_inside_is_read(folder):
    os.symlink("a.safetensors", folder / "c.safetensors")
    index(folder, {"x": "c.safetensors"})
    assert list(read_hf_folder(folder).files) == ["c.safetensors"]


def test_a_missing_or_odd_shard(folder):
    index(folder, {"x": "gone.safetensors"})
    with pytest.raises(IntegrityError, match="missing"):
        read_hf_folder(folder)
    (folder / "dir.safetensors").mkdir()
    index(folder, {"x": "dir.safetensors"})
    with pytest.raises(IntegrityError, match="not a file"):
        read_hf_folder(folder)


@pytest.mark.parametrize(
    "raw",
    [
        b"\xff\xfe",
        b"[]",
        b'{"weight_map": []}',
        b'{"metadata": {}}',
        b'{"weight_map": {"x": ["a.safetensors"]}}',
        b'{"weight_map": {"x": 3}}',
        b'{"weight_map": {}}',
        b'{"weight_map": {"x": "a.safetensors", "x": "b.safetensors"}}',
        b'{"weight_map": {"x": "a.safetensors"}, "weight_map": {"x": "b.safetensors"}}',
        b"[" * 100000 + b"]" * 100000,
        b'{"weight_map": {"x": "a.safetensors"',
    ],
)
def test_malformed_indexes(folder, raw):
    index(folder, None, raw)
    with pytest.raises(MalformedError):
        read_hf_folder(folder)


def test_a_name_twice_with_the_same_file_is_fine(folder):
    index(folder, None, b'{"weight_map": {"x": "a.safetensors", "x": "a.safetensors"}}')
    assert read_hf_folder(folder).weight_map == {"x": "a.safetensors"}


def test_an_index_too_large(folder, monkeypatch):
    index(folder, {"x": "a.safetensors"})
    monkeypatch.setattr(hf_index, "MAX_INDEX_BYTES", 10)
    with pytest.raises(FileTooLargeError):
        read_hf_folder(folder)


def test_an_index_linked_from_outside_is_refused(folder, tmp_path):
    (tmp_path / "elsewhere.json").write_text(json.dumps({"weight_map": {"x": "a.safetensors"}}))
    os.symlink(tmp_path / "elsewhere.json", folder / INDEX)
    with pytest.raises(MalformedError, match="a link to"):
        read_hf_folder(folder)
