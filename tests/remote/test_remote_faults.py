"""Injected failures during remote saves — on the Nth write (``faultmem://``, a memory
filesystem that fails on purpose), on the manifest's write, and in the middle of an S3
multipart upload (moto): the save raises, nothing is committed, no object or incomplete
upload of it remains, and the earlier set restores."""

from __future__ import annotations

import errno
import uuid

import pytest
import torch
from remote_support import FaultyMemory, fresh, objects, resumes_exactly, trained, uploads

from tlckpt import CheckpointManager
from tlckpt.codec.sets import remote_upload
from tlckpt.codec.sets.remote_upload import S3Upload

STEP_1 = "step-00000000000000000001/"


def _earlier_set_only(url: str, manager: CheckpointManager, options: dict | None = None) -> None:
    assert manager.steps() == [1]
    assert manager.latest() == 1
    assert all(key.startswith(STEP_1) for key in objects(url, options))
    assert len(objects(url, options)) == 4


@pytest.mark.parametrize("write_at", [1, 3, 8, 12])
def test_failure_on_the_nth_write(write_at: int) -> None:
    url = f"faultmem://nth-{uuid.uuid4().hex[:8]}"
    model, opt, counter = trained()
    manager = CheckpointManager(url)
    manager.save(1, model=model, optimizer=opt, random_counter=counter)
    train_more = trained(5)
    FaultyMemory.arm(write_at=write_at)
    try:
        with pytest.raises(OSError, match="injected failure at write"):
            manager.save(2, model=train_more[0], optimizer=train_more[1])
    finally:
        FaultyMemory.arm()
    _earlier_set_only(url, manager)
    restored = fresh()
    manager.restore(model=restored[0], optimizer=restored[1])
    resumes_exactly((model, opt), restored, counter)


def test_failure_writing_the_manifest() -> None:
    url = f"faultmem://manifest-{uuid.uuid4().hex[:8]}"
    model, opt, _ = trained()
    manager = CheckpointManager(url)
    manager.save(1, model=model, optimizer=opt)
    FaultyMemory.arm(manifest=True)
    try:
        with pytest.raises(OSError, match="injected failure writing the manifest"):
            manager.save(2, model=model, optimizer=opt)
        handle = manager.save(3, model=model, optimizer=opt, blocking=False)
        with pytest.raises(OSError, match="manifest"):
            handle.wait()
    finally:
        FaultyMemory.arm()
    _earlier_set_only(url, manager)


def test_failure_in_the_middle_of_a_multipart_upload(s3, monkeypatch) -> None:
    monkeypatch.setattr(remote_upload, "FIRST_PART", 5 << 20)
    url = s3.root(f"mpu-{uuid.uuid4().hex[:8]}")
    torch.manual_seed(2)
    small, big = torch.nn.Linear(4, 4), torch.nn.Linear(1024, 4 * 1024)
    manager = CheckpointManager(url, storage_options=s3.storage_options)
    manager.save(1, model=small)
    real_send = S3Upload._send_part

    def failing_send(self: S3Upload) -> None:
        if self.index == 2:  # two parts handed over (one may still be in flight)
            raise OSError(errno.ECONNRESET, "injected failure uploading part 3")
        real_send(self)

    monkeypatch.setattr(S3Upload, "_send_part", failing_send)
    with pytest.raises(OSError, match="injected failure uploading part 3"):
        manager.save(2, model=big)
    assert uploads(url, s3.storage_options) == []  # the multipart upload was aborted
    assert manager.steps() == [1]
    assert all(k.startswith(STEP_1) for k in objects(url, s3.storage_options))
    other = torch.nn.Linear(4, 4)
    manager.restore(model=other)
    assert torch.equal(other.weight, small.weight)
