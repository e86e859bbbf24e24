"""``TLCKOPT`` version 2: a frozen slot that kept its optimizer state (issue #20, item 12).

Version 2 is version 1's layout in which a frozen slot may have a param group and an entry.
The writer writes it only when a frozen slot has state; the reader holds a frozen slot's
group to its entry (a group exactly when there is state), to the file's group count, and to
the destination's group of that parameter; version 1 still refuses a frozen slot's group.
"""

from __future__ import annotations

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
    EntryError,
    OptimizerEntry,
    ParameterSchema,
    ParamGroupConfig,
    SchemaMismatchError,
    inspect,
    read_adam,
    read_optimizer_state,
    scan_optimizer_state,
    write_adam,
    write_optimizer_state,
)
from tlckpt.codec.optimizers.torchlean_fit import torchlean_fit
from tlckpt.codec.values.optimizer_types import MOMENT_DTYPE_NAMES
from tlckpt.formats import OPTIMIZER_V1, OPTIMIZER_V2
from tlckpt.formats.tlckpt_optimizer import layout_of
from tlckpt.testing.adam import adamw_config
from tlckpt.testing.strategies import (
    OptimizerState,
    moment_arrays,
    optimizer_states,
    parameter_schemas,
    steps,
)

GROUPS = (
    ParamGroupConfig(AdamKind.ADAMW, 0.9, 0.999, 1e-8, 0.01, 1e-3),
    ParamGroupConfig(AdamKind.ADAMW, 0.9, 0.999, 1e-8, 0.0, 1e-3, amsgrad=True),
)

# Slots: 0 trainable, 1 tied to 0, 2 frozen with state (group 1: amsgrad), 3 frozen without
# state, 4 trainable.
SCHEMA = ParameterSchema(
    [(2, 3), (2, 3), (4,), (3,), (2,)],
    [True, True, False, False, True],
    [0, 0, None, None, 4],
)
SLOT_GROUPS = (0, None, 1, None, 0)


def _entries() -> dict[int, OptimizerEntry]:
    return {
        0: OptimizerEntry(3, "float32", np.arange(6, dtype="<f4"), np.ones(6, "<f4")),
        2: OptimizerEntry(5, "float64", *(np.full(4, x, "<f8") for x in (1.0, 2.0, 3.0))),
        4: OptimizerEntry(3, "float32", np.zeros(2, "<f4"), np.ones(2, "<f4")),
    }


def _write(slot_groups=SLOT_GROUPS, entries=None) -> tuple[int, bytes]:
    buffer = io.BytesIO()
    entries = _entries() if entries is None else entries
    version = write_optimizer_state(buffer, SCHEMA, GROUPS, slot_groups, entries, None)
    return version, buffer.getvalue()


def _read(data: bytes, **overrides: Any):
    expect = {"groups": GROUPS, "slot_groups": SLOT_GROUPS, **overrides}
    return read_optimizer_state(io.BytesIO(data), SCHEMA, **expect)


def _slot_groups_at(data: bytes) -> int:
    pos = 7 + 8 + 8 + 8 + len(GROUPS) * 64  # framing, counter flag, groups
    pos += 8 + sum(8 + 8 * len(s) + 8 + 8 for s in SCHEMA.shapes)  # schema block
    return pos + 8 * len(SCHEMA)  # representatives


def _patch(data: bytes, offset: int, value: int) -> bytes:
    return data[:offset] + struct.pack("<Q", value) + data[offset + 8 :]


def test_version_2_round_trip_and_description() -> None:
    version, data = _write()
    assert version == 2
    ckpt = _read(data)
    assert ckpt.version == 2 and ckpt.slot_groups == SLOT_GROUPS
    assert sorted(ckpt.entries) == [0, 2, 4]
    kept = ckpt.entries[2]
    assert (kept.step, kept.dtype) == (5, "float64")
    assert kept.max_exp_avg_sq.tobytes() == np.full(4, 3.0, "<f8").tobytes()  # amsgrad group
    assert OPTIMIZER_V2.parse(data).entries[1].id == 2  # construct alone agrees
    assert scan_optimizer_state(io.BytesIO(data)).slot_groups == SLOT_GROUPS
    info = inspect(io.BytesIO(data))
    assert (info["family"], info["version"]) == ("tlckpt_optimizer", 2)
    frozen = info["slots"][2]
    assert (frozen["trainable"], frozen["representative"], frozen["group"]) == (False, None, 1)
    assert [e["id"] for e in info["entries"]] == [0, 2, 4]
    rewritten = io.BytesIO()
    args = (ckpt.groups, ckpt.slot_groups, ckpt.entries, None)
    assert write_optimizer_state(rewritten, SCHEMA, *args) == 2
    assert rewritten.getvalue() == data


