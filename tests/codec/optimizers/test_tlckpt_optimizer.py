"""tlckpt's own optimizer family (``TLCKOPT``): round trips, the rules each field is held to,
and the writer's refusals.

Round trips draw states from :func:`tlckpt.testing.strategies.optimizer_states` (groups of
every value torch accepts, any slot-to-group assignment, any subset of slots with state,
moments of all four dtypes as raw words) and check the bytes against a layout computed here
from the format's description, the values bit for bit, construct's own parse of the spec, the
fast and interpreted paths against each other, and ``inspect``.
"""

from __future__ import annotations

import dataclasses
import io
import struct
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tlckpt.codec import (
    AdamEntry,
    AdamKind,
    CheckpointError,
    ConfigError,
    EntryError,
    MomentDtype,
    OptimizerEntry,
    ParameterSchema,
    ParamGroupConfig,
    SchemaMismatchError,
    TruncatedError,
    UnsupportedFormatError,
    inspect,
    read_adam,
    read_optimizer_state,
    scan_optimizer_state,
    write_adam,
    write_optimizer_state,
)
from tlckpt.codec.families import family_named
from tlckpt.codec.spec.plan import interpreted
from tlckpt.codec.values.destinations import AdamTarget, OptimizerTarget
from tlckpt.formats import ADAM_MAGIC, OPTIMIZER_MAGIC, OPTIMIZER_V1, known_versions
from tlckpt.formats import adam as adam_spec
from tlckpt.formats import tlckpt_optimizer as spec
from tlckpt.testing.adam import adamw_config
from tlckpt.testing.strategies import OptimizerState, optimizer_states
from tlckpt.testing.vectors import float_to_bits

ROUND_TRIPS = 150
_SETTINGS = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow]}
_ITEMSIZE = {"float32": 4, "float64": 8, "bfloat16": 2, "float16": 2}


def expected_size(state: OptimizerState) -> int:
    """The byte size of the family's layout, from its description (no padding anywhere)."""
    n = 7 + 8 + 8 + (8 if state.random_counter is not None else 0)  # framing, counter
    n += 8 + len(state.groups) * (8 + 5 * 8 + 2 * 8)  # groups: kind, 5 floats, 2 flags
    n += 8 + sum(8 + 8 * len(s) + 8 + 8 for s in state.schema.shapes)  # schema block
    n += 2 * 8 * len(state.schema)  # representatives, slot_groups
    n += 8  # entry_count
    for slot, e in state.entries.items():
        moments = 3 if state.groups[state.slot_groups[slot]].amsgrad else 2
        n += 4 * 8 + moments * state.schema.element_count(slot) * _ITEMSIZE[e.dtype]
    return n


def _write(state: OptimizerState) -> bytes:
    buffer = io.BytesIO()
    version = write_optimizer_state(
        buffer, state.schema, state.groups, state.slot_groups, state.entries, state.random_counter
    )
    assert version == 1
    return buffer.getvalue()


def _read(state: OptimizerState, data: bytes, **overrides: Any):
    expect = {
        "groups": state.groups,
        "slot_groups": state.slot_groups,
        "dtypes": state.dtypes,
        **overrides,
    }
    return read_optimizer_state(io.BytesIO(data), state.schema, **expect)


def _assert_same(ckpt: Any, state: OptimizerState) -> None:
    assert ckpt.version == 1
    assert ckpt.random_counter == state.random_counter
    assert ckpt.slot_groups == state.slot_groups
    assert len(ckpt.groups) == len(state.groups)
    for got, want in zip(ckpt.groups, state.groups):
        assert got.same_bits(want)
        assert float_to_bits(got.lr) == float_to_bits(want.lr)
    assert sorted(ckpt.entries) == sorted(state.entries)
    for slot, want in state.entries.items():
        got = ckpt.entries[slot]
        assert (got.step, got.dtype) == (want.step, want.dtype)
        for name in ("m", "v", "max_exp_avg_sq"):
            a, b = getattr(got, name), getattr(want, name)
            assert (a is None) == (b is None), (slot, name)
            if a is not None:
                assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), (slot, name)


