"""Signed checkpoint sets (``key=``): members digested with keyed BLAKE3 as they stream, the
manifest authenticated by a MAC over its exact bytes; every way of forging one without the
key is refused with ``IntegrityError``, and a signed set without its key with
``KeyRequiredError`` (numpy only: the sets are written with the codec's writers).
"""

from __future__ import annotations

import json
import os
import pickle
import warnings
from pathlib import Path

import blake3
import numpy as np
import orjson
import pytest
import xxhash

from tlckpt.codec import (
    CheckpointError,
    IntegrityError,
    KeyRequiredError,
    read_key_file,
    verify_checkpoint,
    write_float32_state,
)
from tlckpt.codec.sets.checkpoint_set import VerifiedSet, latest_verified
from tlckpt.codec.sets.set_commit import SetWriter
from tlckpt.codec.sets.set_digests import PARALLEL_DIGEST_BYTES
from tlckpt.codec.sets.set_document_writing import build_training_state
from tlckpt.codec.sets.set_folders import SkippedCheckpointWarning, committed_steps
from tlckpt.codec.sets.set_keys import SetKey, as_key
from tlckpt.formats.checkpoint_set import (
    KEY_ID_CONTEXT,
    MANIFEST_KEY_CONTEXT,
    MEMBER_KEY_CONTEXT,
    folder_name,
)

KEY = bytes(range(32))
OTHER_KEY = bytes(range(1, 33))


def _write_set(folder: Path, step: int, key: bytes | None, seed: int = 0, n: int = 300) -> Path:
    """A set of a float32 model of two tensors (the first ``n`` values), signed with
    ``key`` when given."""
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal(n, dtype=np.float32), rng.standard_normal(7, dtype=np.float32)]
    with SetWriter(folder, step, key=key) as writer:
        with writer.member("model", "model.tlsf32", 1, "float32_state") as f:
            write_float32_state(f, arrays)
        with writer.member("training_state", "training_state.json", 1, "training_state") as f:
            f.write(build_training_state(step, 5, None, None, None, {"seed": seed}))
        return writer.commit([("w", (n,)), ("b", (7,))])


def _manifest(folder: Path) -> dict:
    return orjson.loads((folder / "manifest.json").read_bytes())


def _resign_without_key(folder: Path, edit) -> None:
    """What a forger without the key can do: edit the manifest's document and write it back
    the way the writer lays it out, the MAC left as it was."""
    data = (folder / "manifest.json").read_bytes()
    document = orjson.loads(data)
    mac = document.pop("mac")
    edit(document)
    body = orjson.dumps(document)[:-1]
    (folder / "manifest.json").write_bytes(body + b',"mac":"' + mac.encode() + b'"}')


def _flip_last_byte(path: Path) -> bytes:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x40
    path.write_bytes(bytes(data))
    return bytes(data)


# --------------------------------------------------------------------------- round trip


def test_signed_round_trip_and_the_layout(tmp_path: Path) -> None:
    folder = _write_set(tmp_path / "set", 4, KEY)
    manifest = verify_checkpoint(folder, key=KEY)
    assert manifest.step == 4 and manifest.key_id is not None

    # Every value checked against BLAKE3 itself, as docs/format.md specifies them.
    member_key = blake3.blake3(KEY, derive_key_context=MEMBER_KEY_CONTEXT).digest()
    manifest_key = blake3.blake3(KEY, derive_key_context=MANIFEST_KEY_CONTEXT).digest()
    key_id = blake3.blake3(KEY, derive_key_context=KEY_ID_CONTEXT).hexdigest()[:16]
    document = _manifest(folder)
    assert document["digest"] == "blake3_keyed" and document["key_id"] == key_id
    assert list(document)[-1] == "mac" and "self_digest" not in document
    for role, record in document["members"].items():
        data = (folder / record["file"]).read_bytes()
        assert record["digest"] == blake3.blake3(data, key=member_key).hexdigest(), role
    data = (folder / "manifest.json").read_bytes()
    suffix = b',"mac":"' + document["mac"].encode() + b'"}'
    assert data.endswith(suffix)
    assert document["mac"] == blake3.blake3(data[: -len(suffix)], key=manifest_key).hexdigest()
    # The unsigned set of the same members is as before: xxh3_128 digests and self_digest.
    plain = _write_set(tmp_path / "plain", 4, None)
    assert _manifest(plain)["digest"] == "xxh3_128"
    assert verify_checkpoint(plain).key_id is None


