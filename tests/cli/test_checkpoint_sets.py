"""``tlckpt ls`` and ``tlckpt verify`` of checkpoint sets: a good set, a damaged member, a
killed save's leftover, a missing folder."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_support import refused, run, run_ok

import tlckpt
from tlckpt.testing.models import stepped_linear


def test_ls_and_verify_checkpoint_sets(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    model, opt = stepped_linear()
    manager = tlckpt.CheckpointManager(tmp_path)
    good = manager.save(1, model=model, optimizer=opt).wait()
    bad = manager.save(2, model=model, optimizer=opt).wait()
    member = bad / "optimizer.tladam"
    data = member.read_bytes()
    member.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    (tmp_path / f".{good.name}.tlckpt-abcdefgh.tmp").mkdir()  # a killed save's leftover
    # An overwrite killed where no exchange exists leaves the old set moved aside.
    (tmp_path / f".{good.name}.tlckpt-abcdefgh.old").mkdir()

    out = run_ok(capsys, "ls", tmp_path)
    rows = {
        line.split()[0]: line for line in out.splitlines()[1:] if "KiB" in line or " B " in line
    }
    assert set(rows) == {"1", "2"}
    assert "verified (" in rows["1"] and "NOT VERIFIED" not in rows["1"]
    assert "NOT VERIFIED: IntegrityError (digest)" in rows["2"] and member.name in rows["2"]
    assert "1 leftover(s)" in out
    assert "1 set(s) moved aside by an interrupted overwrite" in out

    code, out, _ = run(capsys, "verify", good)
    assert code == 0 and f"{good}: ok (step 1, 2 state tensors" in out
    err = refused(capsys, "IntegrityError", "verify", bad)
    assert member.name in err and "digest" in err
    refused(capsys, "FileNotFoundError", "ls", tmp_path / "missing")
