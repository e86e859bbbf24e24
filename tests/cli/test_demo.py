"""``tlckpt demo``: the training demo resumes bit-identically (and is the default command);
``demo --codec`` round-trips every format with numpy only."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_support import (
    run,
    run_ok,
)

import tlckpt
from tlckpt import cli


def test_demo_reports_bit_identical_resume(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = run_ok(capsys, "demo", "--keep", tmp_path)
    assert "verdict: BIT-IDENTICAL" in out
    assert "DIFFERENT" not in out and "NOT" not in out
    assert "TLADAMF (Adam/AdamW optimizer state), version 4" in out  # tied + counter → v4
    info = tlckpt.inspect(tmp_path / "optimizer.tladam")
    assert info["version"] == 4 and info["has_aliases"] and info["random_counter"] == 5
    assert [s["trainable"] for s in info["slots"]].count(False) == 2  # the frozen layer
    assert tlckpt.inspect(tmp_path / "model.json")["encoding"] == "float32"


def test_demo_is_the_default_command(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import tlckpt.cli.demo

    calls = []
    monkeypatch.setattr(
        tlckpt.cli.demo, "training_demo", lambda out, keep: calls.append(keep) or False
    )
    assert cli.main([]) == 1  # a demo that is not bit-identical exits non-zero
    assert calls == [None]


def test_codec_demo(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "demo", "--codec")
    assert code == 0
    assert out.count("bit-exact: True") == 11 and "False" not in out
