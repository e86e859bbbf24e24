"""Seed files for the campaigns: every conformance vector, plus larger generated files.

A :class:`Seed` is a file's bytes, the format it belongs to (the report key), and the
destination a reader is given for it (schema/dtype/config, shapes, or encoding + shapes), so
that each mutated copy can be read both against its destination and by ``inspect``.

The vectors are read from ``<repo>/tests/vectors`` (override with ``TLCKPT_VECTORS``).
Generated files are written with the codec itself, deterministically (fixed seeds), one per
format and version, sized up to :data:`LARGE_LIMIT`.
"""

from __future__ import annotations

import io
import json
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]

#: Largest generated seed (the time/memory bounds are stated for inputs up to 1 MiB).
LARGE_LIMIT = 1 << 20

#: Report keys, in report order (the six formats: four Adam versions, TLSF32B, JSON).
FORMAT_KEYS = (
    "TLADAMF v2",
    "TLADAMF v3",
    "TLADAMF v4",
    "TLADAMF v5",
    "TLADAMF other",
    "TLSF32B v1",
    "TLSF32B other",
    "exact-bits JSON",
)

Reader = Callable[[Any], Any]


@dataclass
class Seed:
    """One seed file and the destination its readers expect.

    Attributes:
        name: file name (vectors) or a descriptive name (generated).
        fmt: report key, one of :data:`FORMAT_KEYS`.
        kind: ``"adam"``, ``"float32_state"`` or ``"state_bits"``.
        data: the file's bytes.
        dest: the destination: ``schema``/``dtype``/``expected_config`` (adam), ``shapes``
            (float32_state), ``shapes``/``encoding`` (state_bits).
        valid: whether the unmutated file reads successfully against ``dest``.
        origin: ``"vector"`` or ``"generated"``.
    """

    name: str
    fmt: str
    kind: str
    data: bytes
    dest: dict[str, Any] = field(default_factory=dict)
    valid: bool = True
    origin: str = "vector"
    #: At most this many systematic mutations (sampled), for seeds whose reads are slow.
    cap: int | None = None

    @property
    def binary(self) -> bool:
        return self.kind != "state_bits"


# ------------------------------------------------------------------------------ readers


def readers(seed: Seed) -> list[tuple[str, Reader]]:
    """``(label, reader)`` pairs: the destination reader, then ``inspect``.

    Each reader takes a binary file object positioned at the start of the file.
    """
    from tlckpt.codec import inspect, read_adam, read_float32_state, read_state_bits

    d = seed.dest
    if seed.kind == "adam":
        schema, dtype, config = d["schema"], d["dtype"], d.get("expected_config")

        def read(f: Any) -> Any:
            return read_adam(f, schema, dtype=dtype, expected_config=config)

        return [("read_adam", read), ("inspect", inspect)]
    if seed.kind == "float32_state":
        shapes = d["shapes"]
        return [
            ("read_float32_state", lambda f: read_float32_state(f, shapes)),
            ("inspect", inspect),
        ]
    shapes, encoding = d["shapes"], d["encoding"]
    return [
        ("read_state_bits", lambda f: read_state_bits(f, shapes, encoding)),
        ("inspect", inspect),
    ]


def adam_key(data: bytes) -> str:
    """Report key of an Adam file from its framing (``TLADAMF other`` when unknown)."""
    if data[:7] == b"TLADAMF" and len(data) >= 15:
        (version,) = struct.unpack_from("<Q", data, 7)
        if 2 <= version <= 5:
            return f"TLADAMF v{version}"
    return "TLADAMF other"


def float32_key(data: bytes) -> str:
    if data[:7] == b"TLSF32B" and len(data) >= 15 and struct.unpack_from("<Q", data, 7)[0] == 1:
        return "TLSF32B v1"
    return "TLSF32B other"


# ------------------------------------------------------------------------------ vectors


def _adam_dest(entry: dict[str, Any]) -> dict[str, Any]:
    from tlckpt.codec import MomentDtype
    from tlckpt.testing.vectors import config_from_manifest, schema_from_manifest

    dest: dict[str, Any] = {"schema": schema_from_manifest(entry["schema"])}
    if "config" in entry:  # a valid vector: its own config is the destination's
        dest["dtype"] = MomentDtype(entry["config"]["dtype"])
        dest["expected_config"] = config_from_manifest(entry["config"])
    else:
        dest["dtype"] = MomentDtype(entry.get("dtype", "float32"))
        if entry.get("expected_config"):
            dest["expected_config"] = config_from_manifest(entry["expected_config"])
    return dest


