"""``SetWriter.adopt``: a member written in place by other code (every rank of a sharded save)
is read back once and recorded exactly as a member streamed through ``SetWriter.member``
would be — size, digest (keyed too), family — and the set verifies."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from tlckpt.codec.model_state.float32_state_writer import write_float32_state
from tlckpt.codec.sets import set_digests
from tlckpt.codec.sets.checkpoint_set import verify_checkpoint
from tlckpt.codec.sets.set_commit import SetWriter
from tlckpt.codec.sets.set_document_writing import build_training_state

KEY = bytes(range(32))


def _save(path: Path, *, adopt: bool, key: bytes | None) -> dict:
    # Larger than two read-back chunks, so that reading and hashing overlap.
    values = [np.arange(5 << 20, dtype=np.float32), np.full(7, 3.5, np.float32)]
    with SetWriter(path, 1, key=key) as writer:
        if adopt:
            write_float32_state(os.path.join(writer.path, "model.tlsf32"), values)
            writer.adopt("model", "model.tlsf32", 1)
        else:
            with writer.member("model", "model.tlsf32", 1) as f:
                write_float32_state(f, values)
        with writer.member("training_state", "training_state.json", 1, "training_state") as f:
            f.write(build_training_state(1, None, None, None, None, None))
        records = writer.records()
        writer.commit([("a", (5 << 20,)), ("b", (7,))])
    verify_checkpoint(path, key=key)
    return records


@pytest.mark.parametrize("key", [None, KEY], ids=["unsigned", "signed"])
def test_an_adopted_member_is_recorded_as_a_streamed_one(tmp_path: Path, key) -> None:
    streamed = _save(tmp_path / "streamed", adopt=False, key=key)
    adopted = _save(tmp_path / "adopted", adopt=True, key=key)
    assert adopted == streamed
    assert adopted["model"].family == "float32_state"  # named from its first bytes


def test_absorb_without_a_digest_thread_hashes_inline(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(set_digests, "_digest_thread", lambda: None)
    assert _save(tmp_path / "a", adopt=True, key=None) == _save(
        tmp_path / "b", adopt=False, key=None
    )


def test_a_member_that_cannot_be_read_back_raises(tmp_path: Path) -> None:
    with SetWriter(tmp_path / "s", 1) as writer, pytest.raises(FileNotFoundError):
        writer.adopt("model", "model.tlsf32", 1)
    assert not (tmp_path / "s").exists()
