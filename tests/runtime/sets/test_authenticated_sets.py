"""Signed checkpoint sets through the torch side: ``CheckpointManager(key=)`` signs blocking
and background saves, restores only sets signed with its key (passing over the others with a
warning), and ``save_checkpoint``/``load_checkpoint(key=)`` do the same for one set."""

from __future__ import annotations

import warnings
from pathlib import Path

import blake3
import orjson
import pytest
import torch
from set_support import assert_same, build, seed_all, train

from tlckpt import (
    CheckpointError,
    CheckpointManager,
    IntegrityError,
    KeyRequiredError,
    SkippedCheckpointWarning,
    load_checkpoint,
    save_checkpoint,
    verify_checkpoint,
)
from tlckpt.formats.checkpoint_set import MEMBER_KEY_CONTEXT, folder_name
from tlckpt.testing.models import stepped_linear

KEY = bytes(range(100, 132))
OTHER_KEY = bytes(range(32))


def _manifest(folder: Path) -> dict:
    return orjson.loads((folder / "manifest.json").read_bytes())


@pytest.mark.parametrize("blocking", [True, False], ids=["sync", "async"])
def test_signed_resume_is_bit_exact(tmp_path: Path, blocking: bool) -> None:
    seed_all(1)
    model, opt, sch = build(0)
    counter, _ = train(model, opt, sch, 0, 2)
    manager = CheckpointManager(tmp_path, key=KEY)
    handle = manager.save(
        3, model=model, optimizer=opt, scheduler=sch, random_counter=counter, blocking=blocking
    )
    end, reference = train(model, opt, sch, counter, 3)
    folder = handle.wait()
    document = _manifest(folder)
    assert document["digest"] == "blake3_keyed" and "mac" in document
    member_key = blake3.blake3(KEY, derive_key_context=MEMBER_KEY_CONTEXT).digest()
    for record in document["members"].values():  # every member, keyed, as it was written
        data = (folder / record["file"]).read_bytes()
        assert record["digest"] == blake3.blake3(data, key=member_key).hexdigest()
    assert manager.latest() == 3 and verify_checkpoint(folder, key=KEY).step == 3

    fresh, fresh_opt, fresh_sch = build(99)
    seed_all(7)
    restored = manager.restore(model=fresh, optimizer=fresh_opt, scheduler=fresh_sch, rng=True)
    assert restored.step == 3
    resumed_end, resumed = train(fresh, fresh_opt, fresh_sch, restored.random_counter, 3)
    assert resumed_end == end and all(torch.equal(a, b) for a, b in zip(reference, resumed))
    assert_same(model, opt, sch, fresh, fresh_opt, fresh_sch)


def test_a_manager_with_a_key_passes_over_sets_it_cannot_authenticate(tmp_path: Path) -> None:
    model, opt, sch = build(0)
    signed = CheckpointManager(tmp_path, key=KEY)
    signed.save(1, model=model, optimizer=opt, scheduler=sch)
    at_one = model.a.bias.detach().clone()
    with torch.no_grad():
        model.a.bias.add_(1.0)
    signed.save(2, model=model, optimizer=opt, scheduler=sch)
    CheckpointManager(tmp_path).save(3, model=model, optimizer=opt, scheduler=sch)  # unsigned
    CheckpointManager(tmp_path, key=OTHER_KEY).save(4, model=model, optimizer=opt)
    # Step 2 edited without the key: a member byte flipped, its digest left (a forger cannot
    # recompute a keyed one).
    member = tmp_path / folder_name(2) / "model.tlsf32"
    data = bytearray(member.read_bytes())
    data[-1] ^= 1
    member.write_bytes(bytes(data))
    assert signed.steps() == [1, 2, 3, 4]  # listed, not authenticated

    fresh, fresh_opt, fresh_sch = build(99)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert signed.latest() == 1
        assert signed.restore(model=fresh, optimizer=fresh_opt, scheduler=fresh_sch).step == 1
    skipped = [str(w.message) for w in caught if w.category is SkippedCheckpointWarning]
    assert len(skipped) == 6
    assert "step 4" in skipped[3] and "check: key)" in skipped[3]
    assert "step 3" in skipped[4] and "check: signed" in skipped[4]
    assert "step 2" in skipped[5] and "check: digest" in skipped[5]
    assert torch.equal(fresh.a.bias, at_one)
    with pytest.raises(IntegrityError) as refused:
        signed.restore(model=fresh, optimizer=fresh_opt, scheduler=fresh_sch, step=3)
    assert refused.value.check == "signed"

    # Without a key, only the unsigned set restores; the signed ones say why not.
    plain = CheckpointManager(tmp_path)
    with pytest.warns(SkippedCheckpointWarning, match="step 4 .*without the key"):
        assert plain.restore(model=fresh, optimizer=fresh_opt, scheduler=fresh_sch).step == 3
    with pytest.raises(KeyRequiredError, match="cannot be authenticated without the key"):
        plain.restore(model=fresh, optimizer=fresh_opt, scheduler=fresh_sch, step=1)


def test_save_and_load_checkpoint_with_a_key(tmp_path: Path) -> None:
    """One set, streamed members (above the inline size: hashed, keyed, while they load)."""
    big, opt = stepped_linear(1200, 1200)
    folder = save_checkpoint(tmp_path / "set", model=big, optimizer=opt, step=5, key=KEY)
    fresh = torch.nn.Linear(1200, 1200)
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=1e-3)
    with pytest.raises(KeyRequiredError):
        load_checkpoint(folder, model=fresh, optimizer=fresh_opt)
    with pytest.raises(IntegrityError) as caught:
        load_checkpoint(folder, model=fresh, optimizer=fresh_opt, key=OTHER_KEY)
    assert caught.value.check == "key"
    assert load_checkpoint(folder, model=fresh, optimizer=fresh_opt, key=KEY).step == 5
    assert torch.equal(fresh.weight, big.weight)

    member = folder / "optimizer.tladam"
    data = member.read_bytes()
    member.write_bytes(data[:-9] + bytes([data[-9] ^ 4]) + data[-8:])
    torch.nn.init.zeros_(fresh.bias)
    with pytest.raises(IntegrityError, match=r"optimizer\.tladam") as caught:
        load_checkpoint(folder, model=fresh, optimizer=fresh_opt, key=KEY)
    assert caught.value.check == "digest" and not fresh.bias.any()  # nothing live changed


def test_keys_of_other_lengths_are_refused_before_anything(tmp_path: Path) -> None:
    model, opt, _ = build(0)
    with pytest.raises(CheckpointError, match="key must be 32 bytes"):
        CheckpointManager(tmp_path / "run", key=KEY[:16])
    with pytest.raises(CheckpointError, match="key must be 32 bytes"):
        CheckpointManager(tmp_path / "run", key=KEY.hex())
    with pytest.raises(CheckpointError, match="key must be 32 bytes"):
        save_checkpoint(tmp_path / "set", model=model, key=KEY + b"!")
    assert not (tmp_path / "set").exists()
    folder = save_checkpoint(tmp_path / "set", model=model, optimizer=opt, key=KEY)
    with pytest.raises(CheckpointError, match="key must be 32 bytes"):  # not "no set verifies"
        load_checkpoint(folder, model=model, optimizer=opt, key=b"short")
