"""The command line as a program: usage errors (exit 2), ``--help``, progress bars only for
large files on a terminal, and ``python -m tlckpt`` as a subprocess."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from cli_support import (
    VECTORS_DIR,
    one_line_rejection,
    run,
)

from tlckpt.cli import progress


@pytest.mark.parametrize(
    "argv",
    [
        ["frobnicate"],
        ["inspect"],
        ["inspect", "a", "b"],
        ["validate"],
        ["validate", "x.tladam", "--bogus"],
        ["convert", "a.tlsf32"],
        ["convert", "a.tlsf32", "b.json", "--to", "zip"],
        ["convert", "a.tlsf32", "b.unknown"],
        ["convert", "a.unknown", "b.json"],
        ["convert", "a.tlsf32", "b.tlsf32", "--dtype", "float64"],
        ["convert", "a.tlsf32", "b.json", "--dtype", "float31"],
        ["convert", "a.tlsf32", "b.json", "--names-from", "c.pt"],
        ["demo", "extra"],
        ["--nope"],
    ],
)
def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    code, _, err = run(capsys, *argv)
    assert code == 2
    assert "usage:" in err and "Traceback" not in err


def test_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--help")
    assert code == 0 and "inspect" in out and "convert" in out


def test_progress_bar_only_for_large_files_on_a_terminal(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    path = VECTORS_DIR / "state_basic.tlsf32"
    assert run(capsys, "validate", path)[2] == ""  # small file, not a terminal: silent
    monkeypatch.setattr(progress, "THRESHOLD", 0)
    assert run(capsys, "validate", path)[2] == ""  # large, but stderr is not a terminal
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    code, _, err = run(capsys, "validate", path)
    assert code == 0 and "checking" in err  # tqdm drew on stderr
    code, _, err = run(capsys, "convert", path, tmp_path / "s.tlsf32")
    assert code == 0 and "writing" in err
    assert (tmp_path / "s.tlsf32").read_bytes() == path.read_bytes()


def _python_m_tlckpt(*argv: object) -> subprocess.CompletedProcess[str]:
    """``python -m tlckpt ARGV`` in a child process, its output captured as text."""
    return subprocess.run(
        [sys.executable, "-m", "tlckpt", *map(str, argv)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_python_dash_m_subprocess() -> None:
    vector = VECTORS_DIR / "adam_v5_f64_tied_counter.tladam"
    done = _python_m_tlckpt("validate", vector)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"{vector}: ok (TLADAMF v5")
    bad = VECTORS_DIR / "bad_adam_truncated_payload.tladam"
    done = _python_m_tlckpt("inspect", bad)
    assert done.returncode == 1 and done.stdout == ""
    one_line_rejection(done.stderr, "TruncatedError")
