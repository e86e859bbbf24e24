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

Example:
    >>> from hypothesis import given
    >>> @given(adam_states())
    ... def test_round_trip(state): ...
"""

from __future__ import annotations

import collections
import math
import struct
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
from ..codec.sets.exact_values import TensorScalar
from ..codec.values.optimizer_types import MOMENT_DTYPE_NAMES, moment_array_dtype
from ..formats.checkpoint_set import LIMITS

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
    "value_floats",
    "value_integers",
    "value_strings",
    "hashable_values",
    "nested_values",
    "training_values",
    "beyond_leaves",
    "value_depth",
    "value_fits",
    "same_value",
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


# --------------------------------------------------------------------------- training-state values
#
# The values a training-state document holds (a scheduler's state, ``extra``): every kind
# :mod:`tlckpt.codec.sets.exact_values` takes, with floats drawn as raw binary64 words (NaN
# payloads, -0.0, infinities, subnormals), integers up to and just past the reader's digit
# bound, strings of any code point but lone surrogates, and containers nested up to and just
# past ``LIMITS.value_depth``.


def _float_of_word(word: int) -> float:
    return struct.unpack("<d", struct.pack("<Q", word))[0]


def value_floats() -> st.SearchStrategy[float]:
    """binary64 values of every kind, the special words forced often."""
    return st.one_of(
        st.sampled_from(SPECIAL_FLOAT64_WORDS).map(_float_of_word),
        st.integers(0, U64_MAX).map(_float_of_word),
        st.floats(allow_nan=True, allow_infinity=True),
    )


def value_integers(digits: int | None = None) -> st.SearchStrategy[int]:
    """Integers around JSON's 64-bit range and up to ``digits`` decimal digits (default:
    the table's ``LIMITS.int_digits``), the bounds themselves included."""
    digits = LIMITS.int_digits if digits is None else digits
    top = 10**digits - 1
    return st.one_of(
        st.integers(-(2**63) - 2, U64_MAX + 2),
        st.integers(-top, top),
        st.sampled_from((-top, top, -(2**63), -(2**63) - 1, U64_MAX, U64_MAX + 1)),
    )


def value_strings(max_size: int = 8) -> st.SearchStrategy[str]:
    """Strings of any code point that UTF-8 holds (none of the lone surrogates), "$" keys
    that look like tags among them."""
    return st.one_of(
        st.text(max_size=max_size),
        st.sampled_from(("$float", "$dict", "$", "note")),
    )


def hashable_values() -> st.SearchStrategy[Any]:
    """Values that can be dict keys and set items: scalars, tuples and frozensets of them,
    zero-dimensional tensor stand-ins."""
    scalars = st.one_of(
        st.none(), st.booleans(), value_integers(40), value_floats(), value_strings()
    )
    return st.recursive(
        scalars,
        lambda inner: st.one_of(
            st.lists(inner, max_size=3).map(tuple),
            st.frozensets(inner, max_size=3),
        ),
        max_leaves=6,
    )


def _tensor_scalars() -> st.SearchStrategy[TensorScalar]:
    return st.one_of(
        st.builds(
            TensorScalar, st.sampled_from(("float32", "float64", "bfloat16")), value_floats()
        ),
        st.builds(TensorScalar, st.just("int64"), st.integers(-(2**63), 2**63 - 1)),
        st.builds(TensorScalar, st.just("bool"), st.booleans()),
    )


def beyond_leaves() -> st.SearchStrategy[Any]:
    """Leaves no reader takes: integers of one digit more than ``LIMITS.int_digits``,
    strings holding a lone surrogate (UTF-8 has none)."""
    past = 10**LIMITS.int_digits
    return st.one_of(
        # Drawn by index: hypothesis' repr of such integers is refused by Python itself.
        st.integers(0, 2).map(lambda i: (past, -past, past * 7 + 3)[i]),
        st.builds(
            lambda head, surrogate: head + surrogate,
            st.text(max_size=3),
            st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF),
        ),
    )


def _leaves(beyond: bool = False) -> st.SearchStrategy[Any]:
    leaves = st.one_of(
        st.none(),
        st.booleans(),
        value_integers(),
        value_floats(),
        value_strings(),
        _tensor_scalars(),
    )
    return st.one_of(leaves, beyond_leaves()) if beyond else leaves


_FACTORIES = (None, int, float, list, dict, collections.Counter, collections.deque)


def _wrap(draw: st.DrawFn, inner: Any) -> Any:
    """``inner`` inside one container of a drawn kind (it becomes one level deeper)."""
    kind = draw(st.integers(0, 11))
    if kind == 0:
        return [inner]
    if kind == 1:
        return (inner,)
    if kind == 2:
        return {draw(value_strings()): inner}
    if kind == 3:
        return {draw(st.integers(-3, 3)): inner}  # int-keyed: written as "$dict"
    if kind == 4:
        return collections.OrderedDict([(draw(hashable_values()), inner)])
    if kind == 5:
        return collections.Counter({draw(hashable_values()): inner})
    if kind == 6:
        maxlen = draw(st.one_of(st.none(), st.integers(1, 3)))
        return collections.deque([inner], maxlen)
    if kind == 7:
        table = collections.defaultdict(draw(st.sampled_from(_FACTORIES)))
        table[draw(hashable_values())] = inner
        return table
    if kind == 8:
        try:
            hash(inner)
        except TypeError:
            return [inner]
        return draw(st.sampled_from((set, frozenset)))([inner])
    if kind == 9:
        return {"$tuple": inner}  # a plain key that looks like a tag
    if kind == 10:
        return [draw(_leaves()), inner]
    return {"a": draw(_leaves()), "b": inner}


