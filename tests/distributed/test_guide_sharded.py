"""The guide's sharded examples (docs/guide.md, "Sharded models (FSDP2)" and "Background
saves of sharded models") run as written, on two gloo ranks started as ``torchrun`` would
(the tests of ``test_sharded_checkpoints`` take both paths; these the path the probe picks)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from sharded_support import launch

pytestmark = pytest.mark.distributed

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guide.md"


def sharded_example(title: str = "Sharded models (FSDP2)") -> str:
    """The section's one ```py block (a program of its own: the page's ```python blocks run
    in one process, this one needs a process group)."""
    text = GUIDE.read_text(encoding="utf-8")
    section = text.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^```py\n(.*?)^```", section, re.M | re.S)
    assert len(blocks) == 1, "the section holds one program"
    return blocks[0]


def test_the_guide_example_runs_on_two_ranks(tmp_path):
    script = tmp_path / "train_sharded.py"
    script.write_text(sharded_example(), encoding="utf-8")
    results, _, output = launch(2, tmp_path, [], script=script, cwd=tmp_path)
    assert [r["exit"] for r in results] == [0, 0], output
    for rank in (0, 1):
        assert f"rank {rank}: save parallel" in output, output
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "log-w2-r0.txt",
        "log-w2-r1.txt",
        "model.tlsf32",
        "opt.tladam",
        "train_sharded.py",
    ]


def test_the_guide_background_example_runs_on_two_ranks(tmp_path):
    """ "Background saves of sharded models": saves in the background while FSDP2 trains,
    restores the last set exactly, on two ranks."""
    script = tmp_path / "train_sharded_background.py"
    script.write_text(sharded_example("Background saves of sharded models"), encoding="utf-8")
    results, _, output = launch(2, tmp_path, [], timeout=120.0, script=script, cwd=tmp_path)
    assert [r["exit"] for r in results] == [0, 0], output
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [
        "step-00000000000000000003",
        "step-00000000000000000006",
    ]