def test_large_writes_are_hashed_with_the_key_beside_the_write(tmp_path: Path) -> None:
    n = PARALLEL_DIGEST_BYTES  # a 4 MiB tensor: hashed on the digest thread, keyed
    folder = _write_set(tmp_path / "set", 1, KEY, n=n)
    member_key = blake3.blake3(KEY, derive_key_context=MEMBER_KEY_CONTEXT).digest()
    data = (folder / "model.tlsf32").read_bytes()
    assert _manifest(folder)["members"]["model"]["digest"] == (
        blake3.blake3(data, key=member_key).hexdigest()
    )
    with VerifiedSet.open(folder, streaming=True, key=KEY) as verified:  # streamed reads
        verified.file("model").read()
        verified.finish_digests()
    _flip_last_byte(folder / "model.tlsf32")
    with (
        pytest.raises(IntegrityError) as caught,
        VerifiedSet.open(folder, streaming=True, key=KEY) as verified,
    ):
        verified.file("model").read(1000)
        verified.finish_digests()
    assert caught.value.check == "digest" and "edited without the key" in str(caught.value)


# --------------------------------------------------------------------------- forgeries


def test_a_member_edited_with_its_digests_recomputed_is_refused(tmp_path: Path) -> None:
    folder = _write_set(tmp_path / "set", 2, KEY)
    member = folder / "model.tlsf32"
    data = _flip_last_byte(member)
    # The manifest left alone: the keyed digest differs.
    with pytest.raises(IntegrityError) as caught:
        verify_checkpoint(folder, key=KEY)
    assert caught.value.check == "digest" and caught.value.field == "members.model"

    # The digest recomputed as BLAKE3 without the key (the only BLAKE3 a forger has): the
    # manifest's MAC no longer matches.
    def unkeyed(d: dict) -> None:
        d["members"]["model"]["digest"] = blake3.blake3(data).hexdigest()

    _resign_without_key(folder, unkeyed)
    with pytest.raises(IntegrityError) as caught:
        verify_checkpoint(folder, key=KEY)
    assert caught.value.check == "mac"

    # Turned into an unsigned set, xxh3_128 digests and self_digest recomputed: it verifies
    # without a key (anyone could have written it), and never with one.
    document = _manifest(folder)
    for record in document["members"].values():
        record["digest"] = xxhash.xxh3_128((folder / record["file"]).read_bytes()).hexdigest()
    document["digest"] = "xxh3_128"
    del document["key_id"], document["mac"]
    document["self_digest"] = xxhash.xxh3_128(orjson.dumps(document)).hexdigest()
    (folder / "manifest.json").write_bytes(orjson.dumps(document))
    assert verify_checkpoint(folder).key_id is None
    with pytest.raises(IntegrityError) as caught:
        verify_checkpoint(folder, key=KEY)
    assert caught.value.check == "signed" and not isinstance(caught.value, KeyRequiredError)


@pytest.mark.parametrize(
    "edit",
    [
        pytest.param(lambda d: d.__setitem__("step", 3), id="step"),
        pytest.param(lambda d: d["members"]["model"].__setitem__("size", 1), id="size"),
        pytest.param(lambda d: d["members"]["model"].__setitem__("version", 2), id="version"),
        pytest.param(lambda d: d.__setitem__("library", "tlckpt 9"), id="library"),
        pytest.param(lambda d: d["state"][0].__setitem__(0, "v"), id="tensor-name"),
        pytest.param(lambda d: d.__setitem__("world_size", 2), id="world-size"),
        pytest.param(lambda d: d["members"].pop("model") and None, id="member-dropped"),
        pytest.param(lambda d: d.__setitem__("key_id", "0" * 16), id="key-id"),
    ],
)
def test_an_edited_manifest_is_refused(tmp_path: Path, edit) -> None:
    folder = _write_set(tmp_path / "set", 2, KEY)
    _resign_without_key(folder, edit)
    with pytest.raises(IntegrityError) as caught:
        verify_checkpoint(folder, key=KEY)
    assert caught.value.check in ("mac", "key")


