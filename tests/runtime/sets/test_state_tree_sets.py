"""Sets of one state tree (manifest version 3): a framework's whole checkpoint as a verified
set at any folder name — round trips, refusals before anything is written, a save killed
midway, signed sets, hostile manifests, siblings, removal, and the command line."""

from __future__ import annotations

import copy
import math
import os
from collections import OrderedDict
from pathlib import Path
from typing import Any

import orjson
import pytest
import torch

import tlckpt
from tlckpt.cli.main import main as cli_main
from tlckpt.codec.errors import CheckpointError, IntegrityError, KeyRequiredError
from tlckpt.codec.sets.checkpoint_set import verify_checkpoint
from tlckpt.codec.sets.set_commit import remove_set_folder
from tlckpt.codec.sets.set_documents import parse_manifest, self_digest
from tlckpt.formats.checkpoint_set import MAX_MANIFEST_BYTES
from tlckpt.runtime.sets import state_tree_sets
from tlckpt.runtime.sets.state_tree_sets import (
    install_rng_states,
    load_state_tree_set,
    save_state_tree_set,
    state_tree_siblings,
)
from tlckpt.runtime.sets.training_state import current_rng_states


def _tree() -> dict[str, Any]:
    weight = torch.randn(3, 4)
    return {
        "state_dict": OrderedDict(w=weight, b=torch.tensor([-0.0, math.nan]).bfloat16()),
        "tied": weight,  # the same tensor twice: stored once, one object again
        "optimizer_states": [{"state": {0: {"step": torch.tensor(5.0)}}, "betas": (0.9, 0.99)}],
        "epoch": 1,
        "big": 2**70,
        "inf": -math.inf,
    }


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.dtype == b.dtype and a.shape == b.shape and a.view(torch.uint8).equal(b.view(torch.uint8))
    )


def test_a_tree_round_trips_exactly_and_verifies(tmp_path: Path) -> None:
    tree = _tree()
    folder = save_state_tree_set(tree, tmp_path / "a.ckpt", step=7, rng=current_rng_states())
    manifest = verify_checkpoint(folder)
    assert (manifest.version, manifest.step) == (3, 7)
    assert [n for n, _ in manifest.state] == [
        "state_dict.w",
        "state_dict.b",
        "optimizer_states[0].state[0].step",
    ]
    loaded, state = load_state_tree_set(folder)
    assert list(loaded) == list(tree) and type(loaded["state_dict"]) is OrderedDict
    assert _bits_equal(loaded["state_dict"]["b"], tree["state_dict"]["b"])
    assert loaded["tied"] is loaded["state_dict"]["w"]
    assert loaded["optimizer_states"][0]["betas"] == (0.9, 0.99)
    assert loaded["big"] == 2**70 and loaded["inf"] == -math.inf
    assert state.step == 7 and state.rng is not None


def test_random_states_are_installed_exactly(tmp_path: Path) -> None:
    torch.manual_seed(3)
    folder = save_state_tree_set({}, tmp_path / "r", step=0, rng=current_rng_states())
    expected = torch.rand(4)
    torch.manual_seed(99)
    _, state = load_state_tree_set(folder)
    assert install_rng_states(state)
    assert torch.equal(torch.rand(4), expected)
    _, none = load_state_tree_set(save_state_tree_set({}, tmp_path / "n", step=0, rng=None))
    assert not install_rng_states(none)


def test_a_value_json_cannot_hold_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"hyper_parameters\.data_dir.*PosixPath") as caught:
        save_state_tree_set(
            {"hyper_parameters": {"data_dir": tmp_path}}, tmp_path / "x", step=1, rng=None
        )
    assert caught.value.field == "hyper_parameters.data_dir"
    assert os.listdir(tmp_path) == []


def test_a_save_killed_midway_leaves_the_previous_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "a.ckpt"
    save_state_tree_set({"w": torch.zeros(64)}, path, step=1, rng=None)
    real = state_tree_sets.write_safetensors

    def killed(f: Any, items: Any, **kwargs: Any) -> None:
        f.write(b"\0" * 100)  # part of the new member is on disk
        raise KeyboardInterrupt

    monkeypatch.setattr(state_tree_sets, "write_safetensors", killed)
    with pytest.raises(KeyboardInterrupt):
        save_state_tree_set({"w": torch.ones(64)}, path, step=2, rng=None)
    monkeypatch.setattr(state_tree_sets, "write_safetensors", real)
    assert verify_checkpoint(path).step == 1
    assert torch.equal(load_state_tree_set(path)[0]["w"], torch.zeros(64))
    assert os.listdir(tmp_path) == ["a.ckpt"]  # the temporary folder is gone


def test_a_signed_set_loads_with_its_key_only(tmp_path: Path) -> None:
    key = bytes(range(32))
    folder = save_state_tree_set({"w": torch.ones(2)}, tmp_path / "s", step=3, rng=None, key=key)
    assert verify_checkpoint(folder, key=key).key_id is not None
    assert torch.equal(load_state_tree_set(folder, key=key)[0]["w"], torch.ones(2))
    with pytest.raises(KeyRequiredError):
        load_state_tree_set(folder)


