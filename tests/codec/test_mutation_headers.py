"""Hostile headers: files announcing 2^62 of anything, or a long rank of huge dims, in a
few KiB are rejected at once, fast and without a large allocation; random structured
headers may only succeed or raise a checked :class:`CheckpointError`."""

from __future__ import annotations

import io
import struct
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mutation_support import EDGE_U64, SPLICE_EXAMPLES, adam_reader, f32_reader, outcome, u64

from tlckpt.codec import (
    CheckpointError,
    EntryError,
    MomentDtype,
    ParameterSchema,
    SchemaMismatchError,
    TruncatedError,
    inspect,
    read_optimizer_state,
)

# ----------------------------------------------------------------------- hostile headers

HUGE = 2**62
KIB = 1024


def _pad(data: bytes, size: int = KIB) -> bytes:
    assert len(data) <= size
    return data + b"\x00" * (size - len(data))


_ADAMW = struct.pack("<4d", 0.9, 0.999, 1e-8, 0.01)


def _adam_v2(*body: int) -> bytes:
    return b"TLADAMF" + u64(2) + u64(1) + _ADAMW + b"".join(u64(x) for x in body)


def _own(*body: int) -> bytes:
    """A ``TLCKOPT`` v1 file: no counter, then ``body`` (group_count first)."""
    return b"TLCKOPT" + u64(1) + u64(0) + b"".join(u64(x) for x in body)


#: One AdamW group: kind, beta1, beta2, eps, weight decay, lr, amsgrad, maximize.
_GROUP = (1, *struct.unpack("<5Q", struct.pack("<5d", 0.9, 0.999, 1e-8, 0.01, 1e-3)), 0, 0)


def _own_reader_of(schema: ParameterSchema) -> Callable[[Any], Any]:
    return lambda src: read_optimizer_state(src, schema)


def _tlsf(*body: int) -> bytes:
    return b"TLSF32B" + u64(1) + b"".join(u64(x) for x in body)


_ONE_SLOT = ParameterSchema([(2,)], [True])
_BIG_SLOT = ParameterSchema([(2**31, 2**31)], [True])

#: name → (file, reader with a destination, class it raises, class inspect raises)
HOSTILE: dict[str, tuple[bytes, Callable[[Any], Any], type, type]] = {
    "slot_count": (
        _pad(_adam_v2(HUGE)),
        adam_reader(_ONE_SLOT, MomentDtype.FLOAT32),
        SchemaMismatchError,
        TruncatedError,
    ),
    "slot_count_matching": (
        _pad(_adam_v2(HUGE)),
        adam_reader(ParameterSchema([(1,)] * 3, [True] * 3), MomentDtype.FLOAT32),
        SchemaMismatchError,
        TruncatedError,
    ),
    "rank": (
        _pad(_adam_v2(1, HUGE)),
        adam_reader(_ONE_SLOT, MomentDtype.FLOAT32),
        SchemaMismatchError,
        TruncatedError,
    ),
    "entry_count": (
        _pad(_adam_v2(1, 1, 2, 2, 1, HUGE)),
        adam_reader(_ONE_SLOT, MomentDtype.FLOAT32),
        EntryError,
        EntryError,
    ),
    "entry_element_count": (
        _pad(_adam_v2(1, 1, 2, 2, 1, 1, 0, 1, HUGE)),
        adam_reader(_ONE_SLOT, MomentDtype.FLOAT32),
        EntryError,
        EntryError,
    ),
    "element_count": (
        _pad(_adam_v2(1, 2, 2**31, 2**31, HUGE, 1, 1, 0, 1, HUGE)),
        adam_reader(_BIG_SLOT, MomentDtype.FLOAT32),
        TruncatedError,
        TruncatedError,
    ),
    "tensor_count": (
        _pad(_tlsf(HUGE)),
        f32_reader([(2,)]),
        SchemaMismatchError,
        TruncatedError,
    ),
    "tensor_rank": (
        _pad(_tlsf(1, HUGE)),
        f32_reader([(2,)]),
        SchemaMismatchError,
        TruncatedError,
    ),
    "tensor_element_count": (
        _pad(_tlsf(1, 2, 2**31, 2**31, HUGE)),
        f32_reader([(2**31, 2**31)]),
        TruncatedError,
        TruncatedError,
    ),
    "own_group_count": (
        _pad(_own(HUGE)),
        _own_reader_of(_ONE_SLOT),
        TruncatedError,
        TruncatedError,
    ),
    "own_slot_count": (
        _pad(_own(1, *_GROUP, HUGE)),
        _own_reader_of(_ONE_SLOT),
        SchemaMismatchError,
        TruncatedError,
    ),
    "own_entry_count": (
        _pad(_own(1, *_GROUP, 1, 1, 2, 2, 1, 1, 1, HUGE)),
        _own_reader_of(_ONE_SLOT),
        EntryError,
        EntryError,
    ),
    "own_entry_element_count": (
        _pad(_own(1, *_GROUP, 1, 1, 2, 2, 1, 1, 1, 1, 0, 1, 0, HUGE)),
        _own_reader_of(_ONE_SLOT),
        EntryError,
        EntryError,
    ),
    "own_element_count": (
        _pad(_own(1, *_GROUP, 1, 2, 2**31, 2**31, HUGE, 1, 1, 1, 1, 0, 1, 0, HUGE)),
        _own_reader_of(_BIG_SLOT),
        TruncatedError,
        TruncatedError,
    ),
    "all_ones": (
        b"TLSF32B" + u64(1) + b"\xff" * (KIB - 15),
        f32_reader([(2,)]),
        SchemaMismatchError,
        TruncatedError,
    ),
}