@settings(max_examples=ROUND_TRIPS, **_SETTINGS)
@given(optimizer_states())
def test_round_trip(state: OptimizerState) -> None:
    data = _write(state)
    assert data[:7] == OPTIMIZER_MAGIC
    assert len(data) == expected_size(state)
    _assert_same(_read(state, data), state)

    with interpreted():  # construct's field-by-field path: the same bytes, the same state
        assert _write(state) == data
        _assert_same(_read(state, data), state)

    reference = OPTIMIZER_V1.parse(data)  # construct alone, from the spec
    assert reference.get("random_counter") == state.random_counter
    assert [r.id for r in reference.entries] == sorted(state.entries)
    for record in reference.entries:
        want = state.entries[record.id]
        assert record.m.tobytes() == want.m.tobytes()
        assert (record.max_exp_avg_sq is None) == (want.max_exp_avg_sq is None)

    scanned = scan_optimizer_state(io.BytesIO(data))
    stored, schema = scanned.schema, state.schema  # the alias map is always stored
    assert (stored.shapes, stored.requires_grad) == (schema.shapes, schema.requires_grad)
    assert [stored.representative(i) for i in range(len(stored))] == [
        schema.representative(i) for i in range(len(schema))
    ]
    described = inspect(io.BytesIO(data))
    assert (described["family"], described["magic"], described["version"]) == (
        "tlckpt_optimizer",
        "TLCKOPT",
        1,
    )
    assert [s["group"] for s in described["slots"]] == list(state.slot_groups)
    assert [(e["id"], e["dtype"]) for e in described["entries"]] == [
        (i, e.dtype) for i, e in sorted(state.entries.items())
    ]
    for shown, group in zip(described["groups"], state.groups):
        assert shown["lr"]["bits"] == f"0x{float_to_bits(group.lr):016x}"
        assert (shown["amsgrad"], shown["maximize"]) == (group.amsgrad, group.maximize)


@settings(max_examples=60, **_SETTINGS)
@given(state=optimizer_states(), data=st.data())
def test_fast_and_interpreted_paths_agree_on_a_mutated_byte(
    state: OptimizerState, data: st.DataObject
) -> None:
    blob = bytearray(_write(state))
    at = data.draw(st.integers(0, len(blob) - 1))
    blob[at] ^= data.draw(st.integers(1, 255))

    def outcome() -> Any:
        try:
            ckpt = _read(state, bytes(blob))
        except CheckpointError as exc:
            return (type(exc), exc.offset, exc.field, str(exc))
        return (ckpt.groups, ckpt.slot_groups, sorted(ckpt.entries))

    fast = outcome()
    with interpreted():
        assert outcome() == fast


# ------------------------------------------------------------------------------ a sample

GROUPS = (
    ParamGroupConfig(AdamKind.ADAMW, 0.9, 0.999, 1e-8, 0.01, 1e-3),
    ParamGroupConfig(AdamKind.ADAMW, 0.9, 0.999, 1e-8, 0.0, 1e-3, amsgrad=True),
)
SCHEMA = ParameterSchema(
    [(2, 3), (2, 3), (4,), (), (5,), (2,)],
    [True, True, False, True, True, True],
    [0, 0, None, 3, 4, 5],
)
SLOT_GROUPS = (0, None, None, 1, 1, 0)


def _sample(counter: int | None = 9) -> tuple[OptimizerState, bytes]:
    entries = {
        0: OptimizerEntry(3, "bfloat16", np.arange(6, dtype="<u2"), np.ones(6, "<u2")),
        3: OptimizerEntry(2, "float32", *(np.full(1, x, "<f4") for x in (1.0, 2.0, 3.0))),
        4: OptimizerEntry(2, "float16", *(np.full(5, x, "<f2") for x in (1.0, 2.0, 3.0))),
    }  # slot 5 trainable, no state
    state = OptimizerState(SCHEMA, GROUPS, SLOT_GROUPS, entries, counter)
    return state, _write(state)


def _offsets(data: bytes) -> dict[str, int]:
    """Where the sample's fields start, walked from the format's description."""
    at = {"counter_flag": 15, "group_count": 31}
    at["groups"] = 39
    at["group1.weight_decay"] = 39 + 64 + 8 + 3 * 8
    at["group1.lr"] = at["group1.weight_decay"] + 8
    pos = 39 + 2 * 64
    at["slot_count"] = pos
    pos += 8 + sum(8 + 8 * len(s) + 8 + 8 for s in SCHEMA.shapes)
    at["representatives"] = pos
    at["slot_groups"] = pos + 8 * len(SCHEMA)
    at["entry_count"] = at["slot_groups"] + 8 * len(SCHEMA)
    at["entry0"] = at["entry_count"] + 8
    at["entry1"] = at["entry0"] + 32 + 2 * 6 * 2
    return at


