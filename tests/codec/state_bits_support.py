"""Helpers shared by the exact-bits JSON tests (``test_state_bits*.py``): the float32 tag, a
document of given state entries, and a read of in-memory bytes."""

from __future__ import annotations

import io
import json
from typing import Any

from tlckpt.codec.model_state.state_bits import read_state_bits

F32 = "torchlean_state_float32_bits_v1"


def doc(*state: Any, tag: str = F32) -> bytes:
    """The bytes of a state-bits document with these state entries."""
    return json.dumps({"format": tag, "state": list(state)}).encode()


def read_bytes(data: bytes, shapes: list[list[int]], encoding: str = "float32") -> list[Any]:
    """``read_state_bits`` on in-memory ``data``."""
    return read_state_bits(io.BytesIO(data), shapes, encoding)
