"""``tlckpt ls``, ``verify`` and ``inspect`` show a version-2 set's members (issue #21)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from cli_support import refused, run_ok

import tlckpt


def _gan_set(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    models = {"G": torch.nn.Linear(4, 4).to(torch.bfloat16), "D": torch.nn.Linear(4, 1)}
    optimizers = {k: torch.optim.Adam(m.parameters()) for k, m in models.items()}
    manager = tlckpt.CheckpointManager(tmp_path)
    return manager.save(5, model=models, optimizer=optimizers).wait()


def test_ls_verify_and_inspect_show_the_members(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    folder = _gan_set(tmp_path)
    listing = run_ok(capsys, "ls", tmp_path)
    assert "model.G.safetensors" in listing and "model.D.tlsf32" in listing
    assert "optimizer.G.tladam" in listing and "NOT VERIFIED" not in listing
    verified = run_ok(capsys, "verify", folder)
    assert "ok (step 5" in verified and "model.G.safetensors (safetensors v0" in verified
    text = run_ok(capsys, "inspect", folder)
    assert "manifest version 2" in text
    assert "model.G: model.G.safetensors (safetensors v0" in text and "2 tensors" in text
    assert "optimizer.D: optimizer.D.tladam" in text and "binds model.D; 1 param groups" in text
    info = json.loads(run_ok(capsys, "inspect", "--json", folder))
    assert info["structure"]["model"] == {"kind": "mapping", "keys": ["G", "D"]}
    assert info["members"]["model.G"]["tensors"] == [["weight", [4, 4]], ["bias", [4]]]
    assert info["members"]["optimizer.G"]["models"] == ["model.G"]


def test_inspect_a_version_1_set_and_a_folder_that_is_not_one(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    model = torch.nn.Linear(2, 2)
    folder = tlckpt.save_checkpoint(tmp_path / "one", model=model)
    text = run_ok(capsys, "inspect", folder)
    assert "manifest version 1" in text and "model state: 2 tensors" in text
    (tmp_path / "empty").mkdir()
    refused(capsys, "IntegrityError", "inspect", tmp_path / "empty")
