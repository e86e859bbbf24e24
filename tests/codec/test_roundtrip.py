"""Hypothesis round trips: write → read gives back every bit, in the version FORMAT.md picks.

States come from :mod:`tlckpt.testing.strategies`: well-formed schemas (frozen slots, scalars,
zero-size dims, tied slots), valid configs of both kinds and dtypes (``-0.0``, subnormal
epsilon), counters over all of u64, and payloads drawn as raw words (NaN payloads, signalling
NaNs, infinities, ``-0.0``, subnormals).
"""

from __future__ import annotations

import io
import tempfile
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tlckpt.codec import (
    MomentDtype,
    ParameterSchema,
    inspect,
    read_adam,
    read_float32_state,
    write_adam,
    write_float32_state,
)
from tlckpt.formats import ADAM_VERSIONS, FLOAT32_STATE_V1
from tlckpt.testing.strategies import (
    AdamState,
    adam_configs,
    adam_states,
    float32_states,
    parameter_schemas,
)
from tlckpt.testing.vectors import float_to_bits

ADAM_EXAMPLES = 200
FLOAT32_EXAMPLES = 150
TIED_EXAMPLES = 60
PATH_EXAMPLES = 20

_SETTINGS = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow]}


def _has_aliases(schema: ParameterSchema) -> bool:
    """FORMAT.md §2, computed here from the raw map rather than asked of the schema."""
    reps = schema.representatives
    return reps is not None and any(r is not None and r != i for i, r in enumerate(reps))


def expected_version(state: AdamState) -> int:
    """FORMAT.md §3's selection rule."""
    if state.config.dtype is MomentDtype.FLOAT64:
        return 5
    if state.random_counter is not None:
        return 4
    if _has_aliases(state.schema):
        return 3
    return 2


def expected_adam_size(state: AdamState, version: int) -> int:
    """The byte size FORMAT.md §2-3's layout gives (no padding anywhere)."""
    n = 7 + 8  # magic, version
    n += 8 if version == 5 else 0  # dtype tag
    n += 8 + 4 * 8  # kind, four f64 bits
    n += 8 if version == 5 else 0  # counter flag
    if version == 4 or (version == 5 and state.random_counter is not None):
        n += 8
    n += 8 + sum(8 + 8 * len(s) + 8 + 8 for s in state.schema.shapes)
    n += 8 * len(state.schema.shapes) if version >= 3 else 0
    itemsize = state.config.dtype.numpy.itemsize
    n += 8 + sum(24 + 2 * e.m.size * itemsize for e in state.entries.values())
    return n


def _assert_same_state(ckpt, state: AdamState, version: int) -> None:
    assert ckpt.version == version
    assert ckpt.config.same_bits(state.config)
    for name in ("beta1", "beta2", "epsilon", "weight_decay"):
        assert float_to_bits(getattr(ckpt.config, name)) == float_to_bits(
            getattr(state.config, name)
        )
    assert ckpt.random_counter == state.random_counter
    assert sorted(ckpt.entries) == sorted(state.entries)
    dtype = state.config.dtype.numpy
    for slot, entry in state.entries.items():
        got = ckpt.entries[slot]
        assert got.step == entry.step
        for name in ("m", "v"):
            array = getattr(got, name)
            assert array.dtype == dtype
            assert array.tobytes() == getattr(entry, name).tobytes(), (slot, name)


@settings(max_examples=ADAM_EXAMPLES, **_SETTINGS)
@given(adam_states())
def test_adam_round_trip(state: AdamState) -> None:
    buffer = io.BytesIO()
    version = write_adam(buffer, state.schema, state.config, state.entries, state.random_counter)
    assert version == expected_version(state)
    data = buffer.getvalue()
    assert len(data) == expected_adam_size(state, version)

    ckpt = read_adam(
        io.BytesIO(data), state.schema, dtype=state.config.dtype, expected_config=state.config
    )
    _assert_same_state(ckpt, state, version)

    # The interpreted construct spec reads the same file the same way.
    reference = ADAM_VERSIONS[version].parse(data)
    assert reference.get("random_counter") == state.random_counter
    assert [r.id for r in reference.entries] == sorted(state.entries)  # increasing id
    for record in reference.entries:
        assert record.step == state.entries[record.id].step
        assert record.m.tobytes() == state.entries[record.id].m.tobytes()

    described = inspect(io.BytesIO(data))
    assert (described["version"], described["random_counter"]) == (version, state.random_counter)
    assert [tuple(s["shape"]) for s in described["slots"]] == list(state.schema.shapes)


@settings(max_examples=TIED_EXAMPLES, **_SETTINGS)
@given(
    adam_states(
        schemas=parameter_schemas(tied=True),
        configs=adam_configs(dtype=MomentDtype.FLOAT32),
        counters=st.none(),
    )
)
def test_adam_round_trip_tied_float32_without_counter(state: AdamState) -> None:
    """The v3 corner of the selection rule, rare in the general strategy."""
    buffer = io.BytesIO()
    version = write_adam(buffer, state.schema, state.config, state.entries, None)
    assert version == expected_version(state) == 3
    data = buffer.getvalue()
    assert len(data) == expected_adam_size(state, 3)
    _assert_same_state(read_adam(io.BytesIO(data), state.schema), state, 3)


@settings(max_examples=FLOAT32_EXAMPLES, **_SETTINGS)
@given(float32_states())
def test_float32_state_round_trip(arrays: list[np.ndarray]) -> None:
    buffer = io.BytesIO()
    write_float32_state(buffer, arrays)
    data = buffer.getvalue()
    assert len(data) == 7 + 8 + 8 + sum(8 + 8 * a.ndim + 8 + 4 * a.size for a in arrays)
    shapes = [a.shape for a in arrays]
    back = read_float32_state(io.BytesIO(data), shapes)
    assert len(back) == len(arrays)
    for got, want in zip(back, arrays, strict=True):
        assert got.dtype == np.dtype("<f4")
        assert got.shape == want.shape
        assert got.tobytes() == want.tobytes()
    reference = FLOAT32_STATE_V1.parse(data)
    assert [t.payload.tobytes() for t in reference.tensors] == [a.tobytes() for a in arrays]
    assert [tuple(t["shape"]) for t in inspect(io.BytesIO(data))["tensors"]] == shapes

    # Streamed from a generator (count given): byte-identical.
    streamed = io.BytesIO()
    write_float32_state(streamed, (a for a in arrays), count=len(arrays))
    assert streamed.getvalue() == data


@settings(max_examples=PATH_EXAMPLES, **_SETTINGS)
@given(adam_states(), float32_states())
def test_round_trip_through_paths(state: AdamState, arrays: list[np.ndarray]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        adam = folder / "opt.tladam"
        version = write_adam(adam, state.schema, state.config, state.entries, state.random_counter)
        _assert_same_state(read_adam(adam, state.schema, dtype=state.config.dtype), state, version)
        model = folder / "model.tlsf32"
        write_float32_state(model, arrays)
        back = read_float32_state(model, [a.shape for a in arrays])
        assert [b.tobytes() for b in back] == [a.tobytes() for a in arrays]
        assert sorted(p.name for p in folder.iterdir()) == ["model.tlsf32", "opt.tladam"]