def _measure(call: Callable[[], Any]) -> tuple[BaseException | None, float, int]:
    tracemalloc.start()
    start = time.perf_counter()
    try:
        call()
        exc = None
    except BaseException as e:  # inspected by the caller
        exc = e
    elapsed = time.perf_counter() - start
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return exc, elapsed, peak


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_huge_counts_are_rejected_fast_and_small(name: str) -> None:
    data, read, expected, inspected = HOSTILE[name]
    for call, cls in ((read, expected), (inspect, inspected)):
        exc, elapsed, peak = _measure(lambda call=call: call(io.BytesIO(data)))
        assert type(exc) is cls, repr(exc)
        assert isinstance(exc.offset, int) and 0 <= exc.offset <= len(data)
        assert elapsed < 0.5, f"{elapsed:.2f} s"
        assert peak < 2 * 2**20, f"{peak / 2**20:.1f} MiB"


_LONG_RANK = 25_000


@pytest.mark.parametrize("family", ["tlsf32", "adam"])
def test_long_rank_of_huge_dims_is_rejected_fast(family: str) -> None:
    """A rank of tens of thousands of dims of 2^64 - 1: the element-count check must not
    multiply them all out (a bigint product is quadratic in the rank)."""
    dims = [2**64 - 1] * _LONG_RANK
    if family == "tlsf32":
        data = _tlsf(1, _LONG_RANK, *dims, 0)
    else:
        data = _adam_v2(1, _LONG_RANK, *dims, 0, 1, 0)
    start = time.perf_counter()  # no tracemalloc here: it would inflate the time
    with pytest.raises(SchemaMismatchError):
        inspect(io.BytesIO(data))
    elapsed = time.perf_counter() - start
    assert elapsed < 0.5, f"{elapsed:.2f} s for a {len(data) // 1024} KiB file"


def test_one_mib_hostile_file_stays_small() -> None:
    """A 1 MiB file of 0xFF after a valid framing: rejected, little memory beyond its size."""
    data = b"TLADAMF" + u64(2) + u64(1) + _ADAMW + b"\xff" * (2**20 - 55)
    for call in (adam_reader(_ONE_SLOT, MomentDtype.FLOAT32), inspect):
        exc, elapsed, peak = _measure(lambda call=call: call(io.BytesIO(data)))
        assert isinstance(exc, CheckpointError), repr(exc)
        assert elapsed < 0.5
        assert peak < 4 * 2**20


# ------------------------------------------------------------- random structured headers

_WORDS = st.one_of(
    st.sampled_from((*EDGE_U64, 2, 3, 4, 2**31, 2**62, 0x3FECCCCCCCCCCCCD)),
    st.integers(0, 16),
    st.integers(0, 2**64 - 1),
)


@settings(max_examples=SPLICE_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from([(b"TLADAMF", v) for v in (2, 3, 4, 5)] + [(b"TLSF32B", 1), (b"TLCKOPT", 1)]),
    st.lists(_WORDS, max_size=48),
    st.binary(max_size=64),
)
def test_random_u64_headers(framing: tuple[bytes, int], words: list[int], tail: bytes) -> None:
    """Any sequence of u64 words after a valid framing: a CheckpointError or a read."""
    magic, version = framing
    data = magic + u64(version) + b"".join(u64(w) for w in words) + tail
    if magic == b"TLSF32B":
        reader = f32_reader([(2,), ()])
    elif magic == b"TLCKOPT":
        reader = _own_reader_of(
            ParameterSchema([(2,), (2,), ()], [True, True, False], [0, 0, None])
        )
    else:
        schema = ParameterSchema([(2,), (2,), ()], [True, True, False], [0, 0, None])
        reader = adam_reader(schema, MomentDtype.FLOAT64 if version == 5 else MomentDtype.FLOAT32)
    outcome(reader, data)
    outcome(inspect, data)
