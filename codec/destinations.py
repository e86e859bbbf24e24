"""Destinations: what a load expects of a file, and their JSON description.

A destination is what a reader is given besides the file: an optimizer's parameter schema,
moment dtype and bound config (:class:`AdamTarget`), or a model's tensor shapes and scalar
type (:class:`ModelStateTarget`). Each family handler (:mod:`.families`) derives one from a
reference file of its own and checks a file against one; ``tlckpt validate --against`` also
reads them from a JSON description, in the vocabulary of the conformance manifest's
``invalid[]`` entries::

    {"kind": "adam",
     "schema": {"shapes": [[2, 3], [4], []], "requires_grad": [true, false, true],
                "representatives": null},
     "dtype": "float32",
     "expected_config": {"kind": "adamw", "dtype": "float32",
                         "beta1_bits": "0x3feccccccccccccd", ...}}
    {"kind": "float32_state", "shapes": [[3, 4], [8]]}
    {"kind": "state_bits", "encoding": "float32", "shapes": [[2]]}
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..formats.primitives import bits_float
from ..formats.state_bits import encoding_by_name
from .config import AdamConfig, AdamKind, MomentDtype
from .errors import MalformedError
from .schema import ParameterSchema

__all__ = [
    "AdamTarget",
    "ModelStateTarget",
    "description_error",
    "parse_adam_target",
    "parse_model_state_target",
]

_FLOATS = ("beta1", "beta2", "epsilon", "weight_decay")


@dataclass(frozen=True)
class AdamTarget:
    """An optimizer destination.

    Attributes:
        schema: its parameter schema.
        dtype: its moment dtype.
        config: its bound config (``None``: none bound yet, any valid one fits).
    """

    schema: ParameterSchema
    dtype: MomentDtype = MomentDtype.FLOAT32
    config: AdamConfig | None = None


@dataclass(frozen=True)
class ModelStateTarget:
    """A model-state destination.

    Attributes:
        shapes: the tensor shapes, in state order.
        encoding: the scalar encoding its tensors hold (``None``: the file's own).
        source: where it came from, for messages.
    """

    shapes: tuple[tuple[int, ...], ...]
    encoding: str | None = None
    source: str | None = None


def description_error(message: str) -> MalformedError:
    """The error for a description that does not say what it must."""
    return MalformedError(f"destination description: {message}")


def _float_from(entry: Mapping[str, Any], name: str) -> float:
    if f"{name}_bits" in entry:
        bits = entry[f"{name}_bits"]
        try:
            return bits_float(int(bits, 16))
        except (TypeError, ValueError):
            raise description_error(
                f"{name}_bits must be a hex binary64 pattern, got {bits!r}"
            ) from None
    value = entry.get(name)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise description_error(f"expected_config needs {name} (a number) or {name}_bits (hex)")
    return float(value)


def _dtype_from(value: Any) -> MomentDtype:
    try:
        return MomentDtype(value)
    except ValueError:
        raise description_error(f"dtype must be 'float32' or 'float64', got {value!r}") from None


def _config_from(entry: Any) -> AdamConfig:
    if not isinstance(entry, Mapping):
        raise description_error("expected_config must be an object")
    kinds = {kind.name.lower(): kind for kind in AdamKind}
    if entry.get("kind") not in kinds:
        names = " or ".join(repr(k) for k in kinds)
        raise description_error(f"expected_config.kind must be {names}, got {entry.get('kind')!r}")
    return AdamConfig(
        kinds[entry["kind"]],
        *(_float_from(entry, name) for name in _FLOATS),
        dtype=_dtype_from(entry.get("dtype", "float32")),
    )


def _shapes_from(value: Any, what: str) -> tuple[tuple[int, ...], ...]:
    ok = isinstance(value, list) and all(
        isinstance(s, list)
        and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in s)
        for s in value
    )
    if not ok:
        raise description_error(f"{what} must be a list of shapes (lists of non-negative integers)")
    return tuple(tuple(s) for s in value)


def _schema_from(value: Any) -> ParameterSchema:
    if not isinstance(value, Mapping):
        raise description_error("schema must be an object with shapes and requires_grad")
    shapes = _shapes_from(value.get("shapes"), "schema.shapes")
    grads = value.get("requires_grad")
    if not isinstance(grads, list) or not all(isinstance(g, bool) for g in grads):
        raise description_error("schema.requires_grad must be a list of booleans")
    reps = value.get("representatives")
    if reps is not None and (
        not isinstance(reps, list)
        or not all(r is None or (isinstance(r, int) and not isinstance(r, bool)) for r in reps)
    ):
        raise description_error(
            "schema.representatives must be null or a list of slot indices/nulls"
        )
    schema = ParameterSchema(shapes, grads, reps)
    if not schema.is_well_formed():
        raise description_error("schema is not well-formed (see FORMAT.md §2)")
    return schema


def parse_adam_target(doc: Mapping[str, Any], source: str | None = None) -> AdamTarget:
    """An optimizer destination from a description's ``schema``, ``dtype`` and
    ``expected_config`` members (``source``: unused, every family's parser takes it).

    Raises:
        MalformedError: a member is missing or not what it must be.
    """
    config = doc.get("expected_config")
    return AdamTarget(
        _schema_from(doc.get("schema")),
        _dtype_from(doc.get("dtype", "float32")),
        None if config is None else _config_from(config),
    )


def parse_model_state_target(
    doc: Mapping[str, Any], source: str | None = None, holds: str | None = None
) -> ModelStateTarget:
    """A model-state destination from a description's ``shapes`` and ``encoding`` members.

    Args:
        doc: the description.
        source: where it came from, for messages.
        holds: the one encoding the family holds, which the destination then takes (a
            ``TLSF32B`` destination is float32 whatever the description says).

    Raises:
        MalformedError: the shapes are not shapes, or the encoding names no encoding.
    """
    encoding = doc.get("encoding")
    if encoding is not None and (
        not isinstance(encoding, str) or encoding_by_name(encoding) is None
    ):
        raise description_error(f"encoding {encoding!r} names no exact-bits encoding")
    shapes = _shapes_from(doc.get("shapes"), "shapes")
    return ModelStateTarget(shapes, holds or encoding, source)
