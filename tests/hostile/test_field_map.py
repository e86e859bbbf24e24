"""The mutation campaign's map of a binary seed covers the whole file, and its systematic set
holds every record-level mutation.

The map (``fuzz.mutators.field_map``) is where the campaign finds records to duplicate,
delete, swap and overwrite, and payloads to cut at: a map that stops early silently turns
those mutations off. Here every binary seed's map is compared with what the codec's own
readers find in the same file: as many schema slots, moment entries and tensors, each
payload where the reader took its bytes from.
"""

from __future__ import annotations

import io
import struct
from typing import Any

import numpy as np
import pytest
from hostile_support import fuzz_module

from tlckpt.codec import (
    CheckpointError,
    read_float32_state,
    scan_adam,
    scan_float32_state,
    scan_optimizer_state,
    validate_float32_state,
)

mutators = fuzz_module("mutators")
seeds_mod = fuzz_module("seeds")

ALL_SEEDS = seeds_mod.vector_seeds() + seeds_mod.generated_seeds() + seeds_mod.max_record_seeds()
BINARY = [s for s in ALL_SEEDS if s.binary]
VALID = [s for s in BINARY if s.valid]


def _ids(seed: Any) -> str:
    return seed.name


def _expected(seed: Any) -> tuple[dict[str, int], list[tuple[int, bytes]]]:
    """Record counts per array, and (offset, bytes) of each payload, as the codec reads them."""
    data = seed.data
    if seed.kind == "adam":
        scanned = scan_adam(io.BytesIO(data))
        (_, read), _ = seeds_mod.readers(seed)
        ckpt = read(io.BytesIO(data))
        counts = {"schema.slots": len(scanned.schema), "entries": len(ckpt.entries)}
        # Payload offsets are not exposed by the Adam reader: locate each moment's bytes
        # instead, in file order (m then v of each entry, entries in file order).
        moments = [m for e in ckpt.entries.values() for m in (e.m, e.v)]
        return counts, [(-1, np.ascontiguousarray(m).tobytes()) for m in moments]
    if seed.kind == "tlckpt_optimizer":
        scanned = scan_optimizer_state(io.BytesIO(data))
        (_, read), _ = seeds_mod.readers(seed)
        ckpt = read(io.BytesIO(data))
        counts = {
            "groups": len(scanned.groups),
            "schema.slots": len(scanned.schema),
            "entries": len(ckpt.entries),
        }
        moments = [
            m for e in ckpt.entries.values() for m in (e.m, e.v, e.max_exp_avg_sq) if m is not None
        ]
        return counts, [(-1, np.ascontiguousarray(m).tobytes()) for m in moments]
    shapes = scan_float32_state(io.BytesIO(data))
    layout = validate_float32_state(io.BytesIO(data), shapes)
    arrays = read_float32_state(io.BytesIO(data), shapes)
    payloads = [(o, np.ascontiguousarray(a).tobytes()) for o, a in zip(layout.offsets, arrays)]
    return {"tensors": len(shapes)}, payloads


@pytest.mark.parametrize("seed", VALID, ids=_ids)
def test_map_of_a_valid_seed_covers_every_record_and_payload(seed: Any) -> None:
    fm = mutators.field_map(seed.data)
    assert fm.parsed and fm.error is None
    counts, payloads = _expected(seed)
    found = {group: len(spans) for group, spans in fm.records.items()}
    assert found == {g: n for g, n in counts.items() if n}
    # Each array's count field is mapped and says as much.
    for group, n in counts.items():
        count_off = mutators._count_offset(fm, group)
        assert count_off is not None, group
        assert struct.unpack_from("<Q", seed.data, count_off) == (n,), group
    # Records of an array are contiguous and not empty.
    for group, spans in fm.records.items():
        assert all(a < b for a, b in spans), group
        assert all(spans[i][1] == spans[i + 1][0] for i in range(len(spans) - 1)), group
    # Every payload, with its offset: where the codec read its bytes.
    assert len(fm.payloads) == len(payloads)
    for (a, b), (offset, content) in zip(fm.payloads, payloads):
        assert offset in (-1, a)
        assert seed.data[a:b] == content
    # The file's last payload ends it (nothing after the records in these formats).
    if fm.payloads:
        assert fm.payloads[-1][1] == len(seed.data)


