"""The fast path the codec derives from the specs agrees with construct's interpreter.

Runs of fixed fields decoded by precompiled ``struct``s, record headers compared as bytes
against the destination's, headers cached on write, and runs of alike records scanned in
batches must give exactly what parsing and building field by field through construct gives:
the same values, the same bytes and the same errors (class, offset, field and message).
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tlckpt.codec import (
    AdamEntry,
    CheckpointError,
    MomentDtype,
    ParameterSchema,
    read_adam,
    read_float32_state,
    scan_adam,
    scan_float32_state,
    validate_float32_state,
    write_adam,
    write_float32_state,
)
from tlckpt.codec.inspection import inspect
from tlckpt.codec.model_state.float32_state import read_float32_payloads
from tlckpt.codec.spec import batches, walker
from tlckpt.codec.spec.plan import interpreted
from tlckpt.testing import strategies as tls
from tlckpt.testing.adam import adamw_config
from tlckpt.testing.vectors import config_from_manifest, schema_from_manifest, vectors_dir

VECTORS = vectors_dir()


def _outcome(read: Callable[[], Any]) -> tuple[str, Any]:
    """What a read gives: ("ok", comparable value) or ("error", class, offset, field, text)."""
    try:
        return ("ok", _comparable(read()))
    except CheckpointError as exc:
        return ("error", (type(exc).__name__, exc.offset, exc.field, str(exc)))


def _comparable(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return (value.dtype.str, value.shape, value.tobytes())
    if isinstance(value, dict):
        return {k: _comparable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_comparable(v) for v in value]
    if hasattr(value, "__dataclass_fields__"):
        return {k: _comparable(getattr(value, k)) for k in value.__dataclass_fields__}
    return value


def _both(read: Callable[[], Any]) -> tuple[Any, Any]:
    fast = _outcome(read)
    with interpreted():
        slow = _outcome(read)
    return fast, slow


def _binary_vectors() -> list[dict[str, Any]]:
    import json

    manifest = json.loads((VECTORS / "manifest.json").read_text())
    out = [dict(v, kind="adam") for v in manifest["adam"]]
    out += [dict(v, kind="float32_state") for v in manifest["float32_state"]]
    out += [v for v in manifest["invalid"] if v["kind"] in ("adam", "float32_state")]
    return out


def _reader(vector: dict[str, Any], data: bytes) -> Callable[[], Any]:
    if vector["kind"] == "adam":
        schema = schema_from_manifest(vector["schema"])
        dtype = MomentDtype(vector.get("dtype") or vector["config"]["dtype"])
        expected = vector.get("expected_config")
        config = config_from_manifest(expected) if expected else None
        return lambda: read_adam(io.BytesIO(data), schema, dtype=dtype, expected_config=config)
    return lambda: read_float32_state(io.BytesIO(data), vector["shapes"])


@pytest.mark.parametrize("vector", _binary_vectors(), ids=lambda v: v["file"])
def test_vectors_agree(vector: dict[str, Any]) -> None:
    data = (VECTORS / vector["file"]).read_bytes()
    fast, slow = _both(_reader(vector, data))
    assert fast == slow
    fast, slow = _both(lambda: inspect(io.BytesIO(data)))
    assert fast == slow


@pytest.mark.parametrize("vector", _binary_vectors(), ids=lambda v: v["file"])
def test_every_truncation_agrees(vector: dict[str, Any]) -> None:
    data = (VECTORS / vector["file"]).read_bytes()
    for cut in range(len(data)):
        fast, slow = _both(_reader(vector, data[:cut]))
        assert fast == slow, cut


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(state=tls.adam_states(), data=st.data())
def test_adam_files_agree(state: Any, data: st.DataObject) -> None:
    fast_out, slow_out = io.BytesIO(), io.BytesIO()
    write_adam(fast_out, state.schema, state.config, state.entries, state.random_counter)
    with interpreted():
        write_adam(slow_out, state.schema, state.config, state.entries, state.random_counter)
    assert fast_out.getvalue() == slow_out.getvalue()
    blob = bytearray(fast_out.getvalue())
    if blob:  # one mutated byte: both parsers must say the same thing about it
        at = data.draw(st.integers(0, len(blob) - 1))
        blob[at] ^= data.draw(st.integers(1, 255))
    schema, dtype = state.schema, state.config.dtype
    fast, slow = _both(lambda: read_adam(io.BytesIO(bytes(blob)), schema, dtype=dtype))
    assert fast == slow


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(arrays=tls.float32_states(), data=st.data())
def test_float32_files_agree(arrays: list[np.ndarray], data: st.DataObject) -> None:
    fast_out, slow_out = io.BytesIO(), io.BytesIO()
    write_float32_state(fast_out, arrays)
    with interpreted():
        write_float32_state(slow_out, arrays)
    assert fast_out.getvalue() == slow_out.getvalue()
    shapes = [a.shape for a in arrays]
    blob = bytearray(fast_out.getvalue())
    at = data.draw(st.integers(0, len(blob) - 1))
    blob[at] ^= data.draw(st.integers(1, 255))
    fast, slow = _both(lambda: read_float32_state(io.BytesIO(bytes(blob)), shapes))
    assert fast == slow


def test_two_pass_payload_read_matches_one_pass() -> None:
    rng = np.random.default_rng(3)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in [(3, 4), (0,), (), (5,)] * 3]
    blob = io.BytesIO()
    write_float32_state(blob, arrays)
    shapes = [a.shape for a in arrays]
    blob.seek(0)
    layout = validate_float32_state(blob, shapes)
    assert layout.shapes == tuple(shapes)

    class Collect:
        def __init__(self) -> None:
            self.got: dict[int, np.ndarray] = {}

        def buffer(self, record: int, field: str, count: int, dtype: np.dtype) -> Any:
            return None if record == 1 else np.empty(count, dtype)

        def done(self, record: int, field: str, buffer: Any) -> None:
            self.got[record] = buffer

    sink = Collect()
    read_float32_payloads(blob, layout, sink)
    assert sorted(sink.got) == [i for i in range(len(arrays)) if i != 1]
    for i, values in sink.got.items():
        assert values.tobytes() == arrays[i].tobytes()


# ------------------------------------------------------------ batched record scanning
#
# Readers that skip payloads (inspect, scan_adam, scan_float32_state) take runs of alike
# records in batches (codec/spec/batches.py). The settings below make batches small and chunks
# tiny, so that the vectors and small files go through batches, runs that end, runs cut by
# a chunk's end, and declined batches — and every outcome must equal the interpreted one.


@contextlib.contextmanager
def _batch_settings(min_batch: int, chunk: int) -> Iterator[None]:
    saved = walker.MIN_BATCH, batches.CHUNK_BYTES
    walker.MIN_BATCH, batches.CHUNK_BYTES = min_batch, chunk
    try:
        yield
    finally:
        walker.MIN_BATCH, batches.CHUNK_BYTES = saved


BATCH_SETTINGS = [(2, 64), (3, 1 << 20)]


def _scans(data: bytes) -> list[Callable[[], Any]]:
    family = "adam" if data.startswith(b"TLADAMF") else "float32_state"
    scan = scan_adam if family == "adam" else scan_float32_state
    return [lambda: inspect(io.BytesIO(data)), lambda: scan(io.BytesIO(data))]


def _scans_agree(data: bytes, settings: list[tuple[int, int]]) -> None:
    for read in _scans(data):
        with interpreted():
            slow = _outcome(read)
        for setting in settings:
            with _batch_settings(*setting):
                fast = _outcome(read)
            assert fast == slow, setting


def _alike_state() -> bytes:
    shapes = [(0,)] * 5 + [(1,)] * 4 + [(2, 3), (3, 2)] + [()] * 3 + [(0, 4)] * 2
    arrays = [np.full(s, i, "<f4") for i, s in enumerate(shapes)]
    out = io.BytesIO()
    write_float32_state(out, arrays)
    return out.getvalue()


def _alike_adam(version: int) -> bytes:
    schema = ParameterSchema(
        [(1,)] * 6 + [(2,)] * 3 + [(1,)] * 2,
        [True] * 4 + [False] + [True] * 6,
        None if version == 2 else [0, 1, 0, 3, None, 5, 6, 7, 8, 9, 10],
    )
    config = adamw_config()
    entries = {
        slot: AdamEntry(
            slot + 1,
            np.full(schema.element_count(slot), slot, "<f4"),
            np.ones(schema.element_count(slot), "<f4"),
        )
        for slot in schema.representative_slots
    }
    out = io.BytesIO()
    write_adam(out, schema, config, entries, 7 if version == 4 else None, version=version)
    return out.getvalue()


def _varied_state() -> bytes:
    """Shapes that change from each record to the next (no run of alike records), headers
    of three sizes, a shape met again after others, and a one-record run at the end."""
    shapes = [(0,), (1, 2), (2, 0, 1), (3,), (1, 2), (0,), (2, 0, 1), (), (1,), (0, 0)]
    arrays = [np.full(s, i, "<f4") for i, s in enumerate(shapes)]
    out = io.BytesIO()
    write_float32_state(out, arrays)
    return out.getvalue()


ALIKE = {
    "state": _alike_state(),
    "varied": _varied_state(),
    "adam_v2": _alike_adam(2),
    "adam_v4": _alike_adam(4),
}


@pytest.mark.parametrize("vector", _binary_vectors(), ids=lambda v: v["file"])
def test_batched_scans_of_vectors_agree(vector: dict[str, Any]) -> None:
    data = (VECTORS / vector["file"]).read_bytes()
    _scans_agree(data, BATCH_SETTINGS)


@pytest.mark.parametrize("name", sorted(ALIKE))
def test_batched_scans_agree_on_every_truncation_and_byte(name: str) -> None:
    data = ALIKE[name]
    _scans_agree(data, BATCH_SETTINGS)
    for cut in range(len(data)):
        _scans_agree(data[:cut], BATCH_SETTINGS)
    for at in range(len(data)):
        blob = bytearray(data)
        blob[at] ^= 0x01 if at % 2 else 0x80  # a small and a large change, byte by byte
        _scans_agree(bytes(blob), BATCH_SETTINGS)


@pytest.mark.parametrize("name", sorted(ALIKE))
def test_batches_are_taken(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The files above do go through batches (else the tests above would prove nothing)."""
    taken: list[tuple[Any, int]] = []
    real = walker.Visitor.on_records

    def spy(cls: type) -> None:
        original = cls.on_records

        def on_records(self: Any, path: Any, batch: Any) -> bool:
            accepted = original(self, path, batch)
            if accepted:
                taken.append((path, batch.count))
            return accepted

        monkeypatch.setattr(cls, "on_records", on_records)

    from tlckpt.codec.model_state.float32_state import _StateReader
    from tlckpt.codec.optimizers.adam import _AdamReader

    spy(_AdamReader)
    spy(_StateReader)
    assert real is walker.Visitor.on_records
    with _batch_settings(2, 64):
        for read in _scans(ALIKE[name]):
            read()
    paths = {path for path, _ in taken}
    want = {("tensors",)} if name in ("state", "varied") else {("schema", "slots"), ("entries",)}
    assert paths == want, taken
    if name == "varied":  # records of changing layouts: batches of decoded headers
        assert max(count for _, count in taken) >= 4, taken