def vector_seeds(folder: Path | None = None) -> list[Seed]:
    """Every file of the manifest (valid and invalid) as a seed.

    Args:
        folder: the vectors folder (default: :func:`tlckpt.testing.vectors.vectors_dir`,
            imported here so that importing this module does not import the library before
            the atheris runner instruments it).
    """
    if folder is None:
        from tlckpt.testing.vectors import vectors_dir

        folder = vectors_dir()
    manifest = json.loads((folder / "manifest.json").read_text())
    seeds = []
    for entry in manifest["adam"]:
        data = (folder / entry["file"]).read_bytes()
        seeds.append(Seed(entry["file"], adam_key(data), "adam", data, _adam_dest(entry)))
    for entry in manifest["float32_state"]:
        data = (folder / entry["file"]).read_bytes()
        shapes = [tuple(s) for s in entry["shapes"]]
        seeds.append(
            Seed(entry["file"], float32_key(data), "float32_state", data, {"shapes": shapes})
        )
    for entry in manifest["state_bits"]:
        data = (folder / entry["file"]).read_bytes()
        dest = {"shapes": [tuple(s) for s in entry["shapes"]], "encoding": entry["encoding"]}
        seeds.append(Seed(entry["file"], "exact-bits JSON", "state_bits", data, dest))
    for entry in manifest["invalid"]:
        data = (folder / entry["file"]).read_bytes()
        kind = entry["kind"]
        if kind == "adam":
            seeds.append(
                Seed(entry["file"], adam_key(data), kind, data, _adam_dest(entry), valid=False)
            )
        elif kind == "float32_state":
            dest = {"shapes": [tuple(s) for s in entry["shapes"]]}
            seeds.append(Seed(entry["file"], float32_key(data), kind, data, dest, valid=False))
        else:
            dest = {"shapes": [tuple(s) for s in entry["shapes"]], "encoding": entry["encoding"]}
            seeds.append(Seed(entry["file"], "exact-bits JSON", kind, data, dest, valid=False))
    return seeds


# ------------------------------------------------------------------------------ generated

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
    dest = {"schema": schema, "dtype": moment, "expected_config": config}
    return Seed(name, adam_key(data), "adam", data, dest, origin="generated")


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
        dest = {"shapes": [a.shape for a in arrays]}
        seeds.append(Seed(name, float32_key(data), "float32_state", data, dest, origin="generated"))
    # Exact-bits JSON: every encoding, pretty and compact, sized to stay under the limit.
    for enc, fmt in ENCODINGS.items():
        for pretty in (True, False):
            arrays = _json_arrays(rng, fmt, large=pretty)
            data = _write(lambda f, a=arrays, e=enc, p=pretty: write_state_bits(f, a, e, pretty=p))
            shapes = [_logical_shape(a, fmt) for a in arrays]
            name = f"gen_bits_{enc}_{'pretty' if pretty else 'compact'}"
            dest = {"shapes": shapes, "encoding": enc}
            seeds.append(
                Seed(name, "exact-bits JSON", "state_bits", data, dest, origin="generated")
            )
    for s in seeds:
        if len(s.data) > LARGE_LIMIT:
            raise AssertionError(f"generated seed {s.name} is {len(s.data)} bytes")
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


def _u64(*values: int) -> bytes:
    return struct.pack(f"<{len(values)}Q", *values)


def _max_rank(header: int, tail: int, limit: int = LARGE_LIMIT) -> int:
    return (limit - header - tail) // 8


