"""The command line on special files and stray entries: a FIFO or a device given to
``inspect``, ``validate`` or ``convert``, a set whose member or manifest is a FIFO given to
``ls`` and ``verify``, stray ``step-…`` entries, a missing set. Each runs as a subprocess
under a timeout, so that a command that blocks fails the test instead of hanging the suite.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import tlckpt
from tlckpt.testing.models import stepped_linear

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")

#: Seconds a command may take: each reads a few KiB.
TIMEOUT = 30


def tlckpt_cli(*argv: object) -> subprocess.CompletedProcess:
    """``python -m tlckpt ARGV`` (the package this test imports), killed after TIMEOUT."""
    return subprocess.run(
        [sys.executable, "-m", "tlckpt", *map(str, argv)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        cwd=Path(tlckpt.__file__).resolve().parent.parent,
    )


def _sets(directory: Path, steps: list[int]) -> list[Path]:
    model, opt = stepped_linear()
    manager = tlckpt.CheckpointManager(directory)
    return [manager.save(s, model=model, optimizer=opt).wait() for s in steps]


@pytest.mark.parametrize(
    "argv",
    [("inspect", "{f}"), ("validate", "{f}"), ("convert", "{f}", "{out}")],
    ids=["inspect", "validate", "convert"],
)
def test_a_fifo_is_refused_at_once(tmp_path: Path, argv: tuple[str, ...]) -> None:
    fifo = tmp_path / "state.tlsf32"
    os.mkfifo(fifo)
    out = tmp_path / "out.json"
    result = tlckpt_cli(*(a.format(f=fifo, out=out) for a in argv))
    assert result.returncode == 1, result.stderr
    assert "UnsupportedFormatError" in result.stderr
    assert "not a regular file (a FIFO)" in result.stderr and str(fifo) in result.stderr
    assert not out.exists()


@pytest.mark.parametrize("name", ["state.pt", "state.safetensors"])
def test_a_fifo_named_like_a_named_format_is_refused(tmp_path: Path, name: str) -> None:
    fifo = tmp_path / name
    os.mkfifo(fifo)
    result = tlckpt_cli("convert", fifo, tmp_path / "out.json")
    assert result.returncode == 1 and "not a regular file (a FIFO)" in result.stderr


def test_inspect_of_dev_zero_says_it_is_a_device(tmp_path: Path) -> None:
    if not os.path.exists("/dev/zero"):
        pytest.skip("needs /dev/zero")
    result = tlckpt_cli("inspect", "/dev/zero")
    assert result.returncode == 1
    assert "not a regular file (a character device)" in result.stderr
    assert "starts with" not in result.stderr


@pytest.mark.parametrize("member", ["optimizer.tladam", "manifest.json"])
def test_ls_and_verify_of_a_set_with_a_fifo(tmp_path: Path, member: str) -> None:
    _, new = _sets(tmp_path, [1, 2])
    (new / member).unlink()
    os.mkfifo(new / member)
    listing = tlckpt_cli("ls", tmp_path)
    assert listing.returncode == 0, listing.stderr
    rows = [line for line in listing.stdout.splitlines() if line.split()[:1] in (["1"], ["2"])]
    assert len(rows) == 2 and "verified (" in rows[0]
    assert "NOT VERIFIED: IntegrityError (regular file)" in rows[1] and member in rows[1]
    verify = tlckpt_cli("verify", new)
    assert verify.returncode == 1
    assert "IntegrityError" in verify.stderr and "not a regular file (a FIFO)" in verify.stderr


def test_ls_skips_stray_entries_and_names_them(tmp_path: Path) -> None:
    _sets(tmp_path, [1])
    (tmp_path / "step-99999999999999999999").mkdir()
    (tmp_path / "step-00000000000000000099").write_bytes(b"not a set")
    os.mkfifo(tmp_path / "step-00000000000000000098")
    listing = tlckpt_cli("ls", tmp_path)
    assert listing.returncode == 0, listing.stderr
    assert f"{tmp_path}: 1 set(s)" in listing.stdout
    assert "verified (" in listing.stdout
    for name in ("99999999999999999999", "00000000000000000099", "00000000000000000098"):
        assert f"step-{name}" in listing.stdout + listing.stderr