def test_a_manifest_rewritten_or_extended_is_refused(tmp_path: Path) -> None:
    folder = _write_set(tmp_path / "set", 2, KEY)
    path = folder / "manifest.json"
    data = path.read_bytes()
    for forged in (
        json.dumps(orjson.loads(data)).encode(),  # the same document, other spacing
        data[:-1] + b',"x":1}',  # a member after the MAC
        data + b"\n",
        b" " + data,
        data.replace(b'"step":2', b'"step":2.0'),
    ):
        path.write_bytes(forged)
        with pytest.raises(IntegrityError) as caught:
            verify_checkpoint(folder, key=KEY)
        assert caught.value.check == "mac"


def test_a_member_from_another_set_of_the_same_key_is_refused(tmp_path: Path) -> None:
    first = _write_set(tmp_path / folder_name(1), 1, KEY, seed=1)
    second = _write_set(tmp_path / folder_name(2), 2, KEY, seed=2)
    # A member copied over: authentic bytes, but not this set's (the manifest binds each
    # member's digest to its role in this set).
    for file in ("model.tlsf32", "training_state.json"):
        original = (second / file).read_bytes()
        (second / file).write_bytes((first / file).read_bytes())
        with pytest.raises(IntegrityError) as caught:
            verify_checkpoint(second, key=KEY)
        assert caught.value.check in ("size", "digest"), file
        (second / file).write_bytes(original)
    verify_checkpoint(second, key=KEY)
    # The whole manifest copied: authentic, but of step 1 in the folder of step 2.
    (second / "manifest.json").write_bytes((first / "manifest.json").read_bytes())
    with pytest.raises(IntegrityError) as caught:
        verify_checkpoint(second, key=KEY)
    assert caught.value.check in ("step", "size", "digest")
    (second / "model.tlsf32").write_bytes((first / "model.tlsf32").read_bytes())
    (second / "training_state.json").write_bytes((first / "training_state.json").read_bytes())
    with pytest.raises(IntegrityError) as caught:  # every member too: still step 1's set
        verify_checkpoint(second, key=KEY)
    assert caught.value.check == "step"


def test_random_mutations_of_a_signed_manifest_are_refused(tmp_path: Path) -> None:
    folder = _write_set(tmp_path / "set", 2, KEY)
    path = folder / "manifest.json"
    source = path.read_bytes()
    rng = np.random.default_rng(7)
    for _ in range(300):
        data = bytearray(source)
        pos = int(rng.integers(len(data)))
        if rng.random() < 0.7:
            data[pos] = (data[pos] + int(rng.integers(1, 256))) % 256
        else:
            del data[pos : pos + int(rng.integers(1, 8))]
        path.write_bytes(bytes(data))
        # Any change: refused, as a forgery when it is still a signed manifest's shape.
        with pytest.raises(CheckpointError):
            verify_checkpoint(folder, key=KEY)


# --------------------------------------------------------------------------- keys


def test_wrong_key_missing_key_and_unsigned_set(tmp_path: Path) -> None:
    signed = _write_set(tmp_path / "signed", 1, KEY)
    plain = _write_set(tmp_path / "plain", 1, None)
    with pytest.raises(IntegrityError) as caught:
        verify_checkpoint(signed, key=OTHER_KEY)
    assert caught.value.check == "key"
    assert SetKey(OTHER_KEY).key_id in str(caught.value)
    with pytest.raises(KeyRequiredError, match="cannot be authenticated without the key") as c:
        verify_checkpoint(signed)
    assert isinstance(c.value, IntegrityError) and c.value.check == "key required"
    with pytest.raises(IntegrityError, match="not signed") as caught:
        verify_checkpoint(plain, key=KEY)
    assert caught.value.check == "signed"
    assert verify_checkpoint(signed, key=bytearray(KEY)).step == 1
    assert verify_checkpoint(signed, key=memoryview(KEY)).step == 1
    assert verify_checkpoint(signed, key=memoryview(KEY).cast("B", (4, 8))).step == 1
    doubled = bytes(b for b in KEY for _ in range(2))
    assert verify_checkpoint(signed, key=memoryview(doubled)[::2]).step == 1  # strided


