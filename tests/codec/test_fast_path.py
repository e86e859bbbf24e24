"""The fast path the codec derives from the specs agrees with construct's interpreter.

Runs of fixed fields decoded by precompiled ``struct``s, record headers compared as bytes
against the destination's, and headers cached on write must give exactly what parsing
and building field by field through construct gives: the same values, the same bytes and
the same errors (class, offset, field and message).
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tlckpt.codec import (
    CheckpointError,
    MomentDtype,
    read_adam,
    read_float32_state,
    validate_float32_state,
    write_adam,
    write_float32_state,
)
from tlckpt.codec.float32_state import read_float32_payloads
from tlckpt.codec.inspection import inspect
from tlckpt.codec.walker import interpreted
from tlckpt.testing import strategies as tls
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
