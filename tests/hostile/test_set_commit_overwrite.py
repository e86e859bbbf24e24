"""Replacing and removing checkpoint sets under kills, symbolic links and leftovers.

* ``overwrite=True`` killed (SIGKILL) at every point of its commit — with the atomic exchange
  and without one (the retired old set is put back by the next cleaner) — leaves the step
  holding a whole set that verifies, the old one or the new one, never nothing, once a new
  ``CheckpointManager`` has opened the folder; and no leftovers.
* A step folder that is a symbolic link is replaced (``overwrite``) or removed (retention)
  as a link: the link goes, what it points to is never followed or deleted.
* A killed ``save_checkpoint`` leaves its temporary folder; the next save into the same
  folder removes it, never one a live save holds.
"""

from __future__ import annotations

import fcntl
import itertools
import os
import signal
import sys
from pathlib import Path

import pytest
import torch
from hostile_support import run_python
from overwrite_kill_child import write

import tlckpt
from tlckpt.codec.sets.checkpoint_set import verify_checkpoint
from tlckpt.codec.sets.set_commit import RETIRED_SUFFIX, clean_leftovers, is_retired, remove_set
from tlckpt.codec.sets.set_documents import parse_training_state
from tlckpt.formats.checkpoint_set import folder_name

CHILD = Path(__file__).resolve().parent / "overwrite_kill_child.py"
STEP = folder_name(1)


def _tag(folder: Path) -> int:
    """The tag of the set in ``folder``, which must verify."""
    verify_checkpoint(folder)
    state = parse_training_state((folder / "training_state.json").read_bytes(), 1 << 20)
    return state.extra["tag"]


# --------------------------------------------------------------------------- item 8


@pytest.mark.parametrize("mode", ["exchange", "no-exchange"])
def test_overwrite_killed_at_every_point_keeps_a_whole_set(mode: str, tmp_path: Path) -> None:
    tags = []
    for kill_at in itertools.count(1):
        assert kill_at < 60, "the commit never completed"
        folder = tmp_path / f"kill-{kill_at}"
        write(str(folder), 1, 1, overwrite=False)
        proc = run_python(
            [str(CHILD), str(folder), "1", "2", str(kill_at), mode], 120, f"kill at {kill_at}"
        )
        killed = proc.returncode == -signal.SIGKILL
        assert killed or proc.returncode == 0, proc.stderr
        tlckpt.CheckpointManager(folder)  # opening a manager cleans up and completes
        assert os.listdir(folder) == [STEP], (kill_at, os.listdir(folder))
        tags.append(_tag(folder / STEP))
        if not killed:
            assert int(proc.stdout) == kill_at - 1
            break
    # Old until the new set is in place, new from then on, never nothing in between.
    assert tags[0] == 1 and tags[-1] == 2 and tags == sorted(tags), tags


