"""Entries of a checkpoint directory named like sets that are not sets: a folder whose step
is above 2**64 - 1, a regular file or a FIFO named ``step-<20 digits>``. Each is passed over
with a warning naming it, never fatal: listing, ``latest`` and ``restore`` go on with the
real sets."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest
from special_files_support import saved_sets, small_run, within

from tlckpt import CheckpointManager, SkippedCheckpointWarning
from tlckpt.codec.sets.checkpoint_set import latest_verified
from tlckpt.codec.sets.set_folders import candidate_steps, committed_steps

TOO_LARGE = "step-99999999999999999999"  # 20 digits, above 2**64 - 1
NOT_A_FOLDER = "step-00000000000000000099"


def _strays(directory: Path, fifo: bool) -> list[str]:
    (directory / TOO_LARGE).mkdir()
    (directory / NOT_A_FOLDER).write_bytes(b"not a set")
    names = [TOO_LARGE, NOT_A_FOLDER]
    if fifo and hasattr(os, "mkfifo"):
        os.mkfifo(directory / "step-00000000000000000098")
        names.append("step-00000000000000000098")
    return names


@pytest.mark.parametrize("fifo", [False, True])
def test_stray_entries_are_skipped_with_a_warning(tmp_path: Path, fifo: bool) -> None:
    saved_sets(tmp_path, [1, 2])
    names = _strays(tmp_path, fifo)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert within(lambda: candidate_steps(tmp_path)) == [1, 2]
    messages = "\n".join(str(w.message) for w in caught if w.category is SkippedCheckpointWarning)
    for name in names:
        assert name in messages
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SkippedCheckpointWarning)
        assert within(lambda: committed_steps(tmp_path)) == [1, 2]
        assert within(lambda: latest_verified(tmp_path)) == 2
        model, opt = small_run()
        restored = within(lambda: CheckpointManager(tmp_path).restore(model=model, optimizer=opt))
    assert restored.step == 2


def test_restore_falls_back_past_a_step_above_the_u64_range(tmp_path: Path) -> None:
    saved_sets(tmp_path, [5])
    (tmp_path / TOO_LARGE).mkdir()
    model, opt = small_run()
    with pytest.warns(SkippedCheckpointWarning, match=TOO_LARGE):
        restored = CheckpointManager(tmp_path).restore(model=model, optimizer=opt)
    assert restored.step == 5
