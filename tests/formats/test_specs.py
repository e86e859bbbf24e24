"""The declarative specs of ``tlckpt.formats`` on their own, with plain construct.

The construct specs are the single description of each layout: parsed and built by
construct's interpreted machinery (the slow reference path) they must agree with the
conformance vectors and with the streaming codec. Also: the registry, the capabilities each
version's fields imply (the exact-bits JSON encoding table of FORMAT.md §5 is in
``test_encodings.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from construct import Const, ConstructError, Struct

from tlckpt.codec import MomentDtype, read_adam, read_float32_state
from tlckpt.codec.errors import error_for_category
from tlckpt.formats import (
    ADAM_MAGIC,
    ADAM_V2,
    ADAM_V3,
    ADAM_V4,
    ADAM_V5,
    ADAM_VERSIONS,
    FLOAT32_STATE_MAGIC,
    FLOAT32_STATE_V1,
    FRAMING,
    U64,
    InvalidField,
    Valid,
    framed,
    known_versions,
    layout_of,
    lookup,
    register,
    unregister,
    unwrap,
)
from tlckpt.formats import registry as registry_module
from tlckpt.testing.vectors import (
    array_from_hex,
    bits_to_float,
    float_to_bits,
    hex_payload,
    schema_from_manifest,
)

# ------------------------------------------------------------------ adam specs vs vectors


def _tags(schema_entry: dict[str, Any]) -> list[int]:
    """The representatives block FORMAT.md §2 prescribes, computed here independently."""
    reps = schema_entry["representatives"]
    if reps is None:
        reps = [i if g else None for i, g in enumerate(schema_entry["requires_grad"])]
    return [0 if r is None else r + 1 for r in reps]


def _adam_values(vector: dict[str, Any]) -> dict[str, Any]:
    """The manifest's values, in the spec's field names, for ``Struct.build``."""
    cfg = vector["config"]
    shapes = vector["schema"]["shapes"]
    dtype = "<f8" if cfg["dtype"] == "float64" else "<f4"
    values: dict[str, Any] = {
        "kind": {"adam": 0, "adamw": 1}[cfg["kind"]],
        "config": {n: bits_to_float(cfg[f"{n}_bits"]) for n in _HYPER},
        "schema": {
            "slot_count": len(shapes),
            "slots": [
                {
                    "rank": len(shape),
                    "dims": shape,
                    "element_count": int(np.prod(shape, dtype=np.int64)),
                    "requires_grad": int(grad),
                }
                for shape, grad in zip(shapes, vector["schema"]["requires_grad"], strict=True)
            ],
        },
        "representatives": _tags(vector["schema"]),
        "entry_count": len(vector["entries"]),
        "entries": [
            {
                "id": e["id"],
                "step": e["step"],
                "count": len(bytes.fromhex(e["m"])) // np.dtype(dtype).itemsize,
                "m": array_from_hex(e["m"], dtype),
                "v": array_from_hex(e["v"], dtype),
            }
            for e in vector["entries"]
        ],
        "random_counter": vector["random_counter"],
        "dtype_tag": 1 if cfg["dtype"] == "float64" else 0,
        "counter_flag": 0 if vector["random_counter"] is None else 1,
    }
    return values


_HYPER = ("beta1", "beta2", "epsilon", "weight_decay")


@pytest.mark.vectors("adam")
def test_adam_spec_parses_vector(vector: dict[str, Any], vector_path: Path) -> None:
    data = vector_path.read_bytes()
    spec = ADAM_VERSIONS[vector["version"]]
    parsed = spec.parse(data)
    cfg = vector["config"]
    assert parsed.magic == ADAM_MAGIC
    assert parsed.version == vector["version"]
    assert parsed.kind == {"adam": 0, "adamw": 1}[cfg["kind"]]
    for name in _HYPER:
        assert f"0x{float_to_bits(parsed.config[name]):016x}" == cfg[f"{name}_bits"]
    if vector["version"] == 5:
        assert parsed.dtype_tag == (1 if cfg["dtype"] == "float64" else 0)
        assert parsed.counter_flag == (0 if vector["random_counter"] is None else 1)
    if vector["version"] >= 4:
        assert parsed.random_counter == vector["random_counter"]
    else:
        assert "random_counter" not in parsed
    shapes = vector["schema"]["shapes"]
    assert parsed.schema.slot_count == len(shapes)
    assert [list(s.dims) for s in parsed.schema.slots] == shapes
    assert [s.rank for s in parsed.schema.slots] == [len(s) for s in shapes]
    assert [bool(s.requires_grad) for s in parsed.schema.slots] == vector["schema"]["requires_grad"]
    if vector["version"] >= 3:
        assert list(parsed.representatives) == _tags(vector["schema"])
    assert parsed.entry_count == len(vector["entries"])
    for got, want in zip(parsed.entries, vector["entries"], strict=True):
        assert (got.id, got.step) == (want["id"], want["step"])
        assert hex_payload(got.m) == want["m"] and hex_payload(got.v) == want["v"]


@pytest.mark.vectors("adam")
def test_adam_spec_builds_vector(vector: dict[str, Any], vector_path: Path) -> None:
    spec = ADAM_VERSIONS[vector["version"]]
    assert spec.build(_adam_values(vector)) == vector_path.read_bytes()


@pytest.mark.vectors("adam")
def test_interpreted_spec_agrees_with_streaming_codec(
    vector: dict[str, Any], vector_path: Path
) -> None:
    reference = ADAM_VERSIONS[vector["version"]].parse(vector_path.read_bytes())
    ckpt = read_adam(
        vector_path,
        schema_from_manifest(vector["schema"]),
        dtype=MomentDtype(vector["config"]["dtype"]),
    )
    assert ckpt.version == reference.version
    assert int(ckpt.config.kind) == reference.kind
    for name in _HYPER:
        assert float_to_bits(getattr(ckpt.config, name)) == float_to_bits(reference.config[name])
    assert ckpt.random_counter == reference.get("random_counter")
    assert sorted(ckpt.entries) == sorted(e.id for e in reference.entries)
    for record in reference.entries:
        entry = ckpt.entries[record.id]
        assert entry.step == record.step
        assert entry.m.tobytes() == record.m.tobytes()
        assert entry.v.tobytes() == record.v.tobytes()


@pytest.mark.vectors("float32_state")
def test_float32_state_spec_parses_and_builds_vector(
    vector: dict[str, Any], vector_path: Path
) -> None:
    data = vector_path.read_bytes()
    parsed = FLOAT32_STATE_V1.parse(data)
    assert (parsed.magic, parsed.version) == (FLOAT32_STATE_MAGIC, 1)
    assert parsed.tensor_count == len(vector["shapes"])
    assert [list(t.dims) for t in parsed.tensors] == vector["shapes"]
    assert [hex_payload(t.payload) for t in parsed.tensors] == vector["payloads"]
    streamed = read_float32_state(vector_path, vector["shapes"])
    assert [a.tobytes() for a in streamed] == [t.payload.tobytes() for t in parsed.tensors]

    values = {
        "tensor_count": len(vector["shapes"]),
        "tensors": [
            {
                "rank": len(shape),
                "dims": shape,
                "element_count": int(np.prod(shape, dtype=np.int64)),
                "payload": array_from_hex(payload, "<f4"),
            }
            for shape, payload in zip(vector["shapes"], vector["payloads"], strict=True)
        ],
    }
    assert FLOAT32_STATE_V1.build(values) == data


#: Invalid vectors whose defect a spec's own field check (``Valid``) catches, with the
#: category the check carries.
_SPEC_LEVEL = {
    "bad_adam_kind_tag.tladam": "config",
    "bad_adam_requires_grad_flag.tladam": "schema",
    "bad_adam_elem_count.tladam": "schema",
    "bad_adam_v5_dtype_tag.tladam": "config",
    "bad_adam_v5_counter_flag.tladam": "config",
    "bad_state_elem_count.tlsf32": "schema",
}


@pytest.mark.parametrize("name", sorted(_SPEC_LEVEL))
def test_spec_checks_reject_malformed_vectors(name: str, vectors_dir: Path) -> None:
    data = (vectors_dir / name).read_bytes()
    header = FRAMING.parse(data)
    spec = lookup(header.magic, header.version)
    assert spec is not None
    with pytest.raises(InvalidField) as info:
        spec.struct.parse(data)
    assert info.value.category == _SPEC_LEVEL[name]
    assert error_for_category(info.value.category).__name__ in (
        "ConfigError",
        "SchemaMismatchError",
    )


def test_spec_rejects_wrong_magic_and_truncation(vectors_dir: Path) -> None:
    with pytest.raises(ConstructError):
        ADAM_V2.parse((vectors_dir / "bad_adam_magic.tladam").read_bytes())
    with pytest.raises(ConstructError):
        ADAM_V2.parse((vectors_dir / "bad_adam_truncated_payload.tladam").read_bytes())
    with pytest.raises(ConstructError):
        FLOAT32_STATE_V1.parse((vectors_dir / "bad_state_truncated.tlsf32").read_bytes())


def test_valid_builds_only_what_it_accepts() -> None:
    flag = Valid(U64, lambda v, _: v in (0, 1), expected="0 or 1", category="schema")
    assert flag.build(1) == b"\x01" + b"\x00" * 7
    with pytest.raises(InvalidField) as info:
        flag.build(2)
    assert (info.value.category, info.value.actual, info.value.expected) == ("schema", 2, "0 or 1")
    with pytest.raises(ValueError):
        Valid(U64, lambda v, _: True, expected="x", category="no such category")


# ---------------------------------------------------------------------- framing, registry


def test_framing_is_magic_then_u64_version() -> None:
    assert FRAMING.sizeof() == 15
    head = FRAMING.parse(b"TLADAMF" + (5).to_bytes(8, "little") + b"rest")
    assert (head.magic, head.version) == (b"TLADAMF", 5)
    fields = Struct(*framed(ADAM_MAGIC, 9))
    assert fields.build({}) == b"TLADAMF" + (9).to_bytes(8, "little")
    with pytest.raises(ValueError):
        framed(b"SHORT", 1)


@pytest.mark.parametrize("version", [2, 3, 4, 5])
def test_registry_maps_adam_versions(version: int) -> None:
    spec = lookup(ADAM_MAGIC, version)
    assert spec is not None
    assert spec.struct is ADAM_VERSIONS[version]
    assert (spec.family, spec.magic, spec.version) == ("adam", ADAM_MAGIC, version)
    # Each spec fixes its own framing.
    head = spec.struct.subcons[:2]
    assert [sc.name for sc in head] == ["magic", "version"]
    magic, fixed = (unwrap(sc) for sc in head)
    assert isinstance(magic, Const) and magic.value == ADAM_MAGIC
    assert isinstance(fixed, Const) and fixed.value == version


def test_registry_maps_float32_state_and_rejects_unknown_pairs() -> None:
    spec = lookup(FLOAT32_STATE_MAGIC, 1)
    assert spec is not None and spec.struct is FLOAT32_STATE_V1
    assert spec.family == "float32_state"
    assert known_versions(ADAM_MAGIC) == [2, 3, 4, 5]
    assert known_versions(FLOAT32_STATE_MAGIC) == [1]
    assert known_versions(b"NOTHING") == []
    for magic, version in [(ADAM_MAGIC, 1), (ADAM_MAGIC, 6), (FLOAT32_STATE_MAGIC, 2)]:
        assert lookup(magic, version) is None


def test_register_refuses_duplicates_and_unknown_families() -> None:
    with pytest.raises(ValueError):
        register(ADAM_MAGIC, 2, ADAM_V2)
    with pytest.raises(ValueError):
        register(b"TLTOYXX", 1, ADAM_V2)
    assert lookup(ADAM_MAGIC, 2).struct is ADAM_V2  # untouched by the refused call


def test_unregister_of_a_new_family_leaves_no_trace() -> None:
    """Registering a toy family and removing it again restores the family table."""
    before = dict(registry_module.FAMILIES)
    register(b"TLTOYXX", 1, Struct(*framed(b"TLTOYXX", 1)), family="toy")
    try:
        assert lookup(b"TLTOYXX", 1) is not None
    finally:
        unregister(b"TLTOYXX", 1)
        leaked = {m: f for m, f in registry_module.FAMILIES.items() if m not in before}
        for magic in leaked:  # keep the rest of the session clean whatever the outcome
            del registry_module.FAMILIES[magic]
    assert lookup(b"TLTOYXX", 1) is None
    assert known_versions(b"TLTOYXX") == []
    assert not leaked, f"unregister left {leaked} in registry.FAMILIES"


def test_layout_of_derives_capabilities_from_fields() -> None:
    v2, v3, v4, v5 = (layout_of(s) for s in (ADAM_V2, ADAM_V3, ADAM_V4, ADAM_V5))
    f32, both = frozenset({"<f4"}), frozenset({"<f4", "<f8"})
    assert (v2.moment_dtypes, v2.counter, v2.representatives) == (f32, "never", False)
    assert (v3.moment_dtypes, v3.counter, v3.representatives) == (f32, "never", True)
    assert (v4.moment_dtypes, v4.counter, v4.representatives) == (f32, "always", True)
    assert (v5.moment_dtypes, v5.counter, v5.representatives) == (both, "optional", True)
