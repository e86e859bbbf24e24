"""Mutation tests: damaged and hostile files are rejected with the right class, fast, small.

Real files (the conformance vectors and files the codec writes, tlckpt's own ``TLCKOPT``
optimizer family included) are cut at every byte,
extended, flipped byte by byte, spliced at random and have every u64 field replaced by edge
values. Reading untrusted bytes may only succeed or raise a :class:`CheckpointError` whose
``offset`` lies within the file. Headers announcing 2^62 of anything in a 1 KiB file are
rejected at once, without a large allocation (``test_mutation_headers.py``).
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mutation_support import (
    EDGE_U64,
    SPLICE_EXAMPLES,
    U64,
    adam_reader,
    attempt,
    f32_reader,
    outcome,
    u64,
)

from tlckpt.codec import (
    AdamEntry,
    AdamKind,
    CheckpointError,
    MomentDtype,
    OptimizerEntry,
    ParameterSchema,
    ParamGroupConfig,
    TrailingDataError,
    TruncatedError,
    inspect,
    read_optimizer_state,
    write_adam,
    write_float32_state,
    write_optimizer_state,
)
from tlckpt.testing.adam import adamw_config
from tlckpt.testing.strategies import byte_splices
from tlckpt.testing.vectors import schema_from_manifest, vectors_dir

# The same folder as conftest.VECTORS_DIR (module-level samples need it at import time).
VECTORS_DIR = vectors_dir()


# ------------------------------------------------------------------------------ samples


class Sample:
    """A valid file, the reader that checks it against its destination, and the writer that
    turns what was read back into bytes (``None`` where the file's entry order differs from
    the writer's increasing-id order, so the bytes need not match)."""

    def __init__(
        self,
        name: str,
        data: bytes,
        read: Callable[[Any], Any],
        rewrite: Callable[[Any], bytes | None],
    ):
        self.name = name
        self.data = data
        self.read = read
        self.rewrite = rewrite

    def __repr__(self) -> str:
        return self.name


def _adam_rewrite(schema: ParameterSchema) -> Callable[[Any], bytes | None]:
    def rewrite(ckpt: Any) -> bytes | None:
        if list(ckpt.entries) != sorted(ckpt.entries):  # kept in file order
            return None
        buffer = io.BytesIO()
        args = (schema, ckpt.config, ckpt.entries, ckpt.random_counter)
        write_adam(buffer, *args, version=ckpt.version)
        return buffer.getvalue()

    return rewrite


def _f32_rewrite(arrays: list[np.ndarray]) -> bytes:
    buffer = io.BytesIO()
    write_float32_state(buffer, arrays)
    return buffer.getvalue()


def _own_reader(schema: ParameterSchema, groups, slot_groups, dtypes) -> Callable[[Any], Any]:
    return lambda src: read_optimizer_state(
        src, schema, groups=groups, slot_groups=slot_groups, dtypes=dtypes
    )


def _own_rewrite(schema: ParameterSchema) -> Callable[[Any], bytes | None]:
    def rewrite(ckpt: Any) -> bytes:
        buffer = io.BytesIO()
        args = (ckpt.groups, ckpt.slot_groups, ckpt.entries, ckpt.random_counter)
        write_optimizer_state(buffer, schema, *args)
        return buffer.getvalue()

    return rewrite


def _own_samples() -> Iterator[Sample]:
    """``TLCKOPT`` files: two groups (one with amsgrad), a slot without state, tied, frozen,
    scalar and zero-size slots, moments of each of the four dtypes."""
    schema = ParameterSchema(
        [(2, 3), (2, 3), (4,), (), (0, 5), (3,), (2,)],
        [True, True, False, True, True, True, True],
        [0, 0, None, 3, 4, 5, 6],
    )
    groups = (
        ParamGroupConfig(AdamKind.ADAMW, 0.9, 0.999, 1e-8, 0.01, 1e-3),
        ParamGroupConfig(AdamKind.ADAM, 0.8, 0.95, 0.0, 0.5, 2e-3, amsgrad=True, maximize=True),
    )
    slot_groups = (0, None, None, 1, 0, 1, 0)
    rng = np.random.default_rng(11)
    words = {"float32": "<f4", "float64": "<f8", "bfloat16": "<u2", "float16": "<f2"}

    def moments(n: int, dtype: str, count: int) -> list[np.ndarray]:
        return [rng.integers(0, 2**16, n).astype(words[dtype]) for _ in range(count)]

    entries = {
        0: OptimizerEntry(3, "bfloat16", *moments(6, "bfloat16", 2)),
        3: OptimizerEntry(2**64 - 1, "float64", *moments(1, "float64", 3)),
        4: OptimizerEntry(1, "float32", *moments(0, "float32", 2)),
        5: OptimizerEntry(7, "float16", *moments(3, "float16", 3)),
    }  # slot 6 trainable, no state
    dtypes = tuple(entries[i].dtype if i in entries else None for i in range(len(schema)))
    for counter in (None, 2**64 - 1):
        buffer = io.BytesIO()
        write_optimizer_state(buffer, schema, groups, slot_groups, entries, counter)
        reader = _own_reader(schema, groups, slot_groups, dtypes)
        name = f"written_tlckopt_counter{counter}"
        yield Sample(name, buffer.getvalue(), reader, _own_rewrite(schema))
    # Version 2: frozen slot 2 kept its state (amsgrad's group: three moments).
    frozen_groups = (0, None, 1, 1, 0, 1, 0)
    kept = {**entries, 2: OptimizerEntry(5, "float32", *moments(4, "float32", 3))}
    buffer = io.BytesIO()
    assert write_optimizer_state(buffer, schema, groups, frozen_groups, kept, 12) == 2
    dtypes = tuple(kept[i].dtype if i in kept else None for i in range(len(schema)))
    reader = _own_reader(schema, groups, frozen_groups, dtypes)
    yield Sample("written_tlckopt_v2_frozen_state", buffer.getvalue(), reader, _own_rewrite(schema))


def _written_samples() -> Iterator[Sample]:
    """Files the codec itself writes: every version, frozen/tied/scalar/zero-size slots."""
    schema = ParameterSchema(
        [(2, 3), (2, 3), (4,), (), (0, 5), (3,)],
        [True, True, False, True, True, True],
        [0, 0, None, 3, 4, 5],
    )
    plain = ParameterSchema([(3,), (), (2, 2)], [True, False, True])
    rng = np.random.default_rng(7)
    for dtype in MomentDtype:
        config = adamw_config(dtype)
        for sch in (schema, plain):
            entries = {
                slot: AdamEntry(
                    slot + 1,
                    rng.standard_normal(sch.element_count(slot)).astype(dtype.numpy),
                    rng.random(sch.element_count(slot)).astype(dtype.numpy),
                )
                for slot in sch.representative_slots
            }
            for counter in (None, 2**64 - 1):
                buffer = io.BytesIO()
                version = write_adam(buffer, sch, config, entries, counter)
                name = f"written_v{version}_{dtype.value}_{len(sch)}slots_counter{counter}"
                yield Sample(name, buffer.getvalue(), adam_reader(sch, dtype), _adam_rewrite(sch))
    arrays = [
        rng.standard_normal((2, 3)).astype("<f4"),
        np.array(3.5, "<f4"),
        np.zeros((0, 4), "<f4"),
        np.array([np.nan, -0.0, np.inf], "<f4"),
    ]
    buffer = io.BytesIO()
    write_float32_state(buffer, arrays)
    shapes = [a.shape for a in arrays]
    yield Sample("written_tlsf32", buffer.getvalue(), f32_reader(shapes), _f32_rewrite)


def _vector_samples() -> Iterator[Sample]:
    import json

    manifest = json.loads((VECTORS_DIR / "manifest.json").read_text())
    for e in manifest["adam"]:
        schema = schema_from_manifest(e["schema"])
        reader = adam_reader(schema, MomentDtype(e["config"]["dtype"]))
        data = (VECTORS_DIR / e["file"]).read_bytes()
        yield Sample(e["file"], data, reader, _adam_rewrite(schema))
    for e in manifest["float32_state"]:
        data = (VECTORS_DIR / e["file"]).read_bytes()
        yield Sample(e["file"], data, f32_reader(e["shapes"]), _f32_rewrite)


SAMPLES = [*_vector_samples(), *_written_samples(), *_own_samples()]
SAMPLE_IDS = [s.name for s in SAMPLES]


# ---------------------------------------------------------------- independent field walk


def _fields(data: bytes) -> tuple[list[tuple[int, str]], list[tuple[int, int]]]:
    """(offset, name) of every 8-byte field, and the (offset, size) payload spans.

    Written from FORMAT.md alone (not from the specs or the codec), for valid files.
    """
    fields: list[tuple[int, str]] = []
    payloads: list[tuple[int, int]] = []
    pos = 7

    def take(name: str) -> int:
        nonlocal pos
        (value,) = U64.unpack_from(data, pos)
        fields.append((pos, name))
        pos += 8
        return value

    def schema(representatives: bool) -> int:
        """The schema block (FORMAT.md §2), then the representatives block if the version
        has one; the slot count."""
        slots = take("slot_count")
        for s in range(slots):
            for j in range(take(f"s{s}.rank")):
                take(f"s{s}.dims[{j}]")
            take(f"s{s}.element_count")
            take(f"s{s}.requires_grad")
        if representatives:
            for s in range(slots):
                take(f"representatives[{s}]")
        return slots

    version = take("version")
    if data[:7] == b"TLCKOPT":
        # counter flag and counter; groups (kind, five binary64, two flags); schema block,
        # representatives, slot groups; entries (id, step, dtype tag, count, m, v, and
        # max_exp_avg_sq where the entry's group has amsgrad).
        if take("counter_flag"):
            take("random_counter")
        amsgrad = []
        for g in range(take("group_count")):
            for name in ("kind", "beta1", "beta2", "epsilon", "weight_decay", "lr"):
                take(f"g{g}.{name}")
            amsgrad.append(take(f"g{g}.amsgrad"))
            take(f"g{g}.maximize")
        slots = schema(representatives=True)
        tags = [take(f"slot_groups[{s}]") for s in range(slots)]
        for e in range(take("entry_count")):
            slot = take(f"e{e}.id")
            take(f"e{e}.step")
            itemsize = {0: 4, 1: 8, 2: 2, 3: 2}[take(f"e{e}.dtype_tag")]
            count = take(f"e{e}.count")
            size = (3 if amsgrad[tags[slot] - 1] else 2) * itemsize * count
            payloads.append((pos, size))
            pos += size
        return fields, payloads
    if data[:7] == b"TLSF32B":
        for t in range(take("tensor_count")):
            rank = take(f"t{t}.rank")
            for j in range(rank):
                take(f"t{t}.dims[{j}]")
            count = take(f"t{t}.element_count")
            payloads.append((pos, 4 * count))
            pos += 4 * count
        return fields, payloads
    itemsize = 4
    if version == 5:
        itemsize = 8 if take("dtype_tag") == 1 else 4
    take("kind")
    for name in ("beta1", "beta2", "epsilon", "weight_decay"):
        take(name)
    flag = take("counter_flag") if version == 5 else int(version == 4)
    if flag:
        take("random_counter")
    schema(representatives=version >= 3)
    for e in range(take("entry_count")):
        take(f"e{e}.id")
        take(f"e{e}.step")
        count = take(f"e{e}.count")
        payloads.append((pos, 2 * itemsize * count))
        pos += 2 * itemsize * count
    return fields, payloads


@pytest.mark.parametrize("sample", SAMPLES, ids=SAMPLE_IDS)
def test_field_walk_covers_the_file(sample: Sample) -> None:
    fields, payloads = _fields(sample.data)
    covered = 7 + 8 * len(fields) + sum(size for _, size in payloads)
    assert covered == len(sample.data)


# ------------------------------------------------------------------------------ helpers


def _both(sample: Sample, data: bytes) -> list[CheckpointError | None]:
    return [outcome(sample.read, data), outcome(inspect, data)]


# -------------------------------------------------------------------------- truncation


@pytest.mark.parametrize("sample", SAMPLES, ids=SAMPLE_IDS)
def test_every_truncation_is_a_truncated_error(sample: Sample) -> None:
    data = sample.data
    for k in range(len(data)):
        exc = outcome(sample.read, data[:k])
        assert type(exc) is TruncatedError, (k, exc)
        assert exc.offset <= k
        if k >= 7:  # past the magic inspect knows the family: same verdict
            exc = outcome(inspect, data[:k])
            assert type(exc) is TruncatedError, (k, exc)


@pytest.mark.parametrize("sample", SAMPLES[:1] + SAMPLES[-1:], ids=[SAMPLE_IDS[0], SAMPLE_IDS[-1]])
def test_truncation_inside_the_framing_is_truncated_for_inspect(sample: Sample) -> None:
    """A file that ends inside a known magic or the version is a truncated checkpoint, for
    ``inspect`` as for the readers (FORMAT.md §1: reading hits end-of-file early)."""
    for k in range(1, 7):
        exc = outcome(inspect, sample.data[:k])
        assert type(exc) is TruncatedError, (k, exc)


def test_truncated_real_files(tmp_path: Path) -> None:
    """Through real files too (sizes come from fstat there, not from seeking)."""
    sample = SAMPLES[0]
    path = tmp_path / "cut.tladam"
    for k in range(0, len(sample.data), 7):
        path.write_bytes(sample.data[:k])
        with pytest.raises(TruncatedError) as info:
            sample.read(path)
        assert info.value.path == str(path)
        assert 0 <= info.value.offset <= k


# ---------------------------------------------------------------------- trailing bytes


@pytest.mark.parametrize("sample", SAMPLES, ids=SAMPLE_IDS)
@pytest.mark.parametrize("extra", [b"\x00", b"\xff" * 8, b"TLADAMF", None], ids=str)
def test_appended_bytes_are_trailing_data(sample: Sample, extra: bytes | None) -> None:
    tail = sample.data if extra is None else extra  # None: the file twice
    for exc in _both(sample, sample.data + tail):
        assert type(exc) is TrailingDataError, exc
        assert exc.offset == len(sample.data)


# ------------------------------------------------------------------------- byte flips


@pytest.mark.parametrize("sample", SAMPLES, ids=SAMPLE_IDS)
def test_every_single_byte_flip(sample: Sample) -> None:
    """Each flip: a CheckpointError with an offset, or a read that is exactly the file (written
    back, it gives the same bytes: nothing was silently ignored or normalised)."""
    data = bytearray(sample.data)
    for i in range(len(data)):
        for mask in (0xFF, 0x01, 0x80):
            data[i] ^= mask
            mutated = bytes(data)
            result = attempt(sample.read, mutated)
            if not isinstance(result, CheckpointError):
                again = sample.rewrite(result)
                assert again is None or again == mutated, f"byte {i} ^ {mask:#x}"
            outcome(inspect, mutated)
            data[i] ^= mask


@settings(
    max_examples=SPLICE_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(st.data())
def test_random_splices(data: st.DataObject) -> None:
    sample = data.draw(st.sampled_from(SAMPLES), label="sample")
    mutated = data.draw(byte_splices(sample.data), label="mutated")
    _both(sample, mutated)


# ------------------------------------------------------------------ u64 fields at edges


@pytest.mark.parametrize("sample", SAMPLES, ids=SAMPLE_IDS)
def test_every_u64_field_at_edge_values(sample: Sample) -> None:
    fields, _ = _fields(sample.data)
    data = bytearray(sample.data)
    for offset, name in fields:
        original = bytes(data[offset : offset + 8])
        for value in EDGE_U64:
            data[offset : offset + 8] = u64(value)
            try:
                _both(sample, bytes(data))
            except AssertionError as exc:
                raise AssertionError(f"{name} at {offset} = {value}: {exc}") from None
        data[offset : offset + 8] = original
