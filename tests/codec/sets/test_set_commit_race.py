"""A save's new temporary folder removed by another process's cleaner before the save could
lock it (seen in the sharded tests: one rank's ``CheckpointManager`` cleaning the directory
while rank 0 began its set) is not an error: the save takes another name."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tlckpt.codec.sets import set_folder_moves
from tlckpt.codec.sets.set_commit import SetWriter


def test_a_temporary_folder_removed_before_its_lock_is_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = set_folder_moves.lock_folder
    removed: list[str] = []

    def cleaner_first(path: str) -> int:
        if not removed:  # the cleaner wins the first race: the folder is gone
            os.rmdir(path)
            removed.append(path)
        return real(path)

    monkeypatch.setattr(set_folder_moves, "lock_folder", cleaner_first)
    with SetWriter(tmp_path / "step-1", 1) as writer:
        with writer.member("training_state", "training_state.json", 1, "training_state") as f:
            f.write(b"{}")
        assert writer.path != removed[0] and os.path.isdir(writer.path)
    assert removed and not os.path.exists(removed[0])