def test_a_retired_set_is_put_back_or_removed(tmp_path: Path) -> None:
    for step in (1, 2, 3):
        write(str(tmp_path), step, step, overwrite=False)
    write(str(tmp_path / "new"), 2, 22, overwrite=False)
    retired_1 = tmp_path / f".{STEP}.tlckpt-abcdefgh{RETIRED_SUFFIX}"
    retired_2 = tmp_path / f".{folder_name(2)}.tlckpt-abcdefgh{RETIRED_SUFFIX}"
    held = tmp_path / f".{folder_name(3)}.tlckpt-abcdefgh{RETIRED_SUFFIX}"
    assert is_retired(retired_1.name) and not is_retired(f".{STEP}.tlckpt-abcdefgh.tmp")
    os.rename(tmp_path / STEP, retired_1)  # its overwrite killed before the new set came
    os.rename(tmp_path / folder_name(2), retired_2)  # ... killed after the new set came:
    os.rename(tmp_path / "new" / folder_name(2), tmp_path / folder_name(2))
    os.rmdir(tmp_path / "new")
    os.rename(tmp_path / folder_name(3), held)
    fd = os.open(held, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # a live overwrite holds it
        assert sorted(clean_leftovers(tmp_path)) == [retired_1, retired_2]
    finally:
        os.close(fd)
    assert sorted(os.listdir(tmp_path)) == [held.name, STEP, folder_name(2)]
    assert _tag(tmp_path / STEP) == 1 and _tag(tmp_path / folder_name(2)) == 22


# --------------------------------------------------------------------------- item 9


def _elsewhere(tmp_path: Path, tag: int) -> tuple[Path, Path]:
    """A set outside the managed folder, and the managed folder with step 1 linked to it."""
    outside, managed = tmp_path / "outside", tmp_path / "managed"
    write(str(outside), 1, tag, overwrite=False)
    managed.mkdir()
    (managed / STEP).symlink_to(outside / STEP, target_is_directory=True)
    return outside / STEP, managed


@pytest.mark.parametrize("mode", ["exchange", "no-exchange"])
def test_overwriting_a_linked_step_replaces_the_link_only(
    mode: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if mode == "no-exchange":
        monkeypatch.setattr(
            "tlckpt.codec.sets.set_commit.exchange", lambda first, second: False, raising=False
        )
    target, managed = _elsewhere(tmp_path, 1)
    write(str(managed), 1, 2, overwrite=True)
    assert os.listdir(managed) == [STEP] and not (managed / STEP).is_symlink()
    assert _tag(managed / STEP) == 2 and _tag(target) == 1  # the link's target untouched


def test_retention_removes_a_linked_step_as_a_link(tmp_path: Path) -> None:
    target, managed = _elsewhere(tmp_path, 1)
    model = torch.nn.Linear(2, 2)
    manager = tlckpt.CheckpointManager(managed, keep_last=1)
    assert manager.steps() == [1]
    manager.save(2, model=model)
    assert os.listdir(managed) == [folder_name(2)]  # no leftover link either
    assert _tag(target) == 1
    remove_set(tmp_path / "outside", 1)  # a real folder still goes as before
    assert os.listdir(tmp_path / "outside") == []


def test_leftover_links_are_removed_never_followed(tmp_path: Path) -> None:
    target, managed = _elsewhere(tmp_path, 1)
    link = managed / f".{STEP}.tlckpt-abcdefgh.tmp"
    os.rename(managed / STEP, link)  # a removal killed after retiring a linked step
    assert clean_leftovers(managed) == [link]
    assert os.listdir(managed) == [] and _tag(target) == 1


# --------------------------------------------------------------------------- item 11

_KILLED_SAVE = """
import os, signal, sys, torch, tlckpt
from tlckpt.codec.sets import set_commit
def killed(self, *args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)
set_commit.SetWriter.commit = killed
tlckpt.save_checkpoint(sys.argv[1], model=torch.nn.Linear(3, 2), step=1)
"""


def _temporaries(folder: Path) -> list[str]:
    return sorted(n for n in os.listdir(folder) if tlckpt.is_temporary(n))


@pytest.mark.parametrize("next_save", ["save_checkpoint", "CheckpointManager"])
def test_a_killed_saves_folder_is_removed_by_the_next_save(next_save: str, tmp_path: Path) -> None:
    proc = run_python(["-c", _KILLED_SAVE, str(tmp_path / "a")], 120, "the killed save")
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    (stale,) = _temporaries(tmp_path)
    assert (tmp_path / stale).is_dir()
    # A live save's temporary folder (held under its lock) is never removed.
    live = tmp_path / ".b.tlckpt-livelive.tmp"
    live.mkdir()
    fd = os.open(live, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        model = torch.nn.Linear(3, 2)
        if next_save == "save_checkpoint":
            tlckpt.save_checkpoint(tmp_path / "c", model=model, step=2)
        else:
            tlckpt.CheckpointManager(tmp_path).save(2, model=model)
        assert _temporaries(tmp_path) == [live.name]
    finally:
        os.close(fd)
    assert sys.platform != "win32"
