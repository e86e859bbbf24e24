"""A checkpoint set's documents and folder protocol, at the codec level (no torch).

* exact values: every value a training state may hold round-trips to equal bits and types;
  what JSON cannot hold is refused by path; hostile tagged values are refused;
* the manifest and the training-state document: built ones parse; every missing, unknown,
  ill-typed or doubled key, wrong format tag or version, oversize document is the right
  ``CheckpointError``; random byte mutations raise nothing else;
* the writer: digests are of the bytes in order (large buffers hashed beside the write
  too), a failed set leaves no folder, an existing step is refused;
* the digesting reader: whatever a load reads, skips, re-reads or reads out of order, the
  digest is of the whole file in order, and every read returns the file's bytes.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import struct
from pathlib import Path

import numpy as np
import orjson
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from tlckpt.codec import (
    CheckpointError,
    FileTooLargeError,
    IntegrityError,
    MalformedError,
    UnsupportedFormatError,
    UnsupportedVersionError,
    verify_checkpoint,
)
from tlckpt.codec.sets.exact_values import TensorScalar, decode_value, encode_value
from tlckpt.codec.sets.set_commit import SetWriter, clean_leftovers
from tlckpt.codec.sets.set_digests import GAP_BYTES, PARALLEL_DIGEST_BYTES, DigestingReader
from tlckpt.codec.sets.set_document_writing import build_manifest, build_training_state
from tlckpt.codec.sets.set_documents import MemberRecord, parse_manifest, parse_training_state
from tlckpt.codec.sets.set_folders import committed_steps
from tlckpt.formats.checkpoint_set import (
    MANIFEST_KEYS,
    MEMBER_KEYS,
    TRAINING_STATE_KEYS,
    folder_name,
)

LIMIT = 1 << 20


def _bits(x: float) -> int:
    return struct.unpack("<Q", struct.pack("<d", x))[0]


def same(a, b) -> bool:
    """Equal values of equal types, floats bit for bit."""
    if type(a) is not type(b):
        return False
    if type(a) is float:
        return _bits(a) == _bits(b)
    if type(a) in (list, tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if type(a) is dict:
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    return a == b


floats = st.integers(0, 2**64 - 1).map(lambda n: struct.unpack("<d", struct.pack("<Q", n))[0])
keys = st.one_of(st.text(max_size=6), st.integers(-5, 5), st.just("$float"))
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    floats,
    st.text(max_size=8),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.lists(inner, max_size=4).map(tuple),
        st.dictionaries(keys, inner, max_size=4),
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(values)
def test_exact_values_round_trip(value) -> None:
    data = orjson.dumps(encode_value(value, ("extra",)))
    assert same(decode_value(orjson.loads(data), ("extra",)), value)


def test_tensor_scalars_and_refusals() -> None:
    scalar = TensorScalar("float32", 0.5)
    assert decode_value(orjson.loads(orjson.dumps(encode_value(scalar, ()))), ()) == scalar
    with pytest.raises(CheckpointError, match=r"extra\.a\[0\] is a builtins\.bytes"):
        encode_value({"a": [b"x"]}, ("extra",))
    with pytest.raises(CheckpointError, match="numpy"):
        encode_value(np.float64(1.0), ("extra",))
    deep: list = []
    for _ in range(100):
        deep = [deep]
    with pytest.raises(CheckpointError, match="nested"):
        encode_value(deep, ("extra",))


@pytest.mark.parametrize(
    "document",
    [
        {"$float": "0x3ff0000000000000"},  # finite: must be written plainly
        {"$float": "inf"},
        {"$int": "5"},  # fits JSON: must be written plainly
        {"$int": "1" * 5000},
        {"$tuple": 3},
        {"$dict": [[[1], 2]]},  # a list cannot be a key
        {"$dict": [[1, 2], [1, 3]]},
        {"$dict": [[1]]},
        {"$tensor": ["float32", "x"]},
        {"$tensor": ["Float!", 1.0]},
        {"$what": 1},
        {"$float": "0x7ff0000000000000", "other": 1},
    ],
)
def test_malformed_tagged_values_are_refused(document) -> None:
    with pytest.raises(MalformedError):
        decode_value(document, ("extra",))


def _manifest() -> bytes:
    members = {
        "model": MemberRecord("model.tlsf32", "float32_state", 1, 120, "0" * 32),
        "optimizer": MemberRecord("optimizer.tladam", "adam", 3, 300, "a" * 32),
        "training_state": MemberRecord("training_state.json", "training_state", 1, 90, "b" * 32),
    }
    return build_manifest(7, "tlckpt test", members, [("w", (3, 4)), ("b", (3,))], 1)


#: Random states of the forms the generators produce (the document's values are checked whole).
_NUMPY = {
    "bit_generator": "MT19937",
    "state": {"key": [1 << 31] + [7] * 623, "pos": 3},
    "has_gauss": 0,
    "gauss": 0.0,
}
_RANDOM = (3, (1 << 31, *[5] * 623, 624), None)


def _training_state() -> bytes:
    rng = {"torch": b"\x01\x02", "cuda": [], "numpy": _NUMPY, "random": _RANDOM}
    return build_training_state(
        7, 5, {"last_epoch": 7, "best": math.inf}, [{"lr": 0.1, "betas": (0.9, 0.99)}], rng, None
    )


def test_built_documents_parse() -> None:
    manifest = parse_manifest(_manifest(), LIMIT)
    assert manifest.step == 7 and manifest.state == (("w", (3, 4)), ("b", (3,)))
    assert manifest.members["optimizer"].version == 3
    state = parse_training_state(_training_state(), LIMIT)
    assert state.scheduler["best"] == math.inf and state.param_groups[0]["betas"] == (0.9, 0.99)
    assert state.rng["random"] == _RANDOM and state.rng["torch"] == b"\x01\x02"
    assert state.rng["numpy"] == _NUMPY


def _edited(data: bytes, edit) -> bytes:
    document = orjson.loads(data)
    edit(document)
    return json.dumps(document).encode()  # the stdlib writes integers of any size


@pytest.mark.parametrize(
    ("build", "parse", "key"),
    [pytest.param(_manifest, parse_manifest, k, id=f"manifest-{k}") for k in MANIFEST_KEYS]
    + [
        pytest.param(_training_state, parse_training_state, k, id=f"training_state-{k}")
        for k in TRAINING_STATE_KEYS
    ],
)
def test_missing_keys(build, parse, key: str) -> None:
    data = _edited(build(), lambda d: d.pop(key))
    expected = {"format": UnsupportedFormatError, "version": UnsupportedVersionError}
    with pytest.raises(expected.get(key, MalformedError)):
        parse(data, LIMIT)


def test_manifest_own_digest_catches_edits_that_stay_well_formed() -> None:
    for edit in (
        lambda d: d["state"][0].__setitem__(0, "v"),  # a tensor's name
        lambda d: d["members"]["optimizer"].__setitem__("version", 4),
        lambda d: d.__setitem__("library", "tlckpt 9"),
    ):
        with pytest.raises(IntegrityError) as caught:
            parse_manifest(_edited(_manifest(), edit), LIMIT)
        assert caught.value.check == "manifest digest" and caught.value.field == "self_digest"
    # The digest is of the content, not of the layout: other JSON spacing is the same manifest.
    assert parse_manifest(_edited(_manifest(), lambda d: None), LIMIT).step == 7
    with pytest.raises(MalformedError, match="self_digest"):
        parse_manifest(_edited(_manifest(), lambda d: d.__setitem__("self_digest", 5)), LIMIT)


@pytest.mark.parametrize("key", MEMBER_KEYS)
def test_manifest_member_keys(key: str) -> None:
    with pytest.raises(MalformedError, match=key):
        parse_manifest(_edited(_manifest(), lambda d: d["members"]["model"].pop(key)), LIMIT)
    bad = {"file": "x.bin", "family": "Bad Family", "version": -1, "size": "1", "digest": "Z"}
    edit = lambda d: d["members"]["model"].__setitem__(key, bad[key])  # noqa: E731
    with pytest.raises(MalformedError):
        parse_manifest(_edited(_manifest(), edit), LIMIT)


@pytest.mark.parametrize(
    "edit",
    [
        lambda d: d.__setitem__("version", True),
        lambda d: d.__setitem__("step", -1),
        lambda d: d.__setitem__("step", 2**64),
        lambda d: d.__setitem__("digest", "sha256"),
        lambda d: d.__setitem__("state", [["w", [3, -4]]]),
        lambda d: d.__setitem__("state", [["w", [1] * 65]]),
        lambda d: d["members"].pop("model"),
        lambda d: d["members"].__setitem__("weights", d["members"]["model"]),
        lambda d: d.__setitem__("world_size", 0),
        lambda d: d.__setitem__("extra_key", 1),
    ],
)
def test_manifest_field_rules(edit) -> None:
    with pytest.raises(CheckpointError):
        parse_manifest(_edited(_manifest(), edit), LIMIT)


def test_duplicate_keys_and_bounds() -> None:
    data = _manifest()
    doubled = data.replace(b'"step":7', b'"step":7,"step":8')
    with pytest.raises(MalformedError, match="'step' twice"):
        parse_manifest(doubled, LIMIT)
    nested = data.replace(b'"size":120', b'"size":120,"\\u0073ize":121')
    with pytest.raises(MalformedError, match="'size' twice"):
        parse_manifest(nested, LIMIT)
    with pytest.raises(FileTooLargeError):
        parse_manifest(data + b" " * LIMIT, LIMIT)
    state = _training_state().replace(b'"step":7', b'"step":7,"step":7')
    with pytest.raises(MalformedError, match="twice"):
        parse_training_state(state, LIMIT)


def test_random_mutations_raise_checkpoint_errors_only() -> None:
    rng = random.Random(5)
    for source, parse in ((_manifest(), parse_manifest), (_training_state(), parse_training_state)):
        for _ in range(1500):
            data = bytearray(source)
            for _ in range(rng.randint(1, 3)):
                op = rng.random()
                pos = rng.randrange(len(data))
                if op < 0.5:
                    data[pos] = rng.randrange(256)
                elif op < 0.75:
                    del data[pos : pos + rng.randint(1, 8)]
                else:
                    data[pos:pos] = rng.choice([b"{", b"[", b'"$int":', b"1e999", b",", b"-"])
            with contextlib.suppress(CheckpointError):  # anything else fails the test
                parse(bytes(data), LIMIT)


# --------------------------------------------------------------------------- the writer


def test_digests_are_of_the_bytes_in_order(tmp_path: Path) -> None:
    payload = np.arange(1000, dtype=np.float32).reshape(10, 100)
    with SetWriter(tmp_path / folder_name(3), 3) as writer:
        with writer.member("model", "model.tlsf32", 1, "float32_state") as f:
            f.write(b"head")
            f.write(payload.data)  # a 2-D float view, as the codec's writers pass them
            f.write(memoryview(b"tail"))
        with writer.member("training_state", "training_state.json", 1, "training_state") as f:
            f.write(_training_state().replace(b'"step":7', b'"step":3'))
        folder = writer.commit([("w", (10, 100))])
    data = (folder / "model.tlsf32").read_bytes()
    assert data == b"head" + payload.tobytes() + b"tail"
    record = orjson.loads((folder / "manifest.json").read_bytes())["members"]["model"]
    assert record["digest"] == xxhash.xxh3_128(data).hexdigest()
    assert record["size"] == len(data)
    assert committed_steps(tmp_path) == [3]
    with pytest.raises(CheckpointError):  # not a TLSF32B file: the structure check says so
        verify_checkpoint(folder)


def test_a_failed_set_leaves_nothing_and_steps_are_not_overwritten(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError), SetWriter(tmp_path / folder_name(1), 1) as writer:
        with writer.member("model", "model.tlsf32") as f:
            f.write(b"partial")
        raise RuntimeError("the caller failed midway")
    assert os.listdir(tmp_path) == []
    (tmp_path / folder_name(2)).mkdir()
    with pytest.raises(FileExistsError):
        SetWriter(tmp_path / folder_name(2), 2).__enter__()
    assert clean_leftovers(tmp_path) == []
    with pytest.raises(IntegrityError, match="never committed"):
        verify_checkpoint(tmp_path / folder_name(2))


def test_large_buffers_are_hashed_in_order_beside_the_write(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    pieces = [rng.bytes(n) for n in (PARALLEL_DIGEST_BYTES + 3, 10, 2 * PARALLEL_DIGEST_BYTES)]
    with SetWriter(tmp_path / folder_name(1), 1) as writer:
        with writer.member("model", "model.tlsf32", 1, "float32_state") as f:
            for piece in pieces:
                assert f.write(np.frombuffer(piece, np.uint8)) == len(piece)
        record = writer.records()["model"]
    data = b"".join(pieces)
    assert record.digest == xxhash.xxh3_128(data).hexdigest() and record.size == len(data)


# --------------------------------------------------------------------------- the reader

_SIZE = 3 * GAP_BYTES + 1000
_positions = st.one_of(
    st.integers(0, _SIZE + 10), st.sampled_from([0, GAP_BYTES, 2 * GAP_BYTES + 1, _SIZE])
)
_reads = st.lists(
    st.tuples(
        st.one_of(st.none(), _positions),  # None: read on from where the last read ended
        st.integers(0, 2 * GAP_BYTES),
        st.booleans(),  # readinto or read
    ),
    max_size=12,
)


@settings(max_examples=150, deadline=None)
@given(_reads)
def test_streamed_digest_is_of_the_whole_file_whatever_the_reads(tmp_path_factory, reads) -> None:
    path = tmp_path_factory.mktemp("reader") / "member"
    data = np.random.default_rng(len(reads)).bytes(_SIZE)
    path.write_bytes(data)
    with open(path, "rb") as f:
        reader = DigestingReader(f)
        for where, size, into in reads:
            start = reader.tell() if where is None else reader.seek(where)
            if into:
                buffer = bytearray(size)
                got = bytes(buffer[: reader.readinto(buffer)])
            else:
                got = reader.read(size)
            assert got == data[start : start + size]
            assert reader.tell() == start + len(got)
        assert reader.finish() == (xxhash.xxh3_128(data).hexdigest(), len(data))


def test_a_front_to_back_load_is_hashed_as_it_reads(tmp_path: Path) -> None:
    """Headers are read, payloads skipped (a checking pass); then the payloads are read
    with the headers between them skipped: every byte went into the hash during the
    second pass, so finishing reads nothing more."""
    data = np.random.default_rng(2).bytes(4 * (16 + 5 * GAP_BYTES))
    path = tmp_path / "member"
    path.write_bytes(data)
    record = 16 + 5 * GAP_BYTES
    with open(path, "rb") as f:
        reader = DigestingReader(f)
        for k in range(4):  # the checking pass
            reader.seek(k * record)
            reader.read(16)
        for k in range(4):  # the payload pass
            reader.seek(k * record + 16)
            reader.readinto(bytearray(5 * GAP_BYTES))
        assert reader.hashed == len(data)
        assert reader.finish()[0] == xxhash.xxh3_128(data).hexdigest()


@pytest.mark.parametrize("head", [0, 100], ids=["from-the-start", "after-a-header"])
def test_a_large_read_is_hashed_by_the_digest_thread_as_it_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, head: int
) -> None:
    """A read of at least PIPELINED_READ_BYTES that extends the hashed prefix is read in
    chunks, each hashed while the next is read: the same bytes and digest, nothing left
    for finish, the handle's position after the bytes read."""
    from tlckpt.codec.sets import set_digests

    monkeypatch.setattr(set_digests, "HASH_CHUNK", 1000)  # many chunks from a small file
    monkeypatch.setattr(set_digests, "PIPELINED_READ_BYTES", 2000)
    data = np.random.default_rng(3).bytes(head + 7_531)
    path = tmp_path / "member"
    path.write_bytes(data)
    with open(path, "rb") as f:
        reader = DigestingReader(f)
        assert reader.read(head) == data[:head]
        buffer = bytearray(len(data) - head)
        assert reader.readinto(buffer) == len(buffer)
        assert bytes(buffer) == data[head:]
        assert reader.hashed == len(data) and reader.tell() == len(data) == f.tell()
        assert reader.finish() == (xxhash.xxh3_128(data).hexdigest(), len(data))