@st.composite
def nested_values(draw: st.DrawFn, depth: int) -> Any:
    """A value whose containers nest exactly ``depth`` deep (``0``: a leaf), each level a
    drawn kind of container: list, tuple, str- and int-keyed dict, ``OrderedDict``,
    ``Counter``, ``deque``, ``defaultdict``, ``set``/``frozenset``."""
    value = draw(_leaves())
    for _ in range(depth):
        value = _wrap(draw, value)
    return value


def training_values(max_leaves: int = 24, beyond: bool = False) -> st.SearchStrategy[Any]:
    """Values of every kind a training-state document takes, shallow and wide; with
    ``beyond``, some leaves are :func:`beyond_leaves` (see :func:`value_fits`)."""

    def containers(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
        keys = hashable_values()
        return st.one_of(
            st.lists(inner, max_size=4),
            st.lists(inner, max_size=4).map(tuple),
            st.dictionaries(value_strings(), inner, max_size=4),
            st.dictionaries(st.integers(-5, 5), inner, max_size=4),
            st.dictionaries(keys, inner, max_size=3),
            st.dictionaries(keys, inner, max_size=3).map(collections.OrderedDict),
            st.dictionaries(keys, inner, max_size=3).map(collections.Counter),
            st.builds(
                lambda items, maxlen: collections.deque(
                    items, None if maxlen is None else len(items) + maxlen
                ),
                st.lists(inner, max_size=3),
                st.one_of(st.none(), st.integers(0, 2)),
            ),
            st.builds(
                lambda factory, items: collections.defaultdict(factory, items),
                st.sampled_from(_FACTORIES),
                st.dictionaries(keys, inner, max_size=3),
            ),
            st.sets(keys, max_size=3),
            st.frozensets(keys, max_size=3),
        )

    return st.recursive(_leaves(beyond), containers, max_leaves=max_leaves)


def value_depth(value: Any) -> int:
    """How deep ``value``'s containers nest (``0`` for a leaf, ``1`` for ``[1]``): the
    measure ``LIMITS.value_depth`` bounds, keys and set items included."""
    if isinstance(value, (list, tuple, collections.deque, set, frozenset)):
        return 1 + max((value_depth(v) for v in value), default=0)
    if isinstance(value, dict):
        inner = [value_depth(x) for pair in value.items() for x in pair]
        return 1 + max(inner, default=0)
    return 0


def value_fits(value: Any) -> bool:
    """Whether every reader of a training-state document takes ``value`` (an independent
    statement of the bounds, for the property tests): containers at most
    ``LIMITS.value_depth`` deep, integers of at most ``LIMITS.int_digits`` digits, strings
    that UTF-8 holds, keys and set items included."""
    if value_depth(value) > LIMITS.value_depth:
        return False
    stack = [value]
    while stack:
        item = stack.pop()
        if type(item) is int and abs(item) >= 10**LIMITS.int_digits:
            return False
        if type(item) is str and any(0xD800 <= ord(c) <= 0xDFFF for c in item):
            return False
        if type(item) is TensorScalar:
            stack.append(item.value)
        elif isinstance(item, dict):
            stack.extend(x for pair in item.items() for x in pair)
        elif isinstance(item, (list, tuple, collections.deque, set, frozenset)):
            stack.extend(item)
    return True


def _bits_equal(a: float, b: float) -> bool:
    return struct.pack("<d", a) == struct.pack("<d", b)


def same_value(a: Any, b: Any) -> bool:
    """Whether ``b`` is ``a`` exactly: the same types at every level, floats bit for bit,
    mappings' keys in the same order, a deque's ``maxlen`` and a defaultdict's factory."""
    if type(a) is not type(b):
        return False
    if type(a) is float:
        return _bits_equal(a, b)
    if type(a) is TensorScalar:
        return a.dtype == b.dtype and same_value(a.value, b.value)
    if isinstance(a, (list, tuple, collections.deque)):
        if type(a) is collections.deque and a.maxlen != b.maxlen:
            return False
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        if type(a) is collections.defaultdict and a.default_factory is not b.default_factory:
            return False
        return len(a) == len(b) and all(
            same_value(ka, kb) and same_value(va, vb)
            for (ka, va), (kb, vb) in zip(a.items(), b.items())
        )
    if isinstance(a, (set, frozenset)):
        # No order to keep: every item of one has an exactly equal item in the other.
        return len(a) == len(b) and all(any(same_value(x, y) for y in b) for x in a)
    return a == b