def test_a_damaged_member_is_refused_before_the_tree_is_returned(tmp_path: Path) -> None:
    folder = save_state_tree_set({"w": torch.ones(2)}, tmp_path / "d", step=3, rng=None)
    member = folder / "state.safetensors"
    data = bytearray(member.read_bytes())
    data[-1] ^= 1
    member.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match="digest"):
        load_state_tree_set(folder)


def test_edited_manifests_are_refused(tmp_path: Path) -> None:
    folder = save_state_tree_set({"w": torch.ones(2)}, tmp_path / "m", step=3, rng=None)
    base = orjson.loads((folder / "manifest.json").read_bytes())
    del base["self_digest"]
    edits = {
        "file outside": ("members", "state", "file", "../state.safetensors"),
        "family": ("members", "state", "family", "adam"),
        "tied": ("members", "state", "tied", {"w": "w"}),
        "tensors": ("members", "state", "tensors", [["w", [2]], ["w", [2]]]),
        "version of the layout": ("members", "state", "version", 1),
    }
    for what, (*where, key, value) in edits.items():
        edited = copy.deepcopy(base)
        target = edited
        for step in where:
            target = target[step]
        target[key] = value
        edited["self_digest"] = self_digest(edited)
        with pytest.raises(CheckpointError):
            parse_manifest(orjson.dumps(edited), MAX_MANIFEST_BYTES)
            pytest.fail(what)
    extra = copy.deepcopy(base)
    extra["members"]["model"] = extra["members"]["training_state"]
    extra["self_digest"] = self_digest(extra)
    with pytest.raises(CheckpointError, match="members"):
        parse_manifest(orjson.dumps(extra), MAX_MANIFEST_BYTES)
    with_state = dict(base, state=[])
    with_state["self_digest"] = self_digest(with_state)
    with pytest.raises(CheckpointError):
        parse_manifest(orjson.dumps(with_state), MAX_MANIFEST_BYTES)


def test_siblings_are_committed_state_tree_sets_newest_first(tmp_path: Path) -> None:
    for name, step in (("a.ckpt", 5), ("b.ckpt", 10), ("c.ckpt", 10), (".hidden.ckpt", 99)):
        save_state_tree_set({}, tmp_path / name, step=step, rng=None)
    os.utime(tmp_path / "b.ckpt", ns=(1, 1))  # older than c at the same step
    os.symlink("c.ckpt", tmp_path / "last.ckpt")
    (tmp_path / "uncommitted.ckpt").mkdir()
    model = torch.nn.Linear(2, 1)
    tlckpt.save_checkpoint(tmp_path / "model-set", model=model)  # a set of a model
    found = [s.path.name for s in state_tree_siblings(tmp_path / "a.ckpt")]
    assert found in (["c.ckpt", "b.ckpt"], ["last.ckpt", "b.ckpt"])  # c once, link or not
    assert [s.path.name for s in state_tree_siblings(tmp_path / "last.ckpt")] == [
        "b.ckpt",
        "a.ckpt",
    ]
    with pytest.raises(CheckpointError, match="state tree"):
        load_state_tree_set(tmp_path / "model-set")
    with pytest.raises(CheckpointError, match="state tree"):
        tlckpt.load_checkpoint(tmp_path / "a.ckpt", model=model)


def test_removal_renames_first_and_leaves_nothing(tmp_path: Path) -> None:
    folder = save_state_tree_set({"w": torch.ones(2)}, tmp_path / "a.ckpt", step=1, rng=None)
    os.symlink("a.ckpt", tmp_path / "link.ckpt")
    remove_set_folder(tmp_path / "link.ckpt")
    assert verify_checkpoint(folder).step == 1
    remove_set_folder(folder)
    assert os.listdir(tmp_path) == []
    with pytest.raises(FileNotFoundError):
        remove_set_folder(folder)


def test_the_command_line_lists_inspects_and_verifies_them(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    save_state_tree_set({"w": torch.ones(2)}, tmp_path / "epoch=0-step=5.ckpt", step=5, rng=None)
    bad = save_state_tree_set(
        {"w": torch.ones(2)}, tmp_path / "epoch=1-step=10.ckpt", step=10, rng=None
    )
    (bad / "training_state.json").write_bytes(b"{}")
    assert cli_main(["ls", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "2 set(s) under other names" in out
    good_line, bad_line = (line for line in out.splitlines() if ".ckpt" in line)
    assert "epoch=0-step=5.ckpt" in good_line and "verified (state.safetensors" in good_line
    assert "epoch=1-step=10.ckpt" in bad_line and "NOT VERIFIED" in bad_line
    assert cli_main(["verify", str(tmp_path / "epoch=0-step=5.ckpt")]) == 0
    assert "ok (step 5, 1 state tensors" in capsys.readouterr().out
    assert cli_main(["verify", str(bad)]) == 1
    assert cli_main(["inspect", str(tmp_path / "epoch=0-step=5.ckpt")]) == 0
    assert "state tree" in capsys.readouterr().out
