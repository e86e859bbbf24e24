"""``tlckpt inspect`` and ``validate`` of tlckpt's own optimizer family (``TLCKOPT``): what
inspect shows of its groups and slots, and validation across the two optimizer families."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from cli_support import VECTORS_DIR, refused, run, run_ok

import tlckpt


def _optimizer_files(folder: Path) -> tuple[Path, Path]:
    """A TLCKOPT file (two groups, amsgrad in one) and a TLADAMF file of the same model."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    weights = [p for p in model.parameters() if p.ndim > 1]
    others = [p for p in model.parameters() if p.ndim <= 1]
    groups = [
        {"params": weights, "weight_decay": 0.01},
        {"params": others, "weight_decay": 0.0, "amsgrad": True},
    ]
    own, plain = torch.optim.AdamW(groups, lr=1e-3), torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 4)).sum().backward()
    own.step()
    plain.step()
    assert tlckpt.save_optimizer(own, model, folder / "own.tlckopt", random_counter=5) == 1
    assert tlckpt.save_optimizer(plain, model, folder / "plain.tladam") == 2
    return folder / "own.tlckopt", folder / "plain.tladam"


def test_inspect_tlckpt_optimizer_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    own, _ = _optimizer_files(tmp_path)
    out = run_ok(capsys, "inspect", own)
    assert "family          TLCKOPT (tlckpt's own Adam/AdamW optimizer state;" in out
    assert "param groups    2" in out and "group 1  AdamW (amsgrad)" in out
    assert "lr            0.001    0x3f50624dd2f1a9fc" in out
    assert "slot  step  dtype    elements  bytes" in out
    info = json.loads(run_ok(capsys, "inspect", own, "--json"))
    assert info["family"] == "tlckpt_optimizer" and info["random_counter"] == 5
    assert [g["amsgrad"] for g in info["groups"]] == [False, True]
    assert [s["group"] for s in info["slots"]] == [0, 1, 1, 1]


def test_validate_across_the_optimizer_families(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A reference of either optimizer family is a destination for files of both."""
    own, plain = _optimizer_files(tmp_path)
    for file in (own, plain):
        assert run(capsys, "validate", file, "--against", file)[0] == 0
    err = refused(capsys, "ConfigError", "validate", own, "--against", plain)
    assert "field groups[1].weight_decay: param group 1: weight_decay is 0.0" in err
    err = refused(capsys, "ConfigError", "validate", plain, "--against", own)
    assert "no TLADAMF file loads into this optimizer" in err and "amsgrad" in err
    vector = VECTORS_DIR / "state_basic.tlsf32"
    err = refused(capsys, "UnsupportedFormatError", "validate", vector, "--against", own)
    assert "TLADAMF" in err and "TLCKOPT" in err  # either would fit


def test_validate_against_a_tlckpt_optimizer_description(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    own, _ = _optimizer_files(tmp_path)
    info = tlckpt.inspect(own)
    groups = [
        {
            "kind": g["kind"],
            **{
                f"{n}_bits": g[n]["bits"]
                for n in ("beta1", "beta2", "epsilon", "weight_decay", "lr")
            },
            "amsgrad": g["amsgrad"],
            "maximize": g["maximize"],
        }
        for g in info["groups"]
    ]
    description = {
        "kind": "tlckpt_optimizer",
        "schema": {
            "shapes": [s["shape"] for s in info["slots"]],
            "requires_grad": [s["trainable"] for s in info["slots"]],
        },
        "groups": groups,
        "slot_groups": [s["group"] for s in info["slots"]],
        "dtypes": ["float32"] * len(info["slots"]),
    }
    (tmp_path / "d.json").write_text(json.dumps(description))
    assert run(capsys, "validate", own, "--against", tmp_path / "d.json")[0] == 0
    description["slot_groups"] = [1, 0, 1, 1]
    (tmp_path / "d.json").write_text(json.dumps(description))
    refused(capsys, "SchemaMismatchError", "validate", own, "--against", tmp_path / "d.json")
    description["dtypes"] = ["float8"] * 4
    (tmp_path / "d.json").write_text(json.dumps(description))
    refused(capsys, "MalformedError", "validate", own, "--against", tmp_path / "d.json")
