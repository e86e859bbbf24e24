"""The layout of a file to be written: its headers plus payloads at their places make the very
bytes the streaming writer writes."""

from __future__ import annotations

import io

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tlckpt.codec.errors import CheckpointError, EntryError
from tlckpt.codec.model_state.float32_state import validate_float32_state
from tlckpt.codec.model_state.float32_state_writer import float32_state_layout, write_float32_state
from tlckpt.codec.optimizers.adam import validate_adam
from tlckpt.codec.optimizers.adam_writer import adam_layout, write_adam
from tlckpt.codec.spec.builder import Reserved
from tlckpt.codec.spec.layout import layout_of_spec
from tlckpt.codec.values.config import AdamConfig
from tlckpt.codec.values.schema import ParameterSchema
from tlckpt.formats import registry
from tlckpt.formats.adam import AdamKind
from tlckpt.formats.float32_state import TENSORS, WRITTEN_VERSION
from tlckpt.formats.framing import FLOAT32_STATE_MAGIC
from tlckpt.testing.strategies import AdamState, adam_states


def _assembled(layout, arrays) -> bytes:
    out = bytearray(layout.size)
    for offset, data in layout.headers:
        out[offset : offset + len(data)] = data
    for place, array in zip(layout.payloads, arrays):
        raw = np.ascontiguousarray(array).tobytes()
        assert len(raw) == place.nbytes
        out[place.offset : place.offset + place.nbytes] = raw
    return bytes(out)


def _written(arrays) -> bytes:
    f = io.BytesIO()
    write_float32_state(f, arrays)
    return f.getvalue()


SHAPES = [
    [],
    [()],
    [(0,)],
    [(3, 4), (4,), (), (0, 5), (2, 3, 1)],
    [(7, 4)] * 5 + [(4,)] * 3,  # repeated headers (the builder's header cache)
]


@pytest.mark.parametrize("shapes", SHAPES)
def test_headers_and_payload_places_make_the_written_file(shapes):
    rng = np.random.default_rng(len(shapes))
    arrays = [rng.standard_normal(s).astype("<f4").reshape(s) for s in shapes]
    layout = float32_state_layout(shapes)
    data = _written(arrays)
    assert layout.size == len(data)
    assert _assembled(layout, arrays) == data
    assert [p.path for p in layout.payloads] == [
        (*TENSORS, i, "payload") for i in range(len(shapes))
    ]
    # The reader finds the payloads where the layout put them.
    offsets = validate_float32_state(io.BytesIO(data), shapes).offsets
    assert [p.offset for p in layout.payloads] == list(offsets)
    # Headers and payloads tile the file: no byte is both, none is neither.
    covered = sorted(
        [(o, len(d)) for o, d in layout.headers] + [(p.offset, p.nbytes) for p in layout.payloads]
    )
    position = 0
    for offset, n in covered:
        if n:
            assert offset == position
            position += n
    assert position == layout.size
    assert layout.header_bytes() + sum(p.nbytes for p in layout.payloads) == layout.size


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.integers(0, 4), max_size=3).map(tuple), max_size=6))
def test_layout_matches_a_real_write_for_any_shapes(shapes):
    arrays = [np.arange(int(np.prod(s)), dtype="<f4").reshape(s) for s in shapes]
    assert _assembled(float32_state_layout(shapes), arrays) == _written(arrays)


def test_a_reserved_payload_of_the_wrong_size_is_refused():
    spec = registry.lookup(FLOAT32_STATE_MAGIC, WRITTEN_VERSION).struct
    record = {"rank": 1, "dims": (3,), "element_count": 3, "payload": Reserved(2, "<f4")}
    with pytest.raises(CheckpointError, match="reserved"):
        layout_of_spec(spec, {"tensor_count": 1, "tensors": [record]})


def test_a_reserved_payload_cannot_be_written_to_a_real_file():
    spec = registry.lookup(FLOAT32_STATE_MAGIC, WRITTEN_VERSION).struct
    record = {"rank": 1, "dims": (3,), "element_count": 3, "payload": Reserved(3, "<f4")}
    from tlckpt.codec.spec.builder import build

    with pytest.raises(CheckpointError, match="layout"):
        build(io.BytesIO(), spec, {"tensor_count": 1, "tensors": [record]})


@settings(max_examples=40, deadline=None)
@given(adam_states())
def test_adam_layout_matches_a_real_write(state):
    """Every version the selection picks (v2-v5: aliases, counters, float64), and the
    positions the checking pass of a load finds."""
    f = io.BytesIO()
    version = write_adam(f, state.schema, state.config, state.entries, state.random_counter)
    data = f.getvalue()
    steps = {slot: entry.step for slot, entry in state.entries.items()}
    chosen, layout = adam_layout(state.schema, state.config, steps, state.random_counter)
    assert chosen == version
    arrays = []
    for slot in state.schema.representative_slots:
        arrays += [state.entries[slot].m, state.entries[slot].v]
    assert _assembled(layout, arrays) == data
    _, offsets, _ = validate_adam(
        io.BytesIO(data), state.schema, dtype=state.config.dtype, expected_config=state.config
    )
    found = [offsets[(slot, field)] for slot in state.schema.representative_slots for field in "mv"]
    assert [p.offset for p in layout.payloads] == found


def test_adam_layout_refuses_what_write_adam_refuses():
    state = AdamState(
        ParameterSchema([(2,)], [True]),
        AdamConfig(AdamKind.ADAMW, 0.9, 0.999, 1e-8, 0.0),
        {},
        None,
    )
    with pytest.raises(EntryError):
        adam_layout(state.schema, state.config, {})
    with pytest.raises(EntryError):
        adam_layout(state.schema, state.config, {0: 0})