@pytest.mark.parametrize("seed", [s for s in BINARY if not s.valid], ids=_ids)
def test_map_of_an_invalid_seed_stops_at_the_codecs_rejection(seed: Any) -> None:
    fm = mutators.field_map(seed.data)
    # Either the codec rejects the file while mapping (the error is kept), or the file is
    # well-formed and invalid only against its destination.
    assert fm.parsed != (fm.error is not None)
    assert fm.error is None or isinstance(fm.error, CheckpointError)


# The max-record seeds' sets (capped samples in the campaign) take seconds each to build.
@pytest.mark.parametrize("seed", [s for s in VALID if s.cap is None], ids=_ids)
def test_systematic_set_holds_every_record_mutation(seed: Any) -> None:
    fm = mutators.field_map(seed.data)
    specs = [s for s in mutators.systematic(seed.data, True) if s[0] == "rec"]
    for group, spans in fm.records.items():
        kinds = {s[1] for s in specs if s[2] == group}
        expected = {"duplicate", "duplicate+count", "delete", "delete+count"}
        if len(spans) >= 2:
            expected |= {"swap", "swap-ends", "overwrite"}
        assert kinds == expected, group
        for spec in specs:
            if spec[2] != group or spec[1] not in ("duplicate+count", "delete+count"):
                continue
            a, b = spans[spec[3]]
            mutated = mutators.apply(seed.data, spec)
            grow = b - a if spec[1] == "duplicate+count" else a - b
            assert len(mutated) == len(seed.data) + grow
    assert {mutators.record_kind(s) for s in specs} <= set(mutators.RECORD_KINDS)


def test_record_mutations_of_tensors_give_the_files_they_describe() -> None:
    """Duplicating or deleting a tensor record and fixing the count is a valid file with one
    tensor more or less: the map's spans and count field are exact."""
    (seed,) = [s for s in VALID if s.name == "state_basic.tlsf32"]
    shapes = scan_float32_state(io.BytesIO(seed.data))
    fm = mutators.field_map(seed.data)
    for i in range(len(shapes)):
        dup = mutators.record_mutation(seed.data, fm, "tensors", i, "duplicate+count")
        got = scan_float32_state(io.BytesIO(mutators.apply(seed.data, dup)))
        assert got == [*shapes[: i + 1], shapes[i], *shapes[i + 1 :]]
        delete = mutators.record_mutation(seed.data, fm, "tensors", i, "delete+count")
        got = scan_float32_state(io.BytesIO(mutators.apply(seed.data, delete)))
        assert got == shapes[:i] + shapes[i + 1 :]
    swap = mutators.record_mutation(seed.data, fm, "tensors", 0, "swap")
    got = scan_float32_state(io.BytesIO(mutators.apply(seed.data, swap)))
    assert got == [shapes[1], shapes[0], *shapes[2:]]


def test_a_failing_recorder_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    """A harness bug in the map surfaces; it is never taken for an invalid seed."""
    (seed,) = [s for s in VALID if s.name == "adam_v2_adamw.tladam"]

    def drifted(self: Any, path: Any, count: int, dtype: Any, ctx: Any) -> None:
        return None  # the old signature, without ``offset``

    monkeypatch.setattr(mutators.Recorder, "payload_buffer", drifted)
    with pytest.raises(TypeError, match="positional argument"):
        mutators.field_map(seed.data)
    with pytest.raises(TypeError):
        next(iter(mutators.systematic(seed.data, True)))


def test_a_recorder_error_is_not_mistaken_for_a_rejection(monkeypatch: pytest.MonkeyPatch) -> None:
    (seed,) = [s for s in VALID if s.name == "state_basic.tlsf32"]

    def broken(self: Any, path: Any, value: Any, offset: int, ctx: Any) -> None:
        raise KeyError("recorder bug")

    monkeypatch.setattr(mutators.Recorder, "on_field", broken)
    with pytest.raises(KeyError, match="recorder bug"):
        mutators.field_map(seed.data)