@pytest.mark.parametrize("settings", BATCH_SETTINGS)
def test_batched_scan_of_a_file_inside_a_larger_one(settings: tuple[int, int]) -> None:
    """A file object positioned after other bytes: offsets stay absolute."""
    data = b"\0" * 13 + ALIKE["state"] + b"tail"
    for read_with in (inspect, scan_float32_state):

        def read(read_with: Callable[[Any], Any] = read_with) -> Any:
            f = io.BytesIO(data)
            f.seek(13)
            return read_with(f)

        with interpreted():
            slow = _outcome(read)
        with _batch_settings(*settings):
            fast = _outcome(read)
        assert fast == slow
        assert slow[0] == "error" and slow[1][0] == "TrailingDataError"


def _zeros_file(shapes: list[tuple[int, ...]]) -> bytes:
    """A file of zero tensors of ``shapes``, checked to scan and inspect to them (with
    default settings)."""
    blob = io.BytesIO()
    write_float32_state(blob, (np.zeros(s, "<f4") for s in shapes), count=len(shapes))
    data = blob.getvalue()
    assert scan_float32_state(io.BytesIO(data)) == shapes
    info = inspect(io.BytesIO(data))
    assert [tuple(t["shape"]) for t in info["tensors"]] == shapes
    return data


def test_many_alike_records_scan_as_they_read() -> None:
    """Runs longer than a chunk, with default settings, and a record that breaks the run."""
    shapes = [(0,)] * 50_000 + [(1,)] * 30_000 + [(2,)] + [(0,)] * 20_000
    data = _zeros_file(shapes)
    bad = bytearray(data)
    at = len(data) - 24 * 10_000 + 16  # element_count of a record in the last run
    bad[at] = 1
    fast = _outcome(lambda: scan_float32_state(io.BytesIO(bytes(bad))))
    assert fast[0] == "error" and fast[1][0] == "SchemaMismatchError", fast
    assert fast[1][1] == at


