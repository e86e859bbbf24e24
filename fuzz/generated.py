"""Generated seed files: larger files of every format and version, every registered family's
own examples (:meth:`~tlckpt.codec.families.FamilyHandler.examples`), record-count edges, and
hand-made hostile files at the 1 MiB edge.

Written with the codec itself, deterministically (fixed seeds), each at most
:data:`~fuzz.seed.LARGE_LIMIT` bytes. Like :mod:`fuzz.seed`, this module imports the library
only inside functions.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

import numpy as np

from .seed import LARGE_LIMIT, Seed, report_key

__all__ = ["generated_seeds", "family_example_seeds", "max_record_seeds", "crafted_seeds"]

_F32_SPECIAL = np.array(
    [0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00001, 0x7F800001, 0x00000001],
    dtype="<u4",
)
_F64_SPECIAL = np.array(
    [0, 1 << 63, 0x7FF0000000000000, 0xFFF0000000000000, 0x7FF8000000000001, 1],
    dtype="<u8",
)


def _floats(rng: np.random.Generator, count: int, dtype: str) -> np.ndarray:
    """Random values of ``dtype`` with NaN payloads, infinities, -0.0 and subnormals."""
    if dtype == "<f4":
        words = rng.integers(0, 2**32, count, dtype=np.uint64).astype("<u4")
        special = _F32_SPECIAL
    else:
        words = rng.integers(0, 2**63, count, dtype=np.uint64).astype("<u8")
        words |= rng.integers(0, 2, count, dtype=np.uint64).astype("<u8") << np.uint64(63)
        special = _F64_SPECIAL
    if count:
        k = min(count, len(special))
        words[:k] = special[:k]
    return words.view(dtype)


def _write(writer: Callable[[io.BytesIO], Any]) -> bytes:
    buf = io.BytesIO()
    writer(buf)
    return buf.getvalue()


def _adam_seed(
    name: str,
    rng: np.random.Generator,
    shapes: list[tuple[int, ...]],
    grads: list[bool],
    reps: list[int | None] | None,
    *,
    kind: int = 1,
    dtype: str = "float32",
    counter: int | None = None,
) -> Seed:
    from tlckpt.codec import (
        AdamConfig,
        AdamEntry,
        AdamKind,
        MomentDtype,
        ParameterSchema,
        write_adam,
    )
    from tlckpt.codec.values.destinations import AdamTarget

    schema = ParameterSchema(shapes, grads, reps)
    moment = MomentDtype(dtype)
    config = AdamConfig(AdamKind(kind), 0.9, 0.999, 1e-8, 0.01 if kind == 1 else -0.0, dtype=moment)
    np_dtype = moment.numpy.str
    entries = {
        i: AdamEntry(
            int(rng.integers(1, 2**40)),
            _floats(rng, schema.element_count(i), np_dtype),
            _floats(rng, schema.element_count(i), np_dtype),
        )
        for i in schema.representative_slots
    }
    data = _write(lambda f: write_adam(f, schema, config, entries, counter))
    dest = AdamTarget(schema, moment, config)
    return Seed(name, report_key("adam", data), "adam", data, dest, origin="generated")


def _tied_layout(rng: np.random.Generator, slots: int) -> tuple[list, list, list]:
    """Many small slots: frozen ones, scalars, zero-size dims, and aliases of earlier slots."""
    shapes: list[tuple[int, ...]] = []
    grads: list[bool] = []
    reps: list[int | None] = []
    for i in range(slots):
        roll = rng.integers(0, 10)
        if roll == 0 or not shapes:
            shapes.append(tuple(int(d) for d in rng.integers(0, 4, rng.integers(0, 4))))
            grads.append(False)
            reps.append(None)
        elif roll <= 2 and any(r == j for j, r in enumerate(reps)):
            owners = [j for j, r in enumerate(reps) if r == j]
            j = owners[int(rng.integers(0, len(owners)))]
            shapes.append(shapes[j])
            grads.append(True)
            reps.append(j)
        else:
            shapes.append(tuple(int(d) for d in rng.integers(0, 5, rng.integers(0, 4))))
            grads.append(True)
            reps.append(i)
    return shapes, grads, reps


def generated_seeds() -> list[Seed]:
    """Larger files of every format and version, each at most :data:`LARGE_LIMIT` bytes."""
    from tlckpt.codec import write_float32_state, write_state_bits
    from tlckpt.codec.values.destinations import ModelStateTarget
    from tlckpt.formats.state_bits import ENCODINGS

    rng = np.random.default_rng(20240601)
    seeds = [
        # v2: untied float32, big payloads, a frozen slot, a scalar, a zero-size slot.
        _adam_seed(
            "gen_adam_v2_large",
            rng,
            [(256, 256), (64,), (), (0, 3), (100, 160)],
            [True, False, True, True, True],
            None,
            kind=0,
        ),
        # v3: many small tied/frozen slots (metadata-heavy).
        _adam_seed("gen_adam_v3_many_slots", rng, *_tied_layout(rng, 400)),
        # v3: tied embedding/head with large payloads.
        _adam_seed(
            "gen_adam_v3_tied_large",
            rng,
            [(300, 256), (300, 256), (256,), (7,)],
            [True, True, True, False],
            [0, 0, 2, None],
        ),
        # v4: float32 with a random counter (max u64), tied.
        _adam_seed(
            "gen_adam_v4_counter",
            rng,
            [(200, 300), (200, 300), (300,)],
            [True, True, True],
            [0, 0, 2],
            counter=2**64 - 1,
        ),
        # v5: float64 moments, no counter (flag 0), many slots.
        _adam_seed("gen_adam_v5_f64_many", rng, *_tied_layout(rng, 300), dtype="float64"),
        # v5: float64 with a counter (flag 1), large payloads.
        _adam_seed(
            "gen_adam_v5_f64_counter",
            rng,
            [(180, 300), (300,), (180, 300)],
            [True, True, True],
            [0, 1, 0],
            kind=0,
            dtype="float64",
            counter=12345,
        ),
    ]
    # TLSF32B: a few large tensors, and thousands of tiny ones of every rank.
    big = [_floats(rng, n, "<f4").reshape(shape) for n, shape in ((250_000, (500, 500)),)]
    big += [np.zeros((0, 7), "<f4"), _floats(rng, 1, "<f4").reshape(()), _floats(rng, 5000, "<f4")]
    tiny = []
    for _ in range(600):
        shape = tuple(int(d) for d in rng.integers(0, 4, rng.integers(0, 4)))
        tiny.append(_floats(rng, int(np.prod(shape, dtype=np.int64)), "<f4").reshape(shape))
    for name, arrays in (("gen_tlsf32_large", big), ("gen_tlsf32_many", tiny)):
        data = _write(lambda f, a=arrays: write_float32_state(f, a))
        dest = ModelStateTarget(tuple(a.shape for a in arrays))
        key = report_key("float32_state", data)
        seeds.append(Seed(name, key, "float32_state", data, dest, origin="generated"))
    # Exact-bits JSON: every encoding, pretty and compact, sized to stay under the limit.
    for enc, fmt in ENCODINGS.items():
        for pretty in (True, False):
            arrays = _json_arrays(rng, fmt, large=pretty)
            data = _write(lambda f, a=arrays, e=enc, p=pretty: write_state_bits(f, a, e, pretty=p))
            shapes = [_logical_shape(a, fmt) for a in arrays]
            name = f"gen_bits_{enc}_{'pretty' if pretty else 'compact'}"
            dest = ModelStateTarget(tuple(shapes), enc)
            key = report_key("state_bits", data)
            seeds.append(Seed(name, key, "state_bits", data, dest, origin="generated"))
    seeds += family_example_seeds()
    for s in seeds:
        if len(s.data) > LARGE_LIMIT:
            raise AssertionError(f"generated seed {s.name} is {len(s.data)} bytes")
    return seeds


def family_example_seeds() -> list[Seed]:
    """Every registered family's own example files, with their destinations: a family is
    fuzzed by registering it with examples, nothing here names it."""
    from tlckpt.codec.families import families

    seeds = []
    for family in families():
        for example in family.examples():
            key = report_key(family.name, example.data)
            data, dest = example.data, example.destination
            seeds.append(Seed(example.name, key, family.name, data, dest, origin="generated"))
    return seeds


def _logical_shape(array: np.ndarray, fmt: Any) -> tuple[int, ...]:
    if fmt.pair and fmt.native_dtype is None:
        return tuple(array.shape[:-1])
    return tuple(array.shape)


def _json_arrays(rng: np.random.Generator, fmt: Any, large: bool) -> list[np.ndarray]:
    """Arrays for an exact-bits seed: a big tensor (large seeds), small ones of every rank."""
    width = fmt.width
    # ~21 JSON bytes per 64-bit word, ~11 per 32-bit, fewer for narrow words.
    per_word = {64: 22, 32: 12, 16: 7, 8: 5}.get(fmt.inner.width if fmt.pair else width, 22)
    per_value = per_word * (2 if fmt.pair else 1)
    budget = (LARGE_LIMIT * 7 // 10) // per_value if large else 400
    shapes = [(budget,), (3, 2), (), (0,), (2, 0, 3), (1, 1, 1, 2)]

    def words(n: int) -> np.ndarray:
        w = (
            rng.integers(0, 2**width, n, dtype=np.uint64)
            if width < 64
            else (
                rng.integers(0, 2**63, n, dtype=np.uint64)
                | (rng.integers(0, 2, n, dtype=np.uint64) << np.uint64(63))
            )
        )
        return w.astype(np.dtype(fmt.word_dtype))

    out = []
    for shape in shapes:
        n = int(np.prod(shape, dtype=np.int64))
        if fmt.pair:
            w = words(2 * n).reshape((*shape, 2))
            if fmt.native_dtype is None:
                out.append(w)
            else:
                out.append(np.ascontiguousarray(w).view(np.dtype(fmt.native_dtype))[..., 0])
        else:
            out.append(words(n).view(np.dtype(fmt.array_dtype)).reshape(shape))
    return out


# ------------------------------------------------------------------------------ crafted


def _max_rank(header: int, tail: int, limit: int = LARGE_LIMIT) -> int:
    from tlckpt.formats import U64_SIZE

    return (limit - header - tail) // U64_SIZE


def _crafted(name: str, kind: str, data: bytes, dest: Any, valid: bool = False) -> Seed:
    return Seed(name, report_key(kind, data), kind, data, dest, valid=valid, origin="crafted")


def crafted_seeds() -> list[Seed]:
    """Hand-made hostile files at the 1 MiB edge: what random mutation rarely produces.

    These are read as they are (and lightly mutated): a rank of 100k+ dims of 2^64-1 (the
    element-count check multiplies them), the same with a last dim of 0 (a valid file, which
    ``inspect`` describes), counts of 2^64-1 and 2^62, a payload that claims 2^63 bytes. The
    fields a hostile value is not put in are laid out by the specs' own helpers.
    """
    from tlckpt.codec import MomentDtype, ParameterSchema
    from tlckpt.codec.values.destinations import AdamTarget, ModelStateTarget
    from tlckpt.formats import (
        ADAM_MAGIC,
        FLOAT32_STATE_MAGIC,
        U64_SIZE,
        framing_bytes,
        layout_of,
        lookup,
        pack_u64,
    )
    from tlckpt.formats.adam import HYPERPARAMETERS
    from tlckpt.formats.float32_state import WRITTEN_VERSION

    out: list[Seed] = []
    big = 2**64 - 1
    f32 = "float32_state"
    f32_framing = framing_bytes(FLOAT32_STATE_MAGIC, WRITTEN_VERSION)
    f32_head = f32_framing + pack_u64(1)  # one tensor
    for label, limit in (("1mib", LARGE_LIMIT), ("256kib", LARGE_LIMIT // 4)):
        rank = _max_rank(len(f32_head) + U64_SIZE, U64_SIZE, limit)
        for dim_name, dim in (("max", big), ("two", 2)):
            data = f32_head + pack_u64(rank, *([dim] * rank), 0)
            name = f"crafted_tlsf32_rank{rank}_dims_{dim_name}_{label}"
            out.append(_crafted(name, f32, data, ModelStateTarget(((2,),))))
        # Valid: one zero dim makes the element count 0, so the file reads, and describing
        # it must not multiply the other dims out either.
        data = f32_head + pack_u64(rank, *([big] * (rank - 1) + [0]), 0)
        shape = (big,) * (rank - 1) + (0,)
        name = f"crafted_tlsf32_rank{rank}_dims_max_last_zero_{label}"
        out.append(_crafted(name, f32, data, ModelStateTarget((shape,)), valid=True))
    out.append(
        _crafted(
            "crafted_tlsf32_count_max", f32, f32_framing + pack_u64(big), ModelStateTarget(((),))
        )
    )
    data = f32_head + pack_u64(1, 2**62, 2**62) + b"\0" * 64
    out.append(_crafted("crafted_tlsf32_payload_2^62", f32, data, ModelStateTarget(((2**62,),))))
    # Adam: one slot whose rank fills the file, dims 2^64-1; v2 and v3 (+representatives).
    config = HYPERPARAMETERS.build(dict(beta1=0.9, beta2=0.999, epsilon=1e-8, weight_decay=0.0))
    dest = AdamTarget(ParameterSchema([(2,)], [True]), MomentDtype.FLOAT32)
    for version, label, limit in ((2, "1mib", LARGE_LIMIT), (3, "256kib", LARGE_LIMIT // 4)):
        tied = layout_of(lookup(ADAM_MAGIC, version).struct).representatives
        head = framing_bytes(ADAM_MAGIC, version) + pack_u64(0) + config + pack_u64(1)
        tail = pack_u64(0, 1) + (pack_u64(1) if tied else b"") + pack_u64(0)
        rank = _max_rank(len(head) + U64_SIZE, len(tail), limit)
        data = head + pack_u64(rank, *([big] * rank)) + tail
        name = f"crafted_adam_v{version}_rank{rank}_dims_max_{label}"
        out.append(_crafted(name, "adam", data, dest))
    # Adam: a slot of 2^61 elements whose entry claims 2^63 payload bytes.
    data = (
        framing_bytes(ADAM_MAGIC, 2)
        + pack_u64(0)
        + config
        + pack_u64(1, 1, 2**61, 2**61, 1)
        + pack_u64(1)
        + pack_u64(0, 1, 2**61)
        + b"\0" * 64
    )
    huge = AdamTarget(ParameterSchema([(2**61,)], [True]), MomentDtype.FLOAT32)
    out.append(_crafted("crafted_adam_v2_payload_2^63", "adam", data, huge))
    # Adam: slot_count 2^64-1 after a valid header.
    data = framing_bytes(ADAM_MAGIC, 2) + pack_u64(0) + config + pack_u64(big)
    out.append(_crafted("crafted_adam_v2_slots_max", "adam", data, dest))
    for seed in out:
        seed.cap = 3
    return out


def _record_size(struct: Any, **values: Any) -> int:
    """Bytes of one record of ``struct`` holding ``values``, as the spec builds it."""
    return len(struct.build(values))


def max_record_seeds() -> list[Seed]:
    """Valid files with as many records as 1 MiB holds (per-record cost at its worst)."""
    from tlckpt.codec import write_float32_state
    from tlckpt.codec.values.destinations import ModelStateTarget
    from tlckpt.formats import FRAMING, SLOT, TENSOR_RECORD, U64_SIZE
    from tlckpt.formats.adam import adam_entry
    from tlckpt.formats.float32_state import TENSOR_DTYPE

    one = np.zeros(1, TENSOR_DTYPE)
    scalar = {"rank": 0, "dims": [], "element_count": 1}
    tensor = _record_size(TENSOR_RECORD, **scalar, payload=one)
    slot = _record_size(SLOT, **scalar, requires_grad=1)
    entry = _record_size(adam_entry(TENSOR_DTYPE), id=0, step=1, count=1, m=one, v=one)

    rng = np.random.default_rng(7)
    seeds = []
    count = (LARGE_LIMIT - FRAMING.sizeof() - U64_SIZE) // tensor
    arrays = [np.array(i, dtype=TENSOR_DTYPE) for i in range(count)]
    data = _write(lambda f: write_float32_state(f, arrays))
    key = report_key("float32_state", data)
    dest = ModelStateTarget(((),) * len(arrays))
    seeds.append(
        Seed("gen_tlsf32_max_records", key, "float32_state", data, dest, origin="generated")
    )
    # Adam v3: rank-0 slots, every other one tied to its predecessor (two slots, two tags and
    # one entry per pair).
    n = 2 * ((LARGE_LIMIT - 200) // (2 * slot + 2 * U64_SIZE + entry))
    reps = [i - (i % 2) for i in range(n)]
    seed = _adam_seed("gen_adam_v3_max_records", rng, [()] * n, [True] * n, reps)
    seeds.append(seed)
    # Adam v2: only frozen rank-0 slots (no entries).
    n = (LARGE_LIMIT - 100) // slot
    seed = _adam_seed("gen_adam_v2_max_frozen_slots", rng, [()] * n, [False] * n, None)
    seeds.append(seed)
    for s in seeds:
        s.cap = 40  # a read takes about a second: 40 mutations each in the systematic set
    return [s for s in seeds if len(s.data) <= LARGE_LIMIT]
