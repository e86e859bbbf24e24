"""The conformance vectors (``tests/vectors``): their folder, and manifest entries as values.

The manifest spells floats as hex binary64 bit patterns and payloads as hex of their
little-endian bytes, so every conversion here is exact: no value goes through decimal text or
float arithmetic.

Example:
    >>> schema_from_manifest({"shapes": [[2], []], "requires_grad": [True, False],
    ...                       "representatives": None}).optimizer_state_count
    1
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..codec import AdamConfig, AdamEntry, AdamKind, MomentDtype, ParameterSchema
from ..formats.primitives import bits_float, float_bits

__all__ = [
    "VECTORS_DIR",
    "vectors_dir",
    "KINDS",
    "bits_to_float",
    "float_to_bits",
    "hex_payload",
    "array_from_hex",
    "schema_from_manifest",
    "config_from_manifest",
    "entries_from_manifest",
    "float32_arrays_from_manifest",
]

#: The repository's copy of the conformance vectors (``<repo>/tests/vectors``; the package
#: root is the repository root). ``TLCKPT_VECTORS`` points the tests and campaigns elsewhere.
VECTORS_DIR = Path(__file__).resolve().parents[1] / "tests" / "vectors"


def vectors_dir() -> Path:
    """The conformance vectors folder: ``$TLCKPT_VECTORS`` if set, else :data:`VECTORS_DIR`."""
    override = os.environ.get("TLCKPT_VECTORS")
    return Path(override) if override else VECTORS_DIR


#: Manifest spelling of the update rule → :class:`AdamKind`.
KINDS = {"adam": AdamKind.ADAM, "adamw": AdamKind.ADAMW}


def bits_to_float(bits: str | int) -> float:
    """``"0x3feccccccccccccd"`` (or the int) → the binary64 float with exactly those bits."""
    return bits_float(int(bits, 16) if isinstance(bits, str) else int(bits))


def float_to_bits(x: float) -> int:
    """The binary64 bit pattern of ``x`` (``-0.0`` and NaN payloads included)."""
    return float_bits(x)


def hex_payload(array: np.ndarray) -> str:
    """Hex of an array's little-endian bytes, the manifest's payload spelling."""
    return np.ascontiguousarray(array).reshape(-1).tobytes().hex()


def array_from_hex(text: str, dtype: Any, shape: Sequence[int] | None = None) -> np.ndarray:
    """A fresh writable little-endian array holding exactly the bytes ``text`` spells."""
    dt = np.dtype(dtype).newbyteorder("<")
    array = np.frombuffer(bytes.fromhex(text), dtype=dt).copy()
    return array if shape is None else array.reshape(tuple(shape))


def schema_from_manifest(entry: Mapping[str, Any]) -> ParameterSchema:
    """``{"shapes", "requires_grad", "representatives"}`` → :class:`ParameterSchema`."""
    return ParameterSchema(
        [tuple(s) for s in entry["shapes"]], entry["requires_grad"], entry.get("representatives")
    )


def config_from_manifest(entry: Mapping[str, Any]) -> AdamConfig:
    """``{"kind", "dtype", "beta1_bits", ...}`` → :class:`AdamConfig`, bit for bit."""
    return AdamConfig(
        KINDS[entry["kind"]],
        bits_to_float(entry["beta1_bits"]),
        bits_to_float(entry["beta2_bits"]),
        bits_to_float(entry["epsilon_bits"]),
        bits_to_float(entry["weight_decay_bits"]),
        MomentDtype(entry["dtype"]),
    )


def entries_from_manifest(vector: Mapping[str, Any]) -> dict[int, AdamEntry]:
    """The ``entries[]`` of an ``adam[]`` vector as ``{slot: AdamEntry}`` with exact moments."""
    dtype = MomentDtype(vector["config"]["dtype"]).numpy
    return {
        e["id"]: AdamEntry(e["step"], array_from_hex(e["m"], dtype), array_from_hex(e["v"], dtype))
        for e in vector["entries"]
    }


def float32_arrays_from_manifest(vector: Mapping[str, Any]) -> list[np.ndarray]:
    """The tensors of a ``float32_state[]`` vector, shaped, with exact payload bits."""
    return [
        array_from_hex(payload, "<f4", shape)
        for shape, payload in zip(vector["shapes"], vector["payloads"], strict=True)
    ]
