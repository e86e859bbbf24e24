"""Checkpoint sets on object storage: bit-exact resume through ``s3://`` (moto),
``memory://`` and ``file://``; retention leaves exactly the kept sets' objects; the newest
set that verifies is found past damaged ones; the manifest is never written over."""

from __future__ import annotations

import uuid
import warnings

import pytest
import torch
from remote_support import fresh, objects, resumes_exactly, trained, uploads

from tlckpt import CheckpointManager, load_checkpoint, save_checkpoint, verify_checkpoint
from tlckpt.codec.errors import CheckpointError, IntegrityError
from tlckpt.codec.sets import remote_upload
from tlckpt.codec.sets.remote_leases import CLOCK_RESOLUTION, LEASE_FILE, Lease, lease_alive
from tlckpt.codec.sets.remote_store import open_store
from tlckpt.codec.sets.set_folders import SkippedCheckpointWarning

MEMBERS = ["manifest.json", "model.tlsf32", "optimizer.tladam", "training_state.json"]


@pytest.fixture(params=["s3", "memory", "file"])
def where(request, s3, tmp_path) -> tuple[str, dict | None]:
    """A fresh checkpoint directory URL on each store, and its storage options."""
    name = f"run-{uuid.uuid4().hex[:8]}"
    if request.param == "s3":
        return s3.root(name), s3.storage_options
    if request.param == "memory":
        return f"memory://{name}", None
    return f"file://{tmp_path / name}", None


def test_manager_resumes_bit_exactly(where) -> None:
    url, options = where
    model, opt, counter = trained()
    manager = CheckpointManager(url, storage_options=options)
    manager.save(3, model=model, optimizer=opt, random_counter=counter, extra={"epoch": 1})
    assert manager.steps() == [3] and manager.latest() == 3
    restored = fresh()
    result = CheckpointManager(url, storage_options=options).restore(
        model=restored[0], optimizer=restored[1]
    )
    assert (result.step, result.random_counter, result.extra) == (3, counter, {"epoch": 1})
    resumes_exactly((model, opt), restored, counter)


def test_save_load_verify_functions_take_urls(where) -> None:
    url, options = where
    model, opt, counter = trained()
    target = f"{url}/step-00000000000000000007"
    assert save_checkpoint(target, model=model, optimizer=opt, step=7, storage_options=options)
    assert verify_checkpoint(target, storage_options=options).step == 7
    restored = fresh()
    load_checkpoint(target, model=restored[0], optimizer=restored[1], storage_options=options)
    resumes_exactly((model, opt), restored, counter)
    with pytest.raises(FileExistsError):
        save_checkpoint(target, model=model, step=7, storage_options=options)


def test_keep_last_leaves_exactly_the_kept_sets(s3) -> None:
    url = s3.root(f"keep-{uuid.uuid4().hex[:8]}")
    model, opt, _ = trained()
    manager = CheckpointManager(url, keep_last=2, keep_every=10, storage_options=s3.storage_options)
    for step in (5, 10, 15, 20, 25):
        manager.save(step, model=model, optimizer=opt, blocking=step % 2 == 0)
    manager.wait()
    kept = [10, 20, 25]
    assert manager.steps() == kept
    expected = sorted(f"step-{s:020d}/{m}" for s in kept for m in MEMBERS)
    assert objects(url, s3.storage_options) == expected
    assert uploads(url, s3.storage_options) == []


def test_multipart_members_upload_and_restore(s3, monkeypatch) -> None:
    # 5 MiB parts (S3's least): a 12 MiB model member goes in three parts.
    monkeypatch.setattr(remote_upload, "FIRST_PART", 5 << 20)
    url = s3.root(f"big-{uuid.uuid4().hex[:8]}")
    torch.manual_seed(1)
    model = torch.nn.Linear(1024, 3 * 1024)
    manager = CheckpointManager(url, storage_options=s3.storage_options)
    manager.save(1, model=model)
    store = open_store(url, s3.storage_options)
    info = store.info("step-00000000000000000001/model.tlsf32")
    assert info["size"] > 12 << 20 and info["ETag"].strip('"').endswith("-3")  # 3 parts
    other = torch.nn.Linear(1024, 3 * 1024)
    manager.restore(model=other)
    assert torch.equal(other.weight, model.weight) and torch.equal(other.bias, model.bias)
    assert uploads(url, s3.storage_options) == []


