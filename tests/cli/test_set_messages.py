"""What ``tlckpt verify`` says of sets whose manifest lies (resealed, so its own digest
agrees): a member's recorded version or family that its header contradicts, a ``library``
holding newlines and terminal escapes; and of a set folder that does not exist."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cli_support import refused, run_ok

import tlckpt
from tlckpt.cli.printable import printable
from tlckpt.codec.sets.set_documents import self_digest
from tlckpt.testing.models import stepped_linear


def _set(directory: Path) -> Path:
    model, opt = stepped_linear()
    return tlckpt.CheckpointManager(directory).save(1, model=model, optimizer=opt).wait()


def _reseal(folder: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    path = folder / "manifest.json"
    document = json.loads(path.read_bytes())
    edit(document)
    document["self_digest"] = self_digest(document)
    path.write_bytes(json.dumps(document).encode())


@pytest.mark.parametrize(
    ("role", "key", "value", "check"),
    [
        ("model", "version", 99, "version"),
        ("optimizer", "version", 7, "version"),
        ("model", "family", "state_bits", "family"),
        ("training_state", "family", "adam", "family"),
        ("training_state", "version", 2, "version"),
    ],
)
def test_verify_cross_checks_recorded_family_and_version(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, role: str, key: str, value: Any, check: str
) -> None:
    folder = _set(tmp_path)

    def edit(document: dict[str, Any]) -> None:
        document["members"][role][key] = value

    _reseal(folder, edit)
    with pytest.raises(tlckpt.IntegrityError) as info:
        tlckpt.verify_checkpoint(folder)
    assert info.value.check == check and info.value.field == f"members.{role}.{check}"
    err = refused(capsys, "IntegrityError", "verify", folder)
    assert f"member {role}" in err and "the manifest records" in err
    out = run_ok(capsys, "ls", tmp_path)
    assert f"NOT VERIFIED: IntegrityError ({check})" in out


def test_verify_shows_the_library_escaped(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    folder = _set(tmp_path)
    hostile = "tlckpt 9\n\x1b[31mFAKE: ok\x1b[0m\r\u202e"

    def edit(document: dict[str, Any]) -> None:
        document["library"] = hostile

    _reseal(folder, edit)
    out = run_ok(capsys, "verify", folder)
    assert out.count("\n") == 1 and "\x1b" not in out and "\r" not in out
    assert "\u202e" not in out
    assert "written by tlckpt 9\\n\\x1b[31mFAKE: ok\\x1b[0m\\r\\u202e)" in out


def test_printable() -> None:
    assert printable("plain text, ünïcode") == "plain text, ünïcode"
    assert printable("a\tb\nc\x1b[0m\x7f\x85\ud800") == "a\\tb\\nc\\x1b[0m\\x7f\\x85\\ud800"


def test_verify_of_a_missing_folder_says_it_does_not_exist(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    err = refused(capsys, None, "verify", tmp_path / "missing")
    assert "does not exist" in err and "never committed" not in err
    folder = tmp_path / "step-00000000000000000001"
    folder.mkdir()
    err = refused(capsys, "IntegrityError", "verify", folder)
    assert "never committed" in err
