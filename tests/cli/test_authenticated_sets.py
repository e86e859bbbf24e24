"""``tlckpt verify --key-file`` and ``tlckpt ls --key-file`` on signed checkpoint sets: exit
0 for a set signed with the key, 1 for one that does not authenticate (or a signed set
without the key), 2 for a key file that is not a key; the key is never printed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from cli_support import refused, run, run_ok

import tlckpt
from tlckpt.formats.checkpoint_set import folder_name

KEY = bytes(range(7, 39))


def _sets(directory: Path) -> tuple[Path, Path]:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    signed = tlckpt.CheckpointManager(directory, key=KEY).save(1, model=model, optimizer=opt)
    plain = tlckpt.CheckpointManager(directory).save(2, model=model, optimizer=opt)
    return signed.wait(), plain.wait()


def test_verify_with_a_key_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    signed, plain = _sets(tmp_path / "run")
    raw, hexed, wrong = tmp_path / "raw.key", tmp_path / "hex.key", tmp_path / "wrong.key"
    raw.write_bytes(KEY)
    hexed.write_text(KEY.hex() + "\n")
    wrong.write_bytes(os.urandom(32))
    for key_file in (raw, hexed):
        out = run_ok(capsys, "verify", signed, "--key-file", key_file)
        assert f"{signed}: ok (step 1" in out and "signed, key id " in out
        assert KEY.hex() not in out
    err = refused(capsys, "KeyRequiredError", "verify", signed)
    assert "cannot be authenticated without the key" in err
    err = refused(capsys, "IntegrityError", "verify", signed, "--key-file", wrong)
    assert "another key" in err
    err = refused(capsys, "IntegrityError", "verify", plain, "--key-file", raw)
    assert "not signed" in err
    assert "signed" not in run_ok(capsys, "verify", plain)

    member = signed / "model.tlsf32"
    data = member.read_bytes()
    member.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    err = refused(capsys, "IntegrityError", "verify", signed, "--key-file", raw)
    assert "model.tlsf32" in err and "digest" in err


@pytest.mark.parametrize(
    "content",
    [KEY[:31], KEY + b"x", b"z" * 64, b""],
    ids=["31-bytes", "33-bytes", "not-hex", "empty"],
)
def test_a_key_file_that_is_not_a_key_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, content: bytes
) -> None:
    signed, _ = _sets(tmp_path / "run")
    key_file = tmp_path / "bad.key"
    key_file.write_bytes(content)
    for command, target in (("verify", signed), ("ls", tmp_path / "run")):
        code, out, err = run(capsys, command, target, "--key-file", key_file)
        assert code == 2 and out == "", err
        assert "--key-file" in err and "32 raw bytes, or 64 hex digits" in err
        assert KEY.hex() not in err and KEY[:8].hex() not in err
    code, _, err = run(capsys, "verify", signed, "--key-file", tmp_path / "missing.key")
    assert code == 2 and "No such file" in err
    os.mkfifo(tmp_path / "fifo")
    code, _, err = run(capsys, "verify", signed, "--key-file", tmp_path / "fifo")
    assert code == 2 and "not a regular file" in err  # refused at once, never waited on


def test_ls_with_and_without_a_key_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    directory = tmp_path / "run"
    _sets(directory)
    key_file = tmp_path / "key"
    key_file.write_bytes(KEY)

    def rows(*extra: object) -> dict[str, str]:
        out = run_ok(capsys, "ls", directory, *extra)
        return {line.split()[0]: line for line in out.splitlines()[2:]}

    keyed = rows("--key-file", key_file)
    assert "verified (" in keyed["1"] and "signed, key id" in keyed["1"]
    assert "NOT VERIFIED: IntegrityError (signed)" in keyed["2"]
    plain = rows()
    assert "NOT VERIFIED: KeyRequiredError (key required)" in plain["1"]
    assert "verified (" in plain["2"] and "NOT" not in plain["2"]
    assert (directory / folder_name(1)).is_dir()
