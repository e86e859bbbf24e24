"""Hypothesis strategies for TorchLean checkpoint states (reused by the test suite).

Everything drawn here is *valid* input for the writers: well-formed schemas (frozen slots,
scalars, zero-size dims, tied slots with a valid representative map), configs that pass
FORMAT.md §3's validation (``-0.0`` betas and weight decay, subnormal epsilon for float64),
counters over the whole u64 range, and moment/state payloads drawn as raw storage words so
that NaN payloads, signalling NaNs, infinities, ``-0.0`` and subnormals all occur and must
survive bit for bit. For tlckpt's own optimizer family (``TLCKOPT``): param groups of every
value torch.optim.Adam accepts (``eps = 0``, infinite weight decay or lr, amsgrad,
maximize, Adam with L2 decay), any assignment of slots to groups, any subset of slots with
state, and moments of each of the family's dtypes (bfloat16 and float16 words included).

The values of a training-state document (a scheduler's state, ``extra``) are drawn by
:mod:`.value_strategies`.

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

from ..codec import (
    AdamConfig,
    AdamEntry,
    AdamKind,
    MomentDtype,
    OptimizerEntry,
    ParameterSchema,
    ParamGroupConfig,
)
from ..codec.values.optimizer_types import MOMENT_DTYPE_NAMES, moment_array_dtype

__all__ = [
    "U64_MAX",
    "SPECIAL_FLOAT32_WORDS",
    "SPECIAL_FLOAT64_WORDS",
    "SPECIAL_FLOAT16_WORDS",
    "SPECIAL_BFLOAT16_WORDS",
    "AdamState",
    "OptimizerState",
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
    "moment_arrays",
    "param_group_configs",
    "optimizer_states",
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

#: binary16 words: signed zeros, infinities, NaNs with payloads (quiet, signalling),
#: subnormals, the extremes.
SPECIAL_FLOAT16_WORDS = (
    0x0000,
    0x8000,
    0x7C00,
    0xFC00,
    0x7E00,
    0x7E01,
    0x7C01,
    0xFDFF,
    0x0001,
    0x83FF,
    0x7BFF,
    0x3C00,
)

#: bfloat16 words (stored as uint16), the same kinds.
SPECIAL_BFLOAT16_WORDS = (
    0x0000,
    0x8000,
    0x7F80,
    0xFF80,
    0x7FC0,
    0x7FC1,
    0x7F81,
    0xFFBF,
    0x0001,
    0x807F,
    0x7F7F,
    0x3F80,
)

_WORDS = {
    np.dtype("<f4"): (np.dtype("<u4"), SPECIAL_FLOAT32_WORDS, 2**32 - 1),
    np.dtype("<f8"): (np.dtype("<u8"), SPECIAL_FLOAT64_WORDS, U64_MAX),
    np.dtype("<f2"): (np.dtype("<u2"), SPECIAL_FLOAT16_WORDS, 2**16 - 1),
    np.dtype("<u2"): (np.dtype("<u2"), SPECIAL_BFLOAT16_WORDS, 2**16 - 1),  # bfloat16 words
}


def shapes(max_rank: int = 3, max_side: int = 4) -> st.SearchStrategy[tuple[int, ...]]:
    """Tensor shapes: rank 0 (scalars) up to ``max_rank``, zero-size dims included."""
    return st.lists(st.integers(0, max_side), max_size=max_rank).map(tuple)


def float_arrays(dtype: Any, shape: Any) -> st.SearchStrategy[np.ndarray]:
    """Little-endian float32/float64/float16 arrays of ``shape`` (or bfloat16 words,
    ``"<u2"``), drawn as raw words (exact bits).

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


def moment_arrays(dtype: str, count: int) -> st.SearchStrategy[np.ndarray]:
    """Flat moment arrays of a ``TLCKOPT`` moment dtype (``"bfloat16"``: its uint16 words)."""
    return float_arrays(moment_array_dtype(dtype), count)


def _non_negative() -> st.SearchStrategy[float]:
    """What torch.optim.Adam accepts for eps, weight decay and lr: ``>= 0``, not NaN."""
    return st.one_of(
        st.sampled_from((0.0, -0.0, 5e-324, 1e-8, 0.01, math.inf)),
        st.floats(min_value=0.0, allow_nan=False),
    )


@st.composite
def param_group_configs(draw: st.DrawFn) -> ParamGroupConfig:
    """Param groups of every value torch.optim.Adam accepts (both kinds, any flags)."""
    return ParamGroupConfig(
        draw(st.sampled_from(list(AdamKind))),
        draw(betas()),
        draw(betas()),
        draw(_non_negative()),
        draw(_non_negative()),
        draw(_non_negative()),
        draw(st.booleans()),
        draw(st.booleans()),
    )


@dataclass(frozen=True)
class OptimizerState:
    """Everything ``write_optimizer_state`` takes."""

    schema: ParameterSchema
    groups: tuple[ParamGroupConfig, ...]
    slot_groups: tuple[int | None, ...]
    entries: dict[int, OptimizerEntry]
    random_counter: int | None

    @property
    def dtypes(self) -> tuple[str | None, ...]:
        """Per slot, its entry's moment dtype (``None`` for a slot without an entry)."""
        return tuple(
            self.entries[i].dtype if i in self.entries else None for i in range(len(self.schema))
        )


@st.composite
def optimizer_states(
    draw: st.DrawFn,
    schemas: st.SearchStrategy[ParameterSchema] | None = None,
    max_groups: int = 3,
    counters: st.SearchStrategy[int | None] | None = None,
) -> OptimizerState:
    """A valid ``TLCKOPT`` state: groups, each representative slot's group, state for a
    subset of those slots (moment dtypes drawn per slot), ``max_exp_avg_sq`` exactly for
    slots whose group has amsgrad."""
    schema = draw(parameter_schemas() if schemas is None else schemas)
    owners = schema.representative_slots
    groups = tuple(
        draw(st.lists(param_group_configs(), min_size=1 if owners else 0, max_size=max_groups))
    )
    slot_groups = tuple(
        draw(st.integers(0, len(groups) - 1)) if schema.is_representative(i) else None
        for i in range(len(schema))
    )
    counter = draw(random_counters() if counters is None else counters)
    with_state = draw(st.lists(st.sampled_from(owners), unique=True) if owners else st.just([]))
    entries = {}
    for slot in sorted(with_state):
        dtype = draw(st.sampled_from(MOMENT_DTYPE_NAMES))
        count = schema.element_count(slot)
        moments = [draw(moment_arrays(dtype, count)) for _ in range(2)]
        if groups[slot_groups[slot]].amsgrad:
            moments.append(draw(moment_arrays(dtype, count)))
        entries[slot] = OptimizerEntry(draw(steps()), dtype, *moments)
    return OptimizerState(schema, groups, slot_groups, entries, counter)


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