def test_part_plan_fits_s3_limits() -> None:
    assert remote_upload.part_plan(48 << 20) == [(2, 32 << 20)]  # never one 48 MiB PUT
    assert sum(n for n, _ in remote_upload.part_plan(10 * 10**9)) == 299
    terabyte = remote_upload.part_plan(10**12)
    assert sum(n for n, _ in terabyte) <= remote_upload.MAX_PARTS
    assert all(5 << 20 <= size <= 5 << 30 for _, size in terabyte)
    five_tib = remote_upload.part_plan(5 << 40)
    assert sum(n for n, _ in five_tib) <= remote_upload.MAX_PARTS
    with pytest.raises(ValueError):
        remote_upload.part_size(remote_upload.MAX_PARTS)


def test_latest_falls_back_past_a_damaged_set() -> None:
    url = f"memory://damaged-{uuid.uuid4().hex[:8]}"
    model, opt, _ = trained()
    manager = CheckpointManager(url)
    manager.save(1, model=model, optimizer=opt)
    manager.save(2, model=model, optimizer=opt)
    store = open_store(url)
    key = "step-00000000000000000002/model.tlsf32"
    data = bytearray(store.read(key, 0, store.size(key)))
    data[-1] ^= 1
    store.put(key, bytes(data))
    with pytest.warns(SkippedCheckpointWarning, match="step 2 skipped.*digest"):
        assert manager.latest() == 1
    other, other_opt = fresh()
    with pytest.warns(SkippedCheckpointWarning):
        assert manager.restore(model=other, optimizer=other_opt).step == 1
    with pytest.raises(IntegrityError, match="digest"):
        verify_checkpoint(f"{url}/step-00000000000000000002")


def test_a_prefix_without_manifest_is_never_a_set() -> None:
    url = f"memory://uncommitted-{uuid.uuid4().hex[:8]}"
    model, opt, _ = trained()
    manager = CheckpointManager(url)
    manager.save(1, model=model, optimizer=opt)
    store = open_store(url)
    store.put("step-00000000000000000009/model.tlsf32", b"partial")
    assert manager.steps() == [1]
    with pytest.warns(SkippedCheckpointWarning, match="never committed"):
        assert manager.latest() == 1


def test_manifest_is_created_only_if_absent(s3) -> None:
    store = open_store(s3.root(f"cond-{uuid.uuid4().hex[:8]}"), s3.storage_options)
    store.create("step-00000000000000000001/manifest.json", b"{}")
    with pytest.raises(FileExistsError):  # S3 If-None-Match: * (moto honours it)
        store.create("step-00000000000000000001/manifest.json", b"{}")


def test_signed_sets_on_object_storage(s3) -> None:
    url = s3.root(f"signed-{uuid.uuid4().hex[:8]}")
    key = bytes(range(32))
    model, opt, counter = trained()
    CheckpointManager(url, key=key, storage_options=s3.storage_options).save(
        4, model=model, optimizer=opt
    )
    restored = fresh()
    CheckpointManager(url, key=key, storage_options=s3.storage_options).restore(
        model=restored[0], optimizer=restored[1]
    )
    resumes_exactly((model, opt), restored, counter)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SkippedCheckpointWarning)
        assert CheckpointManager(url, storage_options=s3.storage_options).latest() is None
    with pytest.raises(CheckpointError):
        verify_checkpoint(f"{url}/step-00000000000000000004", storage_options=s3.storage_options)


def test_a_lease_outlives_its_duration_by_the_store_clock_resolution() -> None:
    # S3 dates objects to the second: a lease judged by truncated dates alone could be
    # taken for dead up to a second before its duration has passed.
    # Judged at given store times (``now``), so no sleep can race the verdicts.
    store = open_store(f"memory://lease-{uuid.uuid4().hex[:8]}/step-00000000000000000001")
    lease = Lease(store, 0.5)
    lease.take()
    lease._stop.set()  # no more renewals: the save was killed
    written = store.modified(LEASE_FILE)
    assert lease_alive(store, written + 0.5 + 0.9 * CLOCK_RESOLUTION)
    assert not lease_alive(store, written + 0.5 + 1.1 * CLOCK_RESOLUTION)