def test_version_1_is_written_when_no_frozen_slot_has_state() -> None:
    entries = {k: e for k, e in _entries().items() if k != 2}
    version, data = _write((0, None, None, None, 0), entries)
    assert version == 1 and data[7:15] == struct.pack("<Q", 1)
    assert layout_of(OPTIMIZER_V1).frozen_state is False
    assert layout_of(OPTIMIZER_V2).frozen_state is True
    # Version 2's layout is version 1's: the same state differs in the version word only.
    as_v2 = data[:7] + struct.pack("<Q", 2) + data[15:]
    assert _read(as_v2, slot_groups=(0, None, None, None, 0)).entries.keys() == {0, 4}


def test_a_frozen_slot_with_state_in_version_1_is_refused() -> None:
    _, data = _write()
    as_v1 = data[:7] + struct.pack("<Q", 1) + data[15:]
    at = _slot_groups_at(data) + 8 * 2
    for read in (lambda d: _read(d), lambda d: scan_optimizer_state(io.BytesIO(d))):
        with pytest.raises(SchemaMismatchError, match=r"slot 2 is frozen .* version 1") as info:
            read(as_v1)
        assert info.value.offset == at


def test_a_frozen_group_needs_an_entry() -> None:
    _, data = _write()
    at = _slot_groups_at(data) + 8 * 3  # slot 3: frozen, no entry
    bad = _patch(data, at, 1)
    for read in (
        lambda d: _read(d, slot_groups=(0, None, 1, 0, 0)),
        lambda d: scan_optimizer_state(io.BytesIO(d)),
    ):
        with pytest.raises(EntryError, match=r"slot 3 is frozen .* but no entry") as info:
            read(bad)
        assert info.value.offset == at


def test_a_frozen_group_in_range_and_the_destinations() -> None:
    _, data = _write()
    at = _slot_groups_at(data) + 8 * 2
    with pytest.raises(SchemaMismatchError, match="tags 1 to 2") as info:
        scan_optimizer_state(io.BytesIO(_patch(data, at, 3)))
    assert info.value.offset == at
    with pytest.raises(SchemaMismatchError, match="does not manage") as info:
        _read(data, slot_groups=(0, None, None, None, 0))
    assert info.value.offset == at
    with pytest.raises(SchemaMismatchError, match="slot 2: param group 1 in the file, 0"):
        _read(data, slot_groups=(0, None, 0, None, 0))
    # The destination manages slot 3 too: it has no state in the file, which is fine.
    assert sorted(_read(data, slot_groups=(0, None, 1, 0, 0)).entries) == [0, 2, 4]
    alias = _slot_groups_at(data) + 8 * 1
    with pytest.raises(SchemaMismatchError, match="slot 1 is an alias"):
        scan_optimizer_state(io.BytesIO(_patch(data, alias, 1)))


def test_entry_count_bound_counts_frozen_slots_with_a_group() -> None:
    _, data = _write()
    at = _slot_groups_at(data) + 8 * len(SCHEMA)
    with pytest.raises(EntryError, match=r"2 representative slot.* and 1 frozen") as info:
        scan_optimizer_state(io.BytesIO(_patch(data, at, 4)))
    assert info.value.offset == at


def test_writer_refusals() -> None:
    entries = _entries()
    for slot_groups, entries_, match in [
        ((0, None, None, None, 0), entries, "slot 2 is frozen with state"),
        ((0, None, 1, 1, 0), entries, "slot 3 is frozen or an alias"),
        ((0, None, 5, None, 0), entries, "slot 2 is frozen with state"),
        ((0, None, 1, None, 0), {**entries, 1: entries[0]}, r"not representative: \[1\]"),
    ]:
        out = io.BytesIO()
        with pytest.raises(CheckpointError, match=match):
            write_optimizer_state(out, SCHEMA, GROUPS, slot_groups, entries_, None)
        assert out.getvalue() == b""