def test_many_varied_records_scan_as_they_walk() -> None:
    """Records of changing shapes, more than a chunk of them, with default settings: the
    batches of decoded headers give the shapes and the error (at its offset) of the walk."""
    shapes = [(i % 3,) if i % 2 else (1, i % 4, 2) for i in range(60_000)]
    data = _zeros_file(shapes)
    bad = bytearray(data)
    bad[len(data) - 100] ^= 0x40  # near the end: a header or a payload of a late record
    bad[len(data) // 2] ^= 0x04  # and in the middle
    read = lambda: scan_float32_state(io.BytesIO(bytes(bad)))  # noqa: E731
    with interpreted():
        slow = _outcome(read)
    assert slow[0] == "error" and slow[1][2] == "tensors[29999].element_count", slow
    assert _outcome(read) == slow


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    shapes=st.lists(st.sampled_from([(0,), (1,), (2,), (), (1, 1), (2, 0, 1)]), max_size=40),
    data=st.data(),
)
def test_batched_scans_of_mutated_states_agree(shapes: list, data: st.DataObject) -> None:
    blob = io.BytesIO()
    write_float32_state(blob, [np.full(s, 1.5, "<f4") for s in shapes])
    raw = bytearray(blob.getvalue())
    for _ in range(data.draw(st.integers(0, 2))):
        at = data.draw(st.integers(0, len(raw) - 1))
        raw[at] = data.draw(st.integers(0, 255))
    _scans_agree(bytes(raw), [data.draw(st.sampled_from(BATCH_SETTINGS))])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    state=tls.adam_states(schemas=tls.parameter_schemas(max_slots=24, max_rank=1)), data=st.data()
)
def test_batched_scans_of_mutated_adam_files_agree(state: Any, data: st.DataObject) -> None:
    blob = io.BytesIO()
    write_adam(blob, state.schema, state.config, state.entries, state.random_counter)
    raw = bytearray(blob.getvalue())
    for _ in range(data.draw(st.integers(0, 2))):
        at = data.draw(st.integers(0, len(raw) - 1))
        raw[at] = data.draw(st.integers(0, 255))
    _scans_agree(bytes(raw), [data.draw(st.sampled_from(BATCH_SETTINGS))])
