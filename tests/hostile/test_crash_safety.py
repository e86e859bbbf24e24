"""Crash safety, short CI versions of ``python -m fuzz.crash_kill`` and
``python -m fuzz.concurrent_save``.

* A child process saving a model (``TLSF32B``), its optimizer (``TLADAMF``) and a small
  exact-bits JSON file is killed with SIGKILL at random moments: each destination is then
  the previous complete file or the new complete one (read fully, content compared), and
  whatever else is left is a recognisable temporary that no checkpoint glob matches.
* Two processes save to the same path at once, 50 rounds, while a third reads it: every
  round ends with one writer's complete file and nothing else in the folder; every
  concurrent read sees a complete file.
"""

from __future__ import annotations

import glob
import os
from pathlib import Path

from hostile_support import campaign_report, fuzz_module

from tlckpt.cli.convert import format_of_path
from tlckpt.codec import is_temporary


def test_sigkill_during_saves_never_damages_a_destination(tmp_path: Path) -> None:
    report, proc = campaign_report(
        ["fuzz.crash_kill", "--trials", "6", "--size-mb", "8", "--quiet", "--dir", str(tmp_path)],
        timeout=240,
    )
    assert report["damaged"] == [], report
    assert report["strays"] == [], report
    assert report["uncleaned"] == [], report
    assert report["temporaries_recognised"], report
    assert sum(v for k, v in report["outcomes"].items() if k.startswith("model")) == 7
    assert proc.returncode == 0, proc.stdout


def test_two_processes_saving_to_one_path(tmp_path: Path) -> None:
    report, proc = campaign_report(
        ["fuzz.concurrent_save", "--rounds", "50", "--size-mb", "1", "--dir", str(tmp_path)],
        timeout=180,
    )
    assert report["failures"] == [], report
    assert sum(report["winner_counts"].values()) == 50
    assert report["incomplete_reads"] == 0
    assert proc.returncode == 0


def test_temporary_names_are_recognised_and_never_checkpoints(tmp_path: Path) -> None:
    crash = fuzz_module("crash_kill")
    from tlckpt.codec.fileio import atomic

    for name in ("model.tlsf32", "opt.tladam", "state.json", "x"):
        folder = tmp_path / name.replace(".", "_")
        folder.mkdir()
        with atomic.atomic_output(folder / name) as f:
            f.write(b"partial")
            (temp,) = os.listdir(folder)
            assert is_temporary(temp), temp
            assert temp.startswith(".") and temp.endswith(".tmp")
            assert not temp.endswith(crash.CHECKPOINT_SUFFIXES)
            assert format_of_path(temp) is None  # `convert` would not take it either
            for pattern in ("*.tlsf32", "*.tladam", "*.json", "*.safetensors", "*.pt"):
                assert temp not in [p.name for p in folder.glob(pattern)]
            assert glob.glob(str(folder / "*")) == []  # hidden: shell-style globs skip it
        assert os.listdir(folder) == [name]
    for name in ("model.tlsf32", ".model.tlsf32", ".model.tlsf32.tmp", "model.tlckpt-1.tmp"):
        assert not is_temporary(name), name