def test_latest_with_a_key_passes_over_sets_that_do_not_authenticate(tmp_path: Path) -> None:
    _write_set(tmp_path / folder_name(1), 1, KEY)
    _write_set(tmp_path / folder_name(2), 2, KEY)
    _write_set(tmp_path / folder_name(3), 3, None)  # unsigned, newer
    forged = _write_set(tmp_path / folder_name(4), 4, OTHER_KEY)  # another key
    assert committed_steps(tmp_path) == [1, 2, 3, 4]
    _resign_without_key(tmp_path / folder_name(2), lambda d: d.__setitem__("library", "x"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert latest_verified(tmp_path, key=KEY) == 1
    skipped = [str(w.message) for w in caught if w.category is SkippedCheckpointWarning]
    assert len(skipped) == 3
    assert "step 4" in skipped[0] and "check: key" in skipped[0]
    assert "step 3" in skipped[1] and "check: signed" in skipped[1]
    assert "step 2" in skipped[2] and "check: mac" in skipped[2]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert latest_verified(tmp_path) == 3  # without a key: the unsigned set only
    assert any("check: key required" in str(w.message) for w in caught)
    assert forged.exists()


@pytest.mark.parametrize(
    "key",
    [b"", b"x" * 31, b"x" * 33, "00" * 32, 5, list(KEY), np.zeros(8, dtype=np.float32)],
    ids=["empty", "31", "33", "hex-str", "int", "list", "float-array"],
)
def test_keys_that_are_not_32_bytes_are_refused(tmp_path: Path, key) -> None:
    with pytest.raises(CheckpointError, match="key must be 32 bytes") as caught:
        _write_set(tmp_path / "set", 1, key)
    assert caught.value.field == "key"
    assert not (tmp_path / "set").exists() and os.listdir(tmp_path) == []
    plain = _write_set(tmp_path / "plain", 1, None)
    with pytest.raises(CheckpointError, match="key must be 32 bytes"):
        verify_checkpoint(plain, key=key)


def test_a_key_is_never_shown_nor_pickled() -> None:
    key = as_key(KEY)
    assert as_key(key) is key and as_key(None) is None
    for text in (repr(key), str(key)):
        assert KEY.hex() not in text and key.key_id in text
    with pytest.raises(TypeError, match="not pickled"):
        pickle.dumps(key)
    secret = b"s3cr3t-" * 4 + b"1234"  # 32 bytes, 4 short of the 36 below
    with pytest.raises(CheckpointError) as caught:
        as_key(secret + b"abcd")
    assert b"s3cr3t".decode() not in str(caught.value) and "36" in str(caught.value)


# --------------------------------------------------------------------------- key files


@pytest.mark.parametrize(
    "content",
    [KEY, KEY.hex().encode(), KEY.hex().encode() + b"\n", KEY.hex().upper().encode()],
    ids=["raw", "hex", "hex-newline", "HEX"],
)
def test_key_files(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "key"
    path.write_bytes(content)
    assert read_key_file(path) == KEY
    assert read_key_file(str(path)) == KEY


@pytest.mark.parametrize(
    "content",
    [
        b"",
        KEY[:31],
        KEY + b"\n",  # 33 raw bytes: a newline is for the hex form only
        KEY.hex().encode()[:63],
        KEY.hex().encode() + b"\n\n",
        KEY.hex().encode() + b"\r\n",
        b"g" * 64,
        b" " + KEY.hex().encode(),
        b"0" * 100_000,
    ],
    ids=["empty", "31", "33", "63-hex", "2-newlines", "crlf", "not-hex", "space", "huge"],
)
def test_key_files_of_other_forms_are_refused(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "key"
    path.write_bytes(content)
    with pytest.raises(CheckpointError, match="32 raw bytes, or 64 hex digits") as caught:
        read_key_file(path)
    assert KEY.hex() not in str(caught.value)


def test_key_files_that_are_not_regular_files_are_refused(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(CheckpointError, match="not a regular file"):
        read_key_file(fifo)  # opened without blocking: refused, not waited on
    with pytest.raises(CheckpointError, match="not a regular file"):
        read_key_file(tmp_path)
    with pytest.raises(FileNotFoundError):
        read_key_file(tmp_path / "missing")
