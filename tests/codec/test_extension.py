"""Issue 2, item 4: a new format version is a spec plus a registration, nothing else.

A toy ``TLADAMF`` v6 — v5's fields plus one new u64 ``flags`` field with a default — is
declared here from ``tlckpt.formats`` pieces only, registered, and then written and read by
the unchanged codec functions (``write_adam``, ``read_adam``, ``inspect``).
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from construct import Default, Struct

from tlckpt import formats
from tlckpt.codec import (
    AdamConfig,
    AdamEntry,
    CheckpointError,
    MomentDtype,
    ParameterSchema,
    UnsupportedVersionError,
    inspect,
    read_adam,
    write_adam,
)
from tlckpt.testing.adam import adamw_config


def _v5_field(name: str) -> Any:
    (field,) = [sc for sc in formats.ADAM_V5.subcons if sc.name == name]
    return field


#: v6 (toy): v5 plus ``flags``, a u64 of feature bits between the counter and the schema.
ADAM_V6_TOY = Struct(
    *formats.framed(formats.ADAM_MAGIC, 6),
    *(_v5_field(n) for n in ("dtype_tag", "kind", "config", "counter_flag", "random_counter")),
    "flags" / Default(formats.U64, 0) * "feature bits (toy field new in v6)",
    *(_v5_field(n) for n in ("schema", "representatives", "entry_count", "entries")),
)

SCHEMA = ParameterSchema([(2, 2), (2, 2), (3,), ()], [True, True, False, True], [0, 0, None, 3])


def _state(dtype: MomentDtype) -> tuple[AdamConfig, dict[int, AdamEntry]]:
    config = adamw_config(dtype)
    entries = {
        slot: AdamEntry(
            7,
            np.linspace(-1, 1, SCHEMA.element_count(slot)).astype(dtype.numpy),
            np.full(SCHEMA.element_count(slot), 0.25, dtype.numpy),
        )
        for slot in SCHEMA.representative_slots
    }
    return config, entries


@pytest.fixture
def toy_v6() -> Iterator[Any]:
    assert formats.lookup(formats.ADAM_MAGIC, 6) is None, "v6 is real now: pick another toy version"
    spec = formats.register(formats.ADAM_MAGIC, 6, ADAM_V6_TOY)
    try:
        yield spec
    finally:
        formats.unregister(formats.ADAM_MAGIC, 6)
    assert formats.lookup(formats.ADAM_MAGIC, 6) is None


def test_toy_spec_is_registered(toy_v6: Any) -> None:
    assert toy_v6.version == 6 and toy_v6.family == "adam"
    assert formats.lookup(formats.ADAM_MAGIC, 6).struct is ADAM_V6_TOY
    assert formats.known_versions(formats.ADAM_MAGIC) == [2, 3, 4, 5, 6]
    assert formats.layout_of(ADAM_V6_TOY) == formats.layout_of(formats.ADAM_V5)


@pytest.mark.parametrize("dtype", list(MomentDtype), ids=lambda d: d.value)
@pytest.mark.parametrize("counter", [None, 2**64 - 1])
def test_write_and_read_toy_v6(toy_v6: Any, dtype: MomentDtype, counter: int | None) -> None:
    config, entries = _state(dtype)
    buffer = io.BytesIO()
    assert write_adam(buffer, SCHEMA, config, entries, counter, version=6) == 6
    data = buffer.getvalue()

    # Byte layout: v5's, with the 8 bytes of flags (= 0) before the schema block.
    v5 = io.BytesIO()
    assert write_adam(v5, SCHEMA, config, entries, counter, version=5) == 5
    head = 7 + 8 + 8 + 8 + 32 + 8 + (0 if counter is None else 8)
    assert data[:7] + data[15:head] == v5.getvalue()[:7] + v5.getvalue()[15:head]
    assert data[7:15] == (6).to_bytes(8, "little")
    assert data[head : head + 8] == bytes(8)
    assert data[head + 8 :] == v5.getvalue()[head:]

    ckpt = read_adam(io.BytesIO(data), SCHEMA, dtype=dtype, expected_config=config)
    assert ckpt.version == 6
    assert ckpt.fields == {"flags": 0}
    assert ckpt.random_counter == counter
    assert ckpt.config.same_bits(config)
    for slot, entry in entries.items():
        assert ckpt.entries[slot].step == entry.step
        assert ckpt.entries[slot].m.tobytes() == entry.m.tobytes()
        assert ckpt.entries[slot].v.tobytes() == entry.v.tobytes()

    described = inspect(io.BytesIO(data))
    assert described["version"] == 6
    assert described["fields"] == {"flags": 0}
    assert described["random_counter"] == counter


def _toy_file(flags: int) -> bytes:
    """A v6 file built by plain construct from the toy spec (v5's values plus ``flags``)."""
    config, entries = _state(MomentDtype.FLOAT32)
    buffer = io.BytesIO()
    write_adam(buffer, SCHEMA, config, entries, None, version=5)
    v5 = formats.ADAM_V5.parse(buffer.getvalue())
    values = {k: v for k, v in v5.items() if not k.startswith("_") and k != "version"}
    values["flags"] = flags
    return ADAM_V6_TOY.build(values)


def test_new_field_value_comes_back(toy_v6: Any) -> None:
    """A v6 file with flags = 5 (built by construct from the spec) reads back flags = 5."""
    data = _toy_file(5)
    ckpt = read_adam(io.BytesIO(data), SCHEMA)
    assert ckpt.version == 6
    assert ckpt.fields == {"flags": 5}
    assert inspect(io.BytesIO(data))["fields"] == {"flags": 5}


def test_selection_rule_ignores_the_toy(toy_v6: Any) -> None:
    """Registering v6 does not change which version FORMAT.md's rule picks."""
    for dtype, counter, want in [
        (MomentDtype.FLOAT64, None, 5),
        (MomentDtype.FLOAT32, 1, 4),
        (MomentDtype.FLOAT32, None, 3),
    ]:
        config, entries = _state(dtype)
        assert write_adam(io.BytesIO(), SCHEMA, config, entries, counter) == want


def test_unregistered_version_names_the_known_ones(toy_v6: Any) -> None:
    data = bytearray(_toy_file(0))
    data[7:15] = (7).to_bytes(8, "little")
    for call in (lambda src: read_adam(src, SCHEMA), inspect):
        with pytest.raises(UnsupportedVersionError) as info:
            call(io.BytesIO(bytes(data)))
        assert info.value.offset == 7
        assert info.value.actual == 7
        assert list(info.value.expected) == [2, 3, 4, 5, 6]
        assert "2, 3, 4, 5 or 6" in str(info.value)


def test_after_unregistering_v6_is_unknown_again() -> None:
    data = _toy_file(1)
    formats.register(formats.ADAM_MAGIC, 6, ADAM_V6_TOY)
    try:
        assert read_adam(io.BytesIO(data), SCHEMA).fields == {"flags": 1}
    finally:
        formats.unregister(formats.ADAM_MAGIC, 6)
    with pytest.raises(UnsupportedVersionError) as info:
        read_adam(io.BytesIO(data), SCHEMA)
    assert "2, 3, 4 or 5" in str(info.value)
    config, entries = _state(MomentDtype.FLOAT32)
    with pytest.raises(CheckpointError, match="6"):
        write_adam(io.BytesIO(), SCHEMA, config, entries, version=6)
