"""Conformance vectors of the binary families (``tests/vectors``), in both directions.

* every ``adam[]`` / ``float32_state[]`` file reads back exactly the manifest's values and bits,
  and writing the manifest's values gives exactly the file's bytes (path and file object);
* every ``invalid[]`` file of kind adam / float32_state raises exactly the class its category
  maps to, with the byte offset of the offending field;
* ``inspect`` describes every valid file and rejects every invalid one that is malformed in
  itself;
* no vector goes unexercised.

(Exact-bits JSON vectors are exercised by ``test_state_bits.py``.)
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tlckpt.codec import (
    CheckpointError,
    MomentDtype,
    UnsupportedFormatError,
    UnsupportedVersionError,
    inspect,
    is_float32_state,
    read_adam,
    read_float32_state,
    write_adam,
    write_float32_state,
)
from tlckpt.codec.errors import ERROR_OF_CATEGORY
from tlckpt.testing.vectors import (
    config_from_manifest,
    entries_from_manifest,
    float32_arrays_from_manifest,
    float_to_bits,
    hex_payload,
    schema_from_manifest,
)

BINARY_KINDS = ("adam", "float32_state")

#: Invalid files that are well-formed in themselves: only the destination the reader is given
#: rejects them (tied destination, another dtype / trainability / alias map / config / layout).
DESTINATION_DEPENDENT = frozenset(
    {
        "bad_adam_v2_into_tied.tladam",
        "bad_adam_v5_read_as_f32.tladam",
        "bad_adam_requires_grad_mismatch.tladam",
        "bad_adam_alias_mismatch.tladam",
        "bad_adam_config_mismatch.tladam",
        "bad_state_count.tlsf32",
        "bad_state_shape.tlsf32",
        "bad_state_rank.tlsf32",
    }
)


def _read_adam_vector(source: Any, vector: dict[str, Any]):
    return read_adam(
        source,
        schema_from_manifest(vector["schema"]),
        dtype=MomentDtype(vector["config"]["dtype"]),
    )


def _assert_adam_matches(ckpt: Any, vector: dict[str, Any]) -> None:
    cfg = vector["config"]
    assert ckpt.version == vector["version"]
    assert ckpt.config.kind.name.lower() == cfg["kind"]
    assert ckpt.config.dtype.value == cfg["dtype"]
    for name in ("beta1", "beta2", "epsilon", "weight_decay"):
        assert f"0x{float_to_bits(getattr(ckpt.config, name)):016x}" == cfg[f"{name}_bits"], name
    assert ckpt.random_counter == vector["random_counter"]
    assert type(ckpt.random_counter) is type(vector["random_counter"])
    want = {e["id"]: e for e in vector["entries"]}
    assert sorted(ckpt.entries) == sorted(want)
    dtype = MomentDtype(cfg["dtype"]).numpy
    for slot, entry in ckpt.entries.items():
        assert entry.step == want[slot]["step"]
        for name in ("m", "v"):
            array = getattr(entry, name)
            assert array.dtype == dtype
            assert hex_payload(array) == want[slot][name], (slot, name)


# ------------------------------------------------------------------------------ adam, read


@pytest.mark.vectors("adam")
def test_read_adam_vector(vector: dict[str, Any], vector_path: Path) -> None:
    _assert_adam_matches(_read_adam_vector(vector_path, vector), vector)


@pytest.mark.vectors("adam")
def test_read_adam_vector_from_file_objects(vector: dict[str, Any], vector_path: Path) -> None:
    data = vector_path.read_bytes()
    _assert_adam_matches(_read_adam_vector(io.BytesIO(data), vector), vector)
    with open(vector_path, "rb") as f:
        _assert_adam_matches(_read_adam_vector(f, vector), vector)
    # A file object is read from its position: a checkpoint at the end of a larger stream.
    embedded = io.BytesIO(b"\x00prefix" + data)
    embedded.seek(7)
    _assert_adam_matches(_read_adam_vector(embedded, vector), vector)


@pytest.mark.vectors("adam")
def test_read_adam_vector_returns_stored_schema(vector: dict[str, Any], vector_path: Path) -> None:
    expected = schema_from_manifest(vector["schema"])
    stored = _read_adam_vector(vector_path, vector).schema
    assert stored.shapes == expected.shapes
    assert stored.requires_grad == expected.requires_grad
    assert [stored.representative(i) for i in range(len(stored))] == [
        expected.representative(i) for i in range(len(expected))
    ]


@pytest.mark.vectors("adam")
def test_read_adam_vector_with_its_own_config_bound(
    vector: dict[str, Any], vector_path: Path
) -> None:
    ckpt = read_adam(
        vector_path,
        schema_from_manifest(vector["schema"]),
        dtype=MomentDtype(vector["config"]["dtype"]),
        expected_config=config_from_manifest(vector["config"]),
    )
    _assert_adam_matches(ckpt, vector)


# ----------------------------------------------------------------------------- adam, write


def _write_adam_vector(target: Any, vector: dict[str, Any]) -> int:
    return write_adam(
        target,
        schema_from_manifest(vector["schema"]),
        config_from_manifest(vector["config"]),
        entries_from_manifest(vector),
        vector["random_counter"],
    )


@pytest.mark.vectors("adam")
def test_write_adam_vector_to_path(
    vector: dict[str, Any], vector_path: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out.tladam"
    assert _write_adam_vector(out, vector) == vector["version"]
    assert out.read_bytes() == vector_path.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.tladam"]


@pytest.mark.vectors("adam")
def test_write_adam_vector_to_file_object(vector: dict[str, Any], vector_path: Path) -> None:
    buffer = io.BytesIO()
    assert _write_adam_vector(buffer, vector) == vector["version"]
    assert buffer.getvalue() == vector_path.read_bytes()


# --------------------------------------------------------------------------- float32 state


def _assert_float32_matches(arrays: list[Any], vector: dict[str, Any]) -> None:
    assert len(arrays) == len(vector["shapes"])
    for array, shape, payload in zip(arrays, vector["shapes"], vector["payloads"], strict=True):
        assert isinstance(array, np.ndarray)
        assert array.dtype == np.dtype("<f4")
        assert array.shape == tuple(shape)
        assert hex_payload(array) == payload


@pytest.mark.vectors("float32_state")
def test_read_float32_state_vector(vector: dict[str, Any], vector_path: Path) -> None:
    _assert_float32_matches(read_float32_state(vector_path, vector["shapes"]), vector)
    data = vector_path.read_bytes()
    _assert_float32_matches(read_float32_state(io.BytesIO(data), vector["shapes"]), vector)
    assert is_float32_state(vector_path)


@pytest.mark.vectors("float32_state")
def test_write_float32_state_vector(
    vector: dict[str, Any], vector_path: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out.tlsf32"
    write_float32_state(out, float32_arrays_from_manifest(vector))
    assert out.read_bytes() == vector_path.read_bytes()
    buffer = io.BytesIO()
    write_float32_state(buffer, float32_arrays_from_manifest(vector))
    assert buffer.getvalue() == vector_path.read_bytes()
    # Streamed from a generator with the count given up front: same bytes.
    buffer = io.BytesIO()
    arrays = float32_arrays_from_manifest(vector)
    write_float32_state(buffer, iter(arrays), count=len(arrays))
    assert buffer.getvalue() == vector_path.read_bytes()


# --------------------------------------------------------------------------------- invalid


def _read_invalid(source: Any, vector: dict[str, Any]) -> Any:
    if vector["kind"] == "float32_state":
        return read_float32_state(source, vector["shapes"])
    expected = vector.get("expected_config")
    return read_adam(
        source,
        schema_from_manifest(vector["schema"]),
        dtype=MomentDtype(vector["dtype"]),
        expected_config=None if expected is None else config_from_manifest(expected),
    )


@pytest.mark.vectors("invalid", kind=BINARY_KINDS)
def test_invalid_binary_vector_raises_its_category(
    vector: dict[str, Any], vector_path: Path
) -> None:
    expected = ERROR_OF_CATEGORY[vector["category"]]
    size = vector_path.stat().st_size
    with pytest.raises(CheckpointError) as by_path:
        _read_invalid(vector_path, vector)
    exc = by_path.value
    assert type(exc) is expected, f"{vector['note']}: {exc!r}"
    assert isinstance(exc.offset, int) and 0 <= exc.offset <= size, exc.offset
    assert exc.path == str(vector_path)
    assert str(vector_path) in str(exc)

    # The same file through a file object: same class, same offset.
    with pytest.raises(CheckpointError) as by_file:
        _read_invalid(io.BytesIO(vector_path.read_bytes()), vector)
    assert type(by_file.value) is expected
    assert by_file.value.offset == exc.offset


@pytest.mark.vectors("invalid", kind=BINARY_KINDS)
def test_inspect_invalid_binary_vector(vector: dict[str, Any], vector_path: Path) -> None:
    if vector["file"] in DESTINATION_DEPENDENT:
        # Well-formed in itself: inspect (which has no destination) describes it.
        described = inspect(vector_path)
        assert described["family"] == vector["kind"]
        return
    with pytest.raises(CheckpointError) as info:
        inspect(vector_path)
    category = vector["category"]
    if category in ("version", "truncated", "trailing"):
        assert type(info.value) is ERROR_OF_CATEGORY[category], repr(info.value)
    elif category == "family":
        # A foreign magic; if it is another family's, that family's version rule applies.
        assert type(info.value) in (UnsupportedFormatError, UnsupportedVersionError)


def test_inspect_foreign_magic_names_file_and_offset(vectors_dir: Path) -> None:
    """API.md: messages name the file; binary errors carry the offset (here the magic's)."""
    path = vectors_dir / "bad_adam_magic.tladam"
    with pytest.raises(UnsupportedFormatError) as info:
        inspect(path)
    assert info.value.offset == 0
    assert info.value.path == str(path)


def test_destination_dependent_vectors_are_invalid_vectors(manifest: dict[str, Any]) -> None:
    names = {e["file"] for e in manifest["invalid"] if e["kind"] in BINARY_KINDS}
    assert names >= DESTINATION_DEPENDENT


# --------------------------------------------------------------------------------- inspect


@pytest.mark.vectors("adam")
def test_inspect_adam_vector(vector: dict[str, Any], vector_path: Path) -> None:
    described = inspect(vector_path)
    cfg = vector["config"]
    schema = schema_from_manifest(vector["schema"])
    assert described["family"] == "adam"
    assert described["version"] == vector["version"]
    assert described["kind"] == cfg["kind"]
    assert described["moment_dtype"] == cfg["dtype"]
    assert described["random_counter"] == vector["random_counter"]
    for name in ("beta1", "beta2", "epsilon", "weight_decay"):
        assert described["config"][name]["bits"] == cfg[f"{name}_bits"]
    assert [tuple(s["shape"]) for s in described["slots"]] == [tuple(s) for s in schema.shapes]
    assert [s["trainable"] for s in described["slots"]] == list(schema.requires_grad)
    assert [s["representative"] for s in described["slots"]] == [
        schema.representative(i) for i in range(len(schema))
    ]
    assert described["has_aliases"] == schema.has_aliases
    assert [(e["id"], e["step"]) for e in described["entries"]] == [
        (e["id"], e["step"]) for e in sorted(vector["entries"], key=lambda e: e["id"])
    ]
    assert described["bytes"] == vector_path.stat().st_size


@pytest.mark.vectors("float32_state")
def test_inspect_float32_state_vector(vector: dict[str, Any], vector_path: Path) -> None:
    described = inspect(vector_path)
    assert described["family"] == "float32_state"
    assert described["version"] == 1
    assert [t["shape"] for t in described["tensors"]] == vector["shapes"]
    assert described["bytes"] == vector_path.stat().st_size
    # The same through a file object.
    assert inspect(io.BytesIO(vector_path.read_bytes()))["tensors"] == described["tensors"]


# -------------------------------------------------------------------------------- coverage

#: Test functions of this module each vector must go through.
_REQUIRED = {
    "adam": {
        "test_read_adam_vector",
        "test_read_adam_vector_from_file_objects",
        "test_write_adam_vector_to_path",
        "test_write_adam_vector_to_file_object",
        "test_inspect_adam_vector",
    },
    "float32_state": {
        "test_read_float32_state_vector",
        "test_write_float32_state_vector",
        "test_inspect_float32_state_vector",
    },
    "invalid": {
        "test_invalid_binary_vector_raises_its_category",
        "test_inspect_invalid_binary_vector",
    },
}


def test_every_vector_is_exercised(
    manifest: dict[str, Any],
    vectors_dir: Path,
    vector_usage: dict[str, set[str]],
    request: pytest.FixtureRequest,
) -> None:
    listed = [e["file"] for section in manifest.values() for e in section]
    on_disk = {p.name for p in vectors_dir.iterdir()} - {"manifest.json", "README.md"}
    assert len(listed) == len(set(listed)), "a file is listed twice"
    assert set(listed) == on_disk, "every file in tests/vectors must be in the manifest"

    module = request.node.nodeid.split("::")[0]
    exercised = 0
    for section, required in _REQUIRED.items():
        entries = manifest[section]
        if section == "invalid":
            entries = [e for e in entries if e["kind"] in BINARY_KINDS]
        for entry in entries:
            here = {
                nodeid.split("::")[1]
                for nodeid in vector_usage.get(entry["file"], ())
                if nodeid.split("::")[0] == module
            }
            missing = required - here
            assert not missing, f"{entry['file']} is not exercised by {sorted(missing)}"
            exercised += 1
    counts = {s: len(manifest[s]) for s in ("adam", "float32_state")}
    counts["invalid"] = sum(e["kind"] in BINARY_KINDS for e in manifest["invalid"])
    assert exercised == sum(counts.values()), counts

    # The exact-bits JSON vectors belong to test_state_bits.py (another owner). Where that
    # module was collected in this run, every one of its vectors must have been used there.
    json_files = [e["file"] for e in manifest["state_bits"]] + [
        e["file"] for e in manifest["invalid"] if e["kind"] == "state_bits"
    ]
    assert len(json_files) + exercised == len(listed)
    state_bits_module = Path(__file__).parent / "model_state" / "test_state_bits.py"
    assert state_bits_module.is_file(), "exact-bits JSON vectors have no test module"
    json_module = module.rsplit("/", 1)[0] + "/test_state_bits.py"
    used = [
        f for f in json_files if any(n.startswith(json_module) for n in vector_usage.get(f, ()))
    ]
    if used:
        assert used == json_files, "some exact-bits JSON vectors are not exercised"
    else:
        text = state_bits_module.read_text()
        assert 'vectors("state_bits")' in text
        assert 'vectors("invalid", kind="state_bits")' in text