def test_torchlean_files_still_refuse_frozen_state() -> None:
    """``TLADAMF``'s schema forbids a frozen slot owning state: its writer refuses it, and
    the fit names it when asked about a state that has it."""
    config = adamw_config()
    trainable = {
        i: AdamEntry(1, np.zeros(n, "<f4"), np.ones(n, "<f4")) for i, n in ((0, 6), (4, 2))
    }
    frozen = AdamEntry(1, np.zeros(4, "<f4"), np.ones(4, "<f4"))
    with pytest.raises(CheckpointError):
        write_adam(io.BytesIO(), SCHEMA, config, {**trainable, 2: frozen})
    fit = torchlean_fit(
        SCHEMA, GROUPS[:1], (0, None, 0, None, 0), ["float32"] * 5, has_state=lambda i: True
    )
    assert [m.field for m in fit.misfits] == ["slot 2"]
    assert "TLADAMF versions forbid a frozen slot owning state" in fit.misfits[0].message
    plain = io.BytesIO()
    write_adam(plain, SCHEMA, config, trainable)
    assert sorted(read_adam(io.BytesIO(plain.getvalue()), SCHEMA).entries) == [0, 4]


@st.composite
def _with_frozen_state(draw: st.DrawFn) -> OptimizerState:
    """A valid ``TLCKOPT`` state in which some frozen slots kept state (any group, dtype)."""
    state = draw(optimizer_states(schemas=parameter_schemas(tied=True)))
    schema, groups = state.schema, state.groups
    frozen = [i for i in range(len(schema)) if schema.representative(i) is None]
    if not groups:
        return state
    slot_groups, entries = list(state.slot_groups), dict(state.entries)
    for slot in draw(st.lists(st.sampled_from(frozen), unique=True) if frozen else st.just([])):
        group = draw(st.integers(0, len(groups) - 1))
        dtype = draw(st.sampled_from(MOMENT_DTYPE_NAMES))
        count = schema.element_count(slot)
        moments = [
            draw(moment_arrays(dtype, count)) for _ in range(3 if groups[group].amsgrad else 2)
        ]
        slot_groups[slot] = group
        entries[slot] = OptimizerEntry(draw(steps()), dtype, *moments)
    return OptimizerState(schema, groups, tuple(slot_groups), entries, state.random_counter)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_with_frozen_state())
def test_round_trip_with_frozen_state(state: OptimizerState) -> None:
    """Version 2 exactly when a frozen slot has an entry; every value back bit for bit, by
    the codec against the destination and against the file alone, and by construct."""
    buffer = io.BytesIO()
    args = (state.groups, state.slot_groups, state.entries, state.random_counter)
    version = write_optimizer_state(buffer, state.schema, *args)
    kept = [i for i in state.entries if state.schema.representative(i) is None]
    assert version == (2 if kept else 1)
    data = buffer.getvalue()
    read = read_optimizer_state(
        io.BytesIO(data),
        state.schema,
        groups=state.groups,
        slot_groups=state.slot_groups,
        dtypes=state.dtypes,
    )
    scanned = scan_optimizer_state(io.BytesIO(data))  # payloads skipped
    for ckpt in (read, scanned):
        assert (ckpt.version, ckpt.slot_groups) == (version, state.slot_groups)
        assert sorted(ckpt.entries) == sorted(state.entries)
        for slot, want in state.entries.items():
            assert (ckpt.entries[slot].step, ckpt.entries[slot].dtype) == (want.step, want.dtype)
    for slot, want in state.entries.items():
        for name in ("m", "v", "max_exp_avg_sq"):
            a, b = getattr(read.entries[slot], name), getattr(want, name)
            assert (a is None) == (b is None)
            if a is not None:
                assert a.tobytes() == b.tobytes()
    parsed = (OPTIMIZER_V2 if version == 2 else OPTIMIZER_V1).parse(data)
    assert [r.id for r in parsed.entries] == sorted(state.entries)