CONFIG = adamw_config()


def _adam_entries(schema: ParameterSchema) -> dict[int, AdamEntry]:
    return {
        i: AdamEntry(
            1, np.zeros(schema.element_count(i), "<f4"), np.ones(schema.element_count(i), "<f4")
        )
        for i in schema.representative_slots
    }


def _patch(data: bytes, offset: int, value: int) -> bytes:
    return data[:offset] + struct.pack("<Q", value) + data[offset + 8 :]


def test_sample_layout_is_what_the_description_says() -> None:
    state, data = _sample()
    at = _offsets(data)
    assert struct.unpack_from("<QQ", data, at["counter_flag"]) == (1, 9)
    assert struct.unpack_from("<Q", data, at["group_count"]) == (2,)
    assert struct.unpack_from("<d", data, at["group1.weight_decay"]) == (0.0,)
    assert struct.unpack_from("<Q", data, at["slot_count"]) == (6,)
    assert struct.unpack_from("<6Q", data, at["slot_groups"]) == (1, 0, 0, 2, 2, 1)
    assert struct.unpack_from("<5Q", data, at["entry_count"]) == (3, 0, 3, 2, 6)  # id step tag
    assert len(data) == expected_size(state)


def test_lr_is_stored_and_never_compared() -> None:
    state, data = _sample()
    other = (GROUPS[0], dataclasses.replace(GROUPS[1], lr=0.5))
    ckpt = _read(state, data, groups=other)
    assert ckpt.groups[1].lr == 1e-3  # the file's, for the record


@pytest.mark.parametrize(
    "field, value",
    [("beta1", float(np.nextafter(0.9, 1.0))), ("epsilon", 1e-7), ("weight_decay", 0.01)],
)
def test_a_group_that_differs_in_one_value(field: str, value: float) -> None:
    state, data = _sample()
    other = (GROUPS[0], dataclasses.replace(GROUPS[1], **{field: value}))
    with pytest.raises(ConfigError, match=f"param group 1: {field}") as info:
        _read(state, data, groups=other)
    start = 39 + 64 + 8
    assert info.value.offset == start + 8 * spec.GROUP_FLOATS.index(field)
    assert info.value.field == f"groups[1].{field}"


def test_amsgrad_or_maximize_that_differ() -> None:
    state, data = _sample()
    for name in ("amsgrad", "maximize"):
        flipped = dataclasses.replace(GROUPS[1], **{name: not getattr(GROUPS[1], name)})
        with pytest.raises(ConfigError, match=name):
            _read(state, data, groups=(GROUPS[0], flipped))


def test_group_count_that_differs() -> None:
    state, data = _sample()
    with pytest.raises(ConfigError, match="2 param group") as info:
        _read(state, data, groups=GROUPS[:1])
    assert info.value.offset == 31


def test_slot_groups_that_differ_or_are_wrong() -> None:
    state, data = _sample()
    at = _offsets(data)["slot_groups"]
    with pytest.raises(SchemaMismatchError, match="slot 3: param group 1 in the file, 0") as info:
        _read(state, data, slot_groups=(0, None, None, 0, 1, 0))
    assert info.value.offset == at + 3 * 8
    for slot, tag, match in [
        (0, 0, "trainable"),
        (0, 3, "trainable"),
        (2, 1, "frozen"),
        (1, 1, "alias"),
    ]:
        bad = _patch(data, at + 8 * slot, tag)
        for read in (lambda d: _read(state, d), lambda d: scan_optimizer_state(io.BytesIO(d))):
            with pytest.raises(SchemaMismatchError, match=match) as info:
                read(bad)
            assert info.value.offset == at + 8 * slot


def test_entries_must_increase_and_own_a_group() -> None:
    state, data = _sample()
    at = _offsets(data)
    with pytest.raises(EntryError, match="0 repeats entry id 0") as info:
        _read(state, _patch(data, at["entry1"], 0))
    assert info.value.offset == at["entry1"]
    entry2 = at["entry1"] + 32 + 3 * 4  # slot 3: one float32 element, three moments
    with pytest.raises(EntryError, match="0 comes after entry id 3") as info:
        _read(state, _patch(data, entry2, 0))
    assert info.value.offset == entry2
    for slot in (1, 2, 6, 2**64 - 1):  # an alias, frozen, out of range
        with pytest.raises(EntryError, match="a slot with a param group"):
            _read(state, _patch(data, at["entry0"], slot))
    with pytest.raises(EntryError, match=">= 1"):
        _read(state, _patch(data, at["entry0"] + 8, 0))
    with pytest.raises(EntryError, match="entry_count is 5"):
        _read(state, _patch(data, at["entry_count"], 5))


