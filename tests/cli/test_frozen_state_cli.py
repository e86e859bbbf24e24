"""``tlckpt inspect`` and ``validate`` of a ``TLCKOPT`` version 2 file: a frozen parameter
that kept its optimizer state (issue #20, item 12) is shown as a frozen slot with a group and
an entry, and validation holds the file's flags and groups to a reference."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from cli_support import refused, run_ok

import tlckpt


def _files(folder: Path) -> tuple[Path, Path]:
    """A version 2 file (layer 0 frozen after two steps) and the same run's file saved
    before the freeze (``TLADAMF``)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(2):
        opt.zero_grad()
        model(torch.randn(5, 3)).sum().backward()
        opt.step()
    assert tlckpt.save_optimizer(opt, model, folder / "before.tladam") == 2
    model[0].requires_grad_(False)
    assert tlckpt.save_optimizer(opt, model, folder / "frozen.tlckopt") == 2
    return folder / "frozen.tlckopt", folder / "before.tladam"


def test_inspect_and_validate_show_frozen_state(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    frozen, before = _files(tmp_path)
    out = run_ok(capsys, "inspect", frozen)
    assert "TorchLean cannot read it), version 2" in out
    assert "4 slot(s), 2 trainable, 4 with moments" in out
    info = json.loads(run_ok(capsys, "inspect", frozen, "--json"))
    assert [(s["trainable"], s["group"]) for s in info["slots"]] == [
        (False, 0),
        (False, 0),
        (True, 0),
        (True, 0),
    ]
    assert [e["id"] for e in info["entries"]] == [0, 1, 2, 3]
    assert "TLCKOPT v2" in run_ok(capsys, "validate", frozen)
    assert "fits" in run_ok(capsys, "validate", frozen, "--against", frozen)
    err = refused(capsys, "SchemaMismatchError", "validate", frozen, "--against", before)
    assert "requires_grad False in the file, True expected" in err
