"""Another process's retention removes the listed sets while a restore is under way, and
commits a newer one: the restore (and ``latest``) looks again and finds the newer set, rather
than saying that no set verifies.

The other process is simulated deterministically: the first time a set is opened, the sets
that were listed are removed (as retention does) and a newer set is committed (moved in,
complete, as a commit renames it)."""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path
from typing import Any

import pytest
from special_files_support import saved_sets, small_run

from tlckpt import CheckpointManager
from tlckpt.codec.sets import checkpoint_set
from tlckpt.codec.sets.checkpoint_set import VerifiedSet, latest_verified
from tlckpt.codec.sets.set_commit import remove_set


def _race_on_first_open(monkeypatch: pytest.MonkeyPatch, directory: Path, newer: Path) -> None:
    """The first :meth:`VerifiedSet.open` finds sets 1 and 2 removed and ``newer`` (step 3)
    committed; later opens are left alone."""
    real_open = VerifiedSet.open.__func__
    raced: list[bool] = []

    def racing_open(cls: Any, folder: Any, **kwargs: Any) -> Any:
        if not raced:
            raced.append(True)
            shutil.move(newer, directory / newer.name)
            remove_set(directory, 1)
            remove_set(directory, 2)
        return real_open(cls, folder, **kwargs)

    monkeypatch.setattr(VerifiedSet, "open", classmethod(racing_open))


@pytest.fixture
def racing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "run"
    saved_sets(directory, [1, 2])
    (newer,) = saved_sets(tmp_path / "other", [3])
    _race_on_first_open(monkeypatch, directory, newer)
    return directory


def test_restore_looks_again_when_the_listed_sets_vanish(racing: Path) -> None:
    model, opt = small_run()
    restored = CheckpointManager(racing).restore(model=model, optimizer=opt)
    assert restored.step == 3


def test_latest_verified_looks_again_when_the_listed_sets_vanish(racing: Path) -> None:
    assert latest_verified(racing) == 3


def test_looking_again_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A directory whose listed sets vanish at every attempt is looked at a bounded number
    of times, then no set verifies (``None``), without a warning for the vanished sets."""
    listings: list[int] = []

    def vanishing(directory: Any) -> list[int]:
        listings.append(1)
        return [len(listings)]  # a step never there: it vanished before it was opened

    monkeypatch.setattr(checkpoint_set, "candidate_steps", vanishing)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert latest_verified(tmp_path) is None
    assert len(listings) == checkpoint_set.RELISTS