def test_entry_dtype_and_count() -> None:
    state, data = _sample()
    at = _offsets(data)["entry0"]
    with pytest.raises(ConfigError, match="moments are float16 in the file, bfloat16") as info:
        _read(state, _patch(data, at + 16, 3))  # same size: only the destination tells
    assert info.value.offset == at + 16
    assert _read(state, _patch(data, at + 16, 3), dtypes=None).entries[0].dtype == "float16"
    with pytest.raises(ConfigError, match="dtype_tag"):
        _read(state, _patch(data, at + 16, 4))
    with pytest.raises(EntryError, match="has 7 elements, the slot has 6"):
        _read(state, _patch(data, at + 24, 7))


def test_amsgrad_flag_decides_max_exp_avg_sq() -> None:
    """Turning a group's amsgrad off leaves its entries' third moments as stray bytes."""
    _, data = _sample()
    flag = 39 + 64 + 8 + 5 * 8
    assert struct.unpack_from("<Q", data, flag) == (1,)
    with pytest.raises(CheckpointError):
        scan_optimizer_state(io.BytesIO(_patch(data, flag, 0)))
    with pytest.raises(ConfigError, match="0 or 1"):
        scan_optimizer_state(io.BytesIO(_patch(data, flag, 2)))


def test_hyperparameters_torch_refuses_are_refused() -> None:
    _, data = _sample()
    at = _offsets(data)["group1.lr"]
    for bits in (0x7FF8000000000000, 0xBFF0000000000000):  # NaN, -1.0
        with pytest.raises(ConfigError, match=">= 0") as info:
            scan_optimizer_state(io.BytesIO(_patch(data, at, bits)))
        assert info.value.offset == at


def test_truncated_everywhere() -> None:
    _, data = _sample()
    for cut in range(len(data)):
        with pytest.raises(TruncatedError):
            scan_optimizer_state(io.BytesIO(data[:cut]))


def test_families_do_not_mistake_each_other() -> None:
    _, data = _sample()
    with pytest.raises(UnsupportedFormatError, match="TLADAMF"):
        read_adam(io.BytesIO(data), SCHEMA)
    adam = io.BytesIO()
    write_adam(adam, SCHEMA, CONFIG, _adam_entries(SCHEMA))
    with pytest.raises(UnsupportedFormatError, match="TLCKOPT"):
        read_optimizer_state(io.BytesIO(adam.getvalue()), SCHEMA)
    assert OPTIMIZER_MAGIC != ADAM_MAGIC and known_versions(OPTIMIZER_MAGIC) == [1, 2]


def test_schema_blocks_are_torchleans_under_the_same_paths() -> None:
    """The shared schema check dispatches on TLADAMF's paths: they are the family's too."""
    assert spec.SCHEMA == adam_spec.SCHEMA
    assert spec.SLOTS == adam_spec.SLOTS
    assert spec.REPRESENTATIVES == adam_spec.REPRESENTATIVES
    names = [sc.name for sc in OPTIMIZER_V1.subcons]
    assert names.index("schema") < names.index("representatives") < names.index("slot_groups")


# ------------------------------------------------------------------------------ destinations


def test_a_torchlean_destination_checks_every_group() -> None:
    """Read against a ``TLADAMF`` reference's destination: one config in every group."""
    family = family_named("tlckpt_optimizer")
    plain = (GROUPS[0], dataclasses.replace(GROUPS[1], amsgrad=False, weight_decay=0.01))
    entries = {0: OptimizerEntry(1, "float32", np.zeros(6, "<f4"), np.zeros(6, "<f4"))}
    state = OptimizerState(SCHEMA, plain, SLOT_GROUPS, entries, None)
    data = _write(state)
    config = CONFIG
    family.read(io.BytesIO(data), AdamTarget(SCHEMA, MomentDtype.FLOAT32, config), True, 0)
    with pytest.raises(ConfigError, match="weight_decay"):
        other = dataclasses.replace(config, weight_decay=0.02)
        family.read(io.BytesIO(data), AdamTarget(SCHEMA, MomentDtype.FLOAT32, other), True, 0)
    with pytest.raises(ConfigError, match="float32 in the file, float64"):
        family.read(io.BytesIO(data), AdamTarget(SCHEMA, MomentDtype.FLOAT64, None), True, 0)
    amsgrad = (GROUPS[0], dataclasses.replace(GROUPS[1], weight_decay=0.01))
    amsgrad_file = _write(OptimizerState(SCHEMA, amsgrad, SLOT_GROUPS, entries, None))
    with pytest.raises(ConfigError, match="param group 1: amsgrad is 1 in the file, 0"):
        family.read(io.BytesIO(amsgrad_file), AdamTarget(SCHEMA, None, config), True, 0)


