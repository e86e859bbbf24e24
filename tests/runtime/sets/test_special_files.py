"""Special files in a checkpoint set: a member or the manifest replaced by a FIFO, a member
symlinked to ``/dev/zero`` with a resealed size of 0. None of them may block a reader: each
is refused as "not a regular file" (naming the member), and ``latest``, ``restore`` and a
later save's retention pass it over. Every call runs under a deadline.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import pytest
import xxhash
from special_files_support import release_fifo, reseal, saved_sets, small_run, within

import tlckpt
from tlckpt import (
    CheckpointManager,
    IntegrityError,
    SkippedCheckpointWarning,
    UnsupportedFormatError,
    verify_checkpoint,
)
from tlckpt.codec.sets.checkpoint_set import VerifiedSet, latest_verified
from tlckpt.codec.sets.set_digests import hash_file

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")


def _replace_by_fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def _skipped_messages(caught: list[warnings.WarningMessage]) -> str:
    return "\n".join(str(w.message) for w in caught if w.category is SkippedCheckpointWarning)


@pytest.mark.parametrize("member", ["optimizer.tladam", "model.tlsf32", "training_state.json"])
def test_member_replaced_by_fifo_is_refused(tmp_path: Path, member: str) -> None:
    old, new = saved_sets(tmp_path, [1, 2])
    fifo = new / member
    _replace_by_fifo(fifo)
    try:
        with pytest.raises(IntegrityError, match="not a regular file") as info:
            within(lambda: verify_checkpoint(new))
        assert member in str(info.value) and info.value.check == "regular file"
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert within(lambda: latest_verified(tmp_path)) == 1
        assert "step 2 skipped" in _skipped_messages(caught)
        assert "not a regular file" in _skipped_messages(caught)
        model, opt = small_run()
        with pytest.warns(SkippedCheckpointWarning, match="not a regular file"):
            restored = within(
                lambda: CheckpointManager(tmp_path).restore(model=model, optimizer=opt)
            )
        assert restored.step == 1 and old.exists()
    finally:
        release_fifo(fifo)


def test_manifest_replaced_by_fifo_blocks_nothing(tmp_path: Path) -> None:
    _, new = saved_sets(tmp_path, [1, 2])
    fifo = new / "manifest.json"
    _replace_by_fifo(fifo)
    try:
        with pytest.raises(IntegrityError, match="not a regular file"):
            within(lambda: verify_checkpoint(new))
        manager = CheckpointManager(tmp_path, keep_last=1)
        with pytest.warns(SkippedCheckpointWarning, match="not a regular file"):
            assert within(manager.latest) == 1
        model, opt = small_run()
        # The save's retention lists the committed sets: the FIFO must not block it.
        within(lambda: manager.save(3, model=model, optimizer=opt).wait())
        assert within(manager.steps) == [3]
    finally:
        release_fifo(fifo)


def test_member_symlinked_to_dev_zero_is_refused(tmp_path: Path) -> None:
    if not os.path.exists("/dev/zero"):
        pytest.skip("needs /dev/zero")
    _, new = saved_sets(tmp_path, [1, 2])
    member = new / "optimizer.tladam"
    member.unlink()
    member.symlink_to("/dev/zero")
    empty = xxhash.xxh3_128(b"").hexdigest()

    def edit(document: dict) -> None:
        document["members"]["optimizer"].update(size=0, digest=empty)

    reseal(new, edit)
    with pytest.raises(IntegrityError, match="not a regular file"):
        within(lambda: verify_checkpoint(new))
    with pytest.raises(IntegrityError, match="optimizer"):
        within(lambda: VerifiedSet.open(new, streaming=True).__enter__())
    with pytest.warns(SkippedCheckpointWarning, match="not a regular file"):
        assert within(lambda: latest_verified(tmp_path)) == 1


def test_hash_file_reads_at_most_one_byte_past_the_recorded_size() -> None:
    if not os.path.exists("/dev/zero"):
        pytest.skip("needs /dev/zero")
    with open("/dev/zero", "rb") as f:
        digest, length = within(lambda: hash_file(f, 10))
    assert length == 11 and digest == xxhash.xxh3_128(bytes(11)).hexdigest()


@pytest.mark.parametrize(
    ("name", "load"),
    [
        ("state.tlsf32", lambda m, o, p: tlckpt.load_module_state(m, p)),
        ("state.json", lambda m, o, p: tlckpt.load_state_bits(m, p)),
        ("state.tladam", lambda m, o, p: tlckpt.load_optimizer(o, m, p)),
    ],
    ids=["load_module_state", "load_state_bits", "load_optimizer"],
)
def test_loading_a_fifo_is_refused_at_once(tmp_path: Path, name: str, load: Any) -> None:
    fifo = tmp_path / name
    os.mkfifo(fifo)
    model, opt = small_run()
    try:
        with pytest.raises(UnsupportedFormatError, match=r"not a regular file \(a FIFO\)"):
            within(lambda: load(model, opt, fifo))
    finally:
        release_fifo(fifo)
