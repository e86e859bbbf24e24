"""``tlckpt ls`` and ``tlckpt verify`` on URLs: the endpoint from ``AWS_ENDPOINT_URL`` or
``--storage-options``; a set without its manifest and a damaged set are named as not
verified, and ``verify`` exits 1 on them."""

from __future__ import annotations

import json
import uuid

from remote_support import trained

from tlckpt import CheckpointManager
from tlckpt.cli import main
from tlckpt.codec.sets.remote_store import open_store


def test_ls_and_verify_on_s3(s3, monkeypatch, capsys) -> None:
    url = s3.root(f"cli-{uuid.uuid4().hex[:8]}")
    model, opt, _ = trained()
    manager = CheckpointManager(url, storage_options=s3.storage_options)
    manager.save(1, model=model, optimizer=opt)
    manager.save(2, model=model, optimizer=opt)
    store = open_store(url, s3.storage_options)
    store.put("step-00000000000000000003/model.tlsf32", b"a killed save's member")
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.url)  # botocore's own variable
    assert main(["ls", url]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{url}: 3 set(s)")
    assert out.count("verified (model.tlsf32") == 2
    assert "NOT VERIFIED: IntegrityError (present)" in out
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    options = json.dumps({"client_kwargs": {"endpoint_url": s3.url}})
    target = f"{url}/step-00000000000000000002"
    assert main(["verify", target, "--storage-options", options]) == 0
    assert f"{target}: ok (step 2" in capsys.readouterr().out
    assert main(["verify", f"{url}/step-00000000000000000003", "--storage-options", options]) == 1
    assert "never committed" in capsys.readouterr().err


def test_verify_names_a_damaged_member(capsys) -> None:
    url = f"memory://cli-{uuid.uuid4().hex[:8]}"
    model, opt, _ = trained()
    CheckpointManager(url).save(5, model=model, optimizer=opt)
    store = open_store(url)
    key = "step-00000000000000000005/optimizer.tladam"
    data = bytearray(store.read(key, 0, store.size(key)))
    data[100] ^= 0x40
    store.put(key, bytes(data))
    assert main(["verify", f"{url}/step-00000000000000000005"]) == 1
    err = capsys.readouterr().err
    assert "optimizer" in err and "digest" in err
    assert main(["verify", url, "--storage-options", "[1]"]) == 2
