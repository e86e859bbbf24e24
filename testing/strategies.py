"""Hypothesis strategies for TorchLean checkpoint states (reused by the test suite).

Everything drawn here is *valid* input for the writers: well-formed schemas (frozen slots,
scalars, zero-size dims, tied slots with a valid representative map), configs that pass
FORMAT.md §3's validation (``-0.0`` betas and weight decay, subnormal epsilon for float64),
counters over the whole u64 range, and moment/state payloads drawn as raw storage words so
that NaN payloads, signalling NaNs, infinities, ``-0.0`` and subnormals all occur and must
survive bit for bit.

Example:
    >>> from hypothesis import given
    >>> @given(adam_states())
    ... def test_round_trip(state): ...
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from ..codec import AdamConfig, AdamEntry, AdamKind, MomentDtype, ParameterSchema

__all__ = [
    "U64_MAX",
    "SPECIAL_FLOAT32_WORDS",
    "SPECIAL_FLOAT64_WORDS",
    "AdamState",
    "shapes",
    "float_arrays",
    "parameter_schemas",
    "betas",
    "epsilons",
    "weight_decays",
    "adam_configs",
    "random_counters",
    "steps",
    "adam_states",
    "float32_states",
    "byte_splices",
]

U64_MAX = 2**64 - 1

#: binary32 words worth forcing: signed zeros, infinities, quiet/signalling NaNs with payloads,
#: subnormals, the extremes.
SPECIAL_FLOAT32_WORDS = (
    0x00000000,  # +0
    0x80000000,  # -0
    0x7F800000,  # +inf
    0xFF800000,  # -inf
    0x7FC00000,  # canonical quiet NaN
    0x7FC00001,  # quiet NaN, payload 1
    0xFFC12345,  # negative quiet NaN with payload
    0x7F800001,  # signalling NaN (must not be quietened)
    0xFFBFFFFF,  # negative signalling NaN, all payload bits
    0x00000001,  # smallest subnormal
    0x807FFFFF,  # largest negative subnormal
    0x7F7FFFFF,  # largest finite
    0x3F800000,  # 1.0
)

#: The binary64 counterparts.
SPECIAL_FLOAT64_WORDS = (
    0x0000000000000000,
    0x8000000000000000,
    0x7FF0000000000000,
    0xFFF0000000000000,
    0x7FF8000000000000,
    0x7FF8000000000001,
    0xFFF8DEADBEEF0001,
    0x7FF0000000000001,  # signalling NaN
    0xFFF7FFFFFFFFFFFF,
    0x0000000000000001,
    0x800FFFFFFFFFFFFF,
    0x7FEFFFFFFFFFFFFF,
    0x3FF0000000000000,
)

_WORDS = {
    np.dtype("<f4"): (np.dtype("<u4"), SPECIAL_FLOAT32_WORDS, 2**32 - 1),
    np.dtype("<f8"): (np.dtype("<u8"), SPECIAL_FLOAT64_WORDS, U64_MAX),
}


def shapes(max_rank: int = 3, max_side: int = 4) -> st.SearchStrategy[tuple[int, ...]]:
    """Tensor shapes: rank 0 (scalars) up to ``max_rank``, zero-size dims included."""
    return st.lists(st.integers(0, max_side), max_size=max_rank).map(tuple)


def float_arrays(dtype: Any, shape: Any) -> st.SearchStrategy[np.ndarray]:
    """Little-endian float32/float64 arrays of ``shape``, drawn as raw words (exact bits).

    About half the elements are special words (NaN payloads, infinities, ``-0.0``,
    subnormals); the rest are arbitrary bit patterns.
    """
    words, special, top = _WORDS[np.dtype(dtype).newbyteorder("<")]
    elements = st.one_of(st.sampled_from(special), st.integers(0, top))
    return hnp.arrays(words, shape, elements=elements).map(
        lambda a: a.view(np.dtype(dtype).newbyteorder("<"))
    )


@st.composite
def parameter_schemas(
    draw: st.DrawFn, max_slots: int = 6, max_rank: int = 3, tied: bool = False
) -> ParameterSchema:
    """Well-formed schemas: frozen slots, independent slots and tied slots.

    A tied slot copies the shape of an earlier representative slot and points at it. A
    representative map is present whenever a slot is tied, and sometimes when none is
    (a map without aliases is valid too). ``tied=True``: at least one slot is tied.
    """
    n = draw(st.integers(2 if tied else 0, max(max_slots, 2) if tied else max_slots))
    slot_shapes: list[tuple[int, ...]] = []
    grads: list[bool] = []
    reps: list[int | None] = []
    for i in range(n):
        owners = [j for j in range(i) if reps[j] == j]
        role = draw(st.sampled_from(("frozen", "own", "tied") if owners else ("frozen", "own")))
        if role == "tied":
            r = draw(st.sampled_from(owners))
            slot_shapes.append(slot_shapes[r])
            grads.append(True)
            reps.append(r)
        else:
            slot_shapes.append(draw(shapes(max_rank)))
            grads.append(role == "own")
            reps.append(i if role == "own" else None)
    has_tie = any(r is not None and r != i for i, r in enumerate(reps))
    if tied and not has_tie:
        # Make the last slot a tie of the first representative (adding one if none is).
        owners = [j for j in range(n - 1) if reps[j] == j]
        if not owners:
            slot_shapes[0], grads[0], reps[0] = draw(shapes(max_rank)), True, 0
            owners = [0]
        slot_shapes[-1], grads[-1], reps[-1] = slot_shapes[owners[0]], True, owners[0]
        has_tie = True
    use_map = has_tie or draw(st.booleans())
    return ParameterSchema(slot_shapes, grads, reps if use_map else None)


def betas() -> st.SearchStrategy[float]:
    """Valid Adam betas: finite, ``0 <= b < 1``; ``-0.0`` and the float just below 1 forced."""
    return st.one_of(
        st.sampled_from((0.0, -0.0, 5e-324, 0.9, 0.999, math.nextafter(1.0, 0.0))),
        st.floats(0.0, 1.0, exclude_max=True),
    )


def _fits_float32(eps: float) -> bool:
    with np.errstate(over="ignore", under="ignore"):
        narrowed = float(np.float32(eps))
    return math.isfinite(narrowed) and narrowed > 0.0


def epsilons(dtype: MomentDtype) -> st.SearchStrategy[float]:
    """Valid epsilons for ``dtype``: positive and finite after rounding to the moment dtype.

    float64 includes binary64 subnormals (5e-324); float32 includes values that only survive
    as binary32 subnormals.
    """
    if MomentDtype(dtype) is MomentDtype.FLOAT64:
        return st.one_of(
            st.sampled_from((5e-324, 2.2250738585072014e-308, 1e-300, 1e-8, sys.float_info.max)),
            st.floats(min_value=5e-324, allow_nan=False, allow_infinity=False),
        )
    return st.one_of(
        st.sampled_from((1.401298464324817e-45, 1e-45, 1e-40, 1e-8, 3.4028234663852886e38)),
        st.floats(min_value=1e-45, max_value=3e38),
    ).filter(_fits_float32)


def weight_decays(kind: AdamKind) -> st.SearchStrategy[float]:
    """Adam: ``0.0`` or ``-0.0``. AdamW: finite and ``>= 0`` (``-0.0`` included)."""
    if AdamKind(kind) is AdamKind.ADAM:
        return st.sampled_from((0.0, -0.0))
    return st.one_of(
        st.sampled_from((0.0, -0.0, 5e-324, 0.01, 1e300)),
        st.floats(min_value=0.0, allow_nan=False, allow_infinity=False),
    )


@st.composite
def adam_configs(
    draw: st.DrawFn, dtype: MomentDtype | None = None, kind: AdamKind | None = None
) -> AdamConfig:
    """Configs that pass ``AdamConfig.validate`` (both kinds and both dtypes unless fixed)."""
    dtype = draw(st.sampled_from(list(MomentDtype))) if dtype is None else MomentDtype(dtype)
    kind = draw(st.sampled_from(list(AdamKind))) if kind is None else AdamKind(kind)
    return AdamConfig(
        kind, draw(betas()), draw(betas()), draw(epsilons(dtype)), draw(weight_decays(kind)), dtype
    )


def random_counters() -> st.SearchStrategy[int | None]:
    """``None`` or any u64, the edges (0, 2^63, 2^64 - 1) forced."""
    return st.one_of(
        st.none(), st.sampled_from((0, 1, 2**32, 2**63, U64_MAX)), st.integers(0, U64_MAX)
    )


def steps() -> st.SearchStrategy[int]:
    """Adam step counters: ``1 <= t < 2^64``."""
    return st.one_of(st.sampled_from((1, 2**63, U64_MAX)), st.integers(1, U64_MAX))


@dataclass(frozen=True)
class AdamState:
    """Everything ``write_adam`` takes."""

    schema: ParameterSchema
    config: AdamConfig
    entries: dict[int, AdamEntry]
    random_counter: int | None


@st.composite
def adam_states(
    draw: st.DrawFn,
    schemas: st.SearchStrategy[ParameterSchema] | None = None,
    configs: st.SearchStrategy[AdamConfig] | None = None,
    counters: st.SearchStrategy[int | None] | None = None,
) -> AdamState:
    """A complete valid optimizer state: one entry per representative slot, exact moments."""
    schema = draw(parameter_schemas() if schemas is None else schemas)
    config = draw(adam_configs() if configs is None else configs)
    counter = draw(random_counters() if counters is None else counters)
    dtype = config.dtype.numpy
    entries = {}
    for slot in schema.representative_slots:
        count = schema.element_count(slot)
        entries[slot] = AdamEntry(
            draw(steps()), draw(float_arrays(dtype, count)), draw(float_arrays(dtype, count))
        )
    return AdamState(schema, config, entries, counter)


def float32_states(max_tensors: int = 6, max_rank: int = 3) -> st.SearchStrategy[list[np.ndarray]]:
    """Model states for ``TLSF32B``: float32 arrays of random shapes, exact bit patterns."""
    tensor = shapes(max_rank).flatmap(lambda shape: float_arrays("<f4", shape))
    return st.lists(tensor, max_size=max_tensors)


@st.composite
def byte_splices(draw: st.DrawFn, data: bytes, max_len: int = 16) -> bytes:
    """``data`` with one random region replaced by random bytes of a random length."""
    start = draw(st.integers(0, len(data)))
    stop = draw(st.integers(start, min(len(data), start + max_len)))
    middle = draw(st.binary(max_size=max_len))
    return data[:start] + middle + data[stop:]