def crafted_seeds() -> list[Seed]:
    """Hand-made hostile files at the 1 MiB edge: what random mutation rarely produces.

    These are read as they are (and lightly mutated): a rank of 100k+ dims of 2^64-1 (the
    element-count check multiplies them), the same with a last dim of 0 (a valid file, which
    ``inspect`` describes), counts of 2^64-1 and 2^62, a payload that claims 2^63 bytes.
    """
    from tlckpt.codec import MomentDtype, ParameterSchema

    out: list[Seed] = []
    big = 2**64 - 1
    f32_head = b"TLSF32B" + _u64(1, 1)
    for label, limit in (("1mib", LARGE_LIMIT), ("256kib", LARGE_LIMIT // 4)):
        rank = _max_rank(len(f32_head) + 8, 8, limit)
        for dim_name, dim in (("max", big), ("two", 2)):
            data = f32_head + _u64(rank) + _u64(*([dim] * rank)) + _u64(0)
            out.append(
                Seed(
                    f"crafted_tlsf32_rank{rank}_dims_{dim_name}_{label}",
                    "TLSF32B v1",
                    "float32_state",
                    data,
                    {"shapes": [(2,)]},
                    valid=False,
                    origin="crafted",
                )
            )
        # Valid: one zero dim makes the element count 0, so the file reads, and describing
        # it must not multiply the other dims out either.
        data = f32_head + _u64(rank) + _u64(*([big] * (rank - 1) + [0])) + _u64(0)
        shape = (big,) * (rank - 1) + (0,)
        name = f"crafted_tlsf32_rank{rank}_dims_max_last_zero_{label}"
        out.append(
            Seed(name, "TLSF32B v1", "float32_state", data, {"shapes": [shape]}, origin="crafted")
        )
    out.append(
        Seed(
            "crafted_tlsf32_count_max",
            "TLSF32B v1",
            "float32_state",
            b"TLSF32B" + _u64(1, big),
            {"shapes": [()]},
            valid=False,
            origin="crafted",
        )
    )
    out.append(
        Seed(
            "crafted_tlsf32_payload_2^62",
            "TLSF32B v1",
            "float32_state",
            f32_head + _u64(1, 2**62, 2**62) + b"\0" * 64,
            {"shapes": [(2**62,)]},
            valid=False,
            origin="crafted",
        )
    )
    # Adam: one slot whose rank fills the file, dims 2^64-1; v2 and v3 (+representatives).
    config = struct.pack("<4d", 0.9, 0.999, 1e-8, 0.0)
    dest = {"schema": ParameterSchema([(2,)], [True]), "dtype": MomentDtype.FLOAT32}
    for version, label, limit in ((2, "1mib", LARGE_LIMIT), (3, "256kib", LARGE_LIMIT // 4)):
        head = b"TLADAMF" + _u64(version, 0) + config + _u64(1)
        tail = _u64(0, 1) + (_u64(1) if version >= 3 else b"") + _u64(0)
        rank = _max_rank(len(head) + 8, len(tail), limit)
        data = head + _u64(rank) + _u64(*([big] * rank)) + tail
        out.append(
            Seed(
                f"crafted_adam_v{version}_rank{rank}_dims_max_{label}",
                f"TLADAMF v{version}",
                "adam",
                data,
                dest,
                valid=False,
                origin="crafted",
            )
        )
    # Adam: a slot of 2^61 elements whose entry claims 2^63 payload bytes.
    schema = ParameterSchema([(2**61,)], [True])
    data = (
        b"TLADAMF"
        + _u64(2, 0)
        + config
        + _u64(1, 1, 2**61, 2**61, 1)
        + _u64(1)
        + _u64(0, 1, 2**61)
        + b"\0" * 64
    )
    out.append(
        Seed(
            "crafted_adam_v2_payload_2^63",
            "TLADAMF v2",
            "adam",
            data,
            {"schema": schema, "dtype": MomentDtype.FLOAT32},
            valid=False,
            origin="crafted",
        )
    )
    # Adam: slot_count 2^64-1; entry_count 2^64-1 after a valid empty schema.
    out.append(
        Seed(
            "crafted_adam_v2_slots_max",
            "TLADAMF v2",
            "adam",
            b"TLADAMF" + _u64(2, 0) + config + _u64(big),
            dest,
            valid=False,
            origin="crafted",
        )
    )
    for seed in out:
        seed.cap = 3
    return out


def max_record_seeds() -> list[Seed]:
    """Valid files with as many records as 1 MiB holds (per-record cost at its worst)."""
    from tlckpt.codec import write_adam, write_float32_state

    rng = np.random.default_rng(7)
    seeds = []
    arrays = [np.array(i, dtype="<f4") for i in range((LARGE_LIMIT - 23) // 20)]
    data = _write(lambda f: write_float32_state(f, arrays))
    seeds.append(
        Seed(
            "gen_tlsf32_max_records",
            float32_key(data),
            "float32_state",
            data,
            {"shapes": [()] * len(arrays)},
            origin="generated",
        )
    )
    # Adam v3: rank-0 slots, every other one tied to its predecessor (56+24 bytes per pair).
    n = 2 * ((LARGE_LIMIT - 200) // (2 * 24 + 2 * 8 + 32))
    reps = [i - (i % 2) for i in range(n)]
    seed = _adam_seed("gen_adam_v3_max_records", rng, [()] * n, [True] * n, reps)
    seeds.append(seed)
    # Adam v2: only frozen rank-0 slots (24 bytes each, no entries).
    n = (LARGE_LIMIT - 100) // 24
    seed = _adam_seed("gen_adam_v2_max_frozen_slots", rng, [()] * n, [False] * n, None)
    seeds.append(seed)
    _ = write_adam  # the writer is exercised through _adam_seed
    for s in seeds:
        s.cap = 40  # a read takes about a second: 40 mutations each in the systematic set
    return [s for s in seeds if len(s.data) <= LARGE_LIMIT]


def all_seeds() -> list[Seed]:
    """Vectors first, then generated, max-record and crafted seeds."""
    return vector_seeds() + generated_seeds() + max_record_seeds() + crafted_seeds()