def test_a_tlckopt_destination_of_a_torchlean_file() -> None:
    """A ``TLADAMF`` file read against a ``TLCKOPT`` reference's destination: it fits when
    that optimizer's state fits TorchLean's versions, and the message says why not."""
    family = family_named("adam")
    schema = ParameterSchema([(2,), (3,)], [True, True])
    adam = io.BytesIO()
    write_adam(adam, schema, CONFIG, _adam_entries(schema))
    groups = (GROUPS[0], dataclasses.replace(GROUPS[0], lr=0.5))  # lr differs: fits
    target = OptimizerTarget(schema, groups, (0, 1), ("float32", None))
    family.read(io.BytesIO(adam.getvalue()), target, True, 0)
    target = OptimizerTarget(schema, GROUPS, (0, 1), ("float32", "float32"))
    with pytest.raises(ConfigError, match="amsgrad"):
        family.read(io.BytesIO(adam.getvalue()), target, True, 0)


# ------------------------------------------------------------------------------ the writer


def _refused(match: str, **changes: Any) -> None:
    state, _ = _sample()
    args = {
        "schema": state.schema,
        "groups": state.groups,
        "slot_groups": state.slot_groups,
        "entries": state.entries,
        "random_counter": state.random_counter,
        **changes,
    }
    out = io.BytesIO()
    with pytest.raises(CheckpointError, match=match):
        write_optimizer_state(out, **args)
    assert out.getvalue() == b""  # checked before the first byte


def test_writer_refusals() -> None:
    state, _ = _sample()
    e0 = state.entries[0]
    _refused("not well-formed", schema=ParameterSchema([(2,)], [True], [None]))
    _refused("ParamGroupConfig", groups=(GROUPS[0], "adamw"))
    _refused("beta1 must be", groups=(dataclasses.replace(GROUPS[0], beta1=1.0), GROUPS[1]))
    _refused("lr must be", groups=(GROUPS[0], dataclasses.replace(GROUPS[1], lr=-1.0)))
    _refused("6 slot", slot_groups=SLOT_GROUPS[:5])
    _refused("slot 0 is trainable", slot_groups=(None, *SLOT_GROUPS[1:]))
    _refused("slot 0 is trainable", slot_groups=(2, *SLOT_GROUPS[1:]))
    _refused("frozen or an alias", slot_groups=(0, 0, *SLOT_GROUPS[2:]))
    _refused("not representative: \\[1\\]", entries={**state.entries, 1: e0})
    _refused("step must be", entries={**state.entries, 0: dataclasses.replace(e0, step=0)})
    _refused(
        "cannot be stored", entries={**state.entries, 0: dataclasses.replace(e0, dtype="int8")}
    )
    _refused(
        "m must be float32 with 6 elements",
        entries={**state.entries, 0: dataclasses.replace(e0, dtype="float32")},
    )
    _refused(
        "has no max_exp_avg_sq",
        entries={**state.entries, 0: dataclasses.replace(e0, max_exp_avg_sq=e0.m)},
    )
    e3 = state.entries[3]
    _refused(
        "max_exp_avg_sq must be",
        entries={**state.entries, 3: dataclasses.replace(e3, max_exp_avg_sq=None)},
    )
    _refused("random_counter", random_counter=2**64)


def test_group_configs_check_their_types() -> None:
    with pytest.raises(ConfigError, match="kind"):
        ParamGroupConfig("sgd", 0.9, 0.999, 1e-8, 0.0, 1e-3)
    with pytest.raises(ConfigError, match="amsgrad must be a bool"):
        ParamGroupConfig(AdamKind.ADAM, 0.9, 0.999, 1e-8, 0.0, 1e-3, amsgrad=1)
    with pytest.raises(ConfigError, match="lr must be a float"):
        ParamGroupConfig(AdamKind.ADAM, 0.9, 0.999, 1e-8, 0.0, "0.1")
