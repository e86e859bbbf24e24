"""Destinations: what a load expects of a file, and their JSON description.

A destination is what a reader is given besides the file: an optimizer's parameter schema,
moment dtype and bound config (:class:`AdamTarget`), an optimizer's schema, param groups,
each slot's group and dtype (:class:`OptimizerTarget`, for tlckpt's own optimizer family), or
a model's tensor shapes and scalar type (:class:`ModelStateTarget`). Each family handler
(:mod:`.families`) derives one from a reference file of its own and checks a file against
one; ``tlckpt validate --against`` also reads them from a JSON description, in the
vocabulary of the conformance manifest's ``invalid[]`` entries::

    {"kind": "adam",
     "schema": {"shapes": [[2, 3], [4], []], "requires_grad": [true, false, true],
                "representatives": null},
     "dtype": "float32",
     "expected_config": {"kind": "adamw", "dtype": "float32",
                         "beta1_bits": "0x3feccccccccccccd", ...}}
    {"kind": "tlckpt_optimizer",
     "schema": {"shapes": [[2, 3], [3]], "requires_grad": [true, true]},
     "groups": [{"kind": "adamw", "beta1_bits": "0x3feccccccccccccd", ..., "lr": 0.001,
                 "amsgrad": false, "maximize": false}, ...],
     "slot_groups": [0, 1], "dtypes": ["bfloat16", "bfloat16"]}
    {"kind": "float32_state", "shapes": [[3, 4], [8]]}
    {"kind": "state_bits", "encoding": "float32", "shapes": [[2]]}
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...formats.adam import AdamKind
from ...formats.primitives import bits_float
from ...formats.state_bits import encoding_by_name
from ..errors import CheckpointError, MalformedError
from .config import AdamConfig, MomentDtype
from .optimizer_types import MOMENT_DTYPE_NAMES, ParamGroupConfig
from .schema import ParameterSchema

__all__ = [
    "AdamTarget",
    "ModelStateTarget",
    "OptimizerTarget",
    "description_error",
    "parse_adam_target",
    "parse_optimizer_target",
    "parse_model_state_target",
]

_FLOATS = ("beta1", "beta2", "epsilon", "weight_decay")


@dataclass(frozen=True)
class AdamTarget:
    """An optimizer destination.

    Attributes:
        schema: its parameter schema.
        dtype: its moment dtype (``None``: either).
        config: its bound config (``None``: none bound yet, any valid one fits).
    """

    schema: ParameterSchema
    dtype: MomentDtype | None = MomentDtype.FLOAT32
    config: AdamConfig | None = None


@dataclass(frozen=True)
class OptimizerTarget:
    """An optimizer destination as tlckpt's optimizer family (``TLCKOPT``) describes it.

    Attributes:
        schema: its parameter schema.
        groups: its param groups (``None``: any; the learning rate is never compared).
        slot_groups: per slot, the index of its group (``None`` entries: frozen or alias);
            ``None``: any assignment.
        dtypes: per slot, its moment dtype's name (``None`` entries: unknown, any fits);
            ``None``: any.
    """

    schema: ParameterSchema
    groups: tuple[ParamGroupConfig, ...] | None = None
    slot_groups: tuple[int | None, ...] | None = None
    dtypes: tuple[str | None, ...] | None = None


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


def _group_from(entry: Any, index: int) -> ParamGroupConfig:
    if not isinstance(entry, Mapping):
        raise description_error(f"groups[{index}] must be an object")
    kinds = {kind.name.lower(): kind for kind in AdamKind}
    if entry.get("kind") not in kinds:
        names = " or ".join(repr(k) for k in kinds)
        raise description_error(f"groups[{index}].kind must be {names}, got {entry.get('kind')!r}")
    flags = [entry.get(name, False) for name in ("amsgrad", "maximize")]
    if not all(isinstance(f, bool) for f in flags):
        raise description_error(f"groups[{index}].amsgrad and .maximize must be booleans")
    floats = [_float_from(entry, name) for name in (*_FLOATS, "lr")]
    try:
        group = ParamGroupConfig(kinds[entry["kind"]], *floats, *flags)
        group.validate()
    except CheckpointError as exc:
        raise description_error(f"groups[{index}]: {exc.reason}") from None
    return group


def parse_optimizer_target(doc: Mapping[str, Any], source: str | None = None) -> OptimizerTarget:
    """An optimizer destination of tlckpt's family from a description's ``schema``,
    ``groups``, ``slot_groups`` and ``dtypes`` members (all but ``schema`` optional).

    Raises:
        MalformedError: a member is missing or not what it must be.
    """
    schema = _schema_from(doc.get("schema"))
    groups = doc.get("groups")
    if groups is not None:
        if not isinstance(groups, list):
            raise description_error("groups must be a list of param groups")
        groups = tuple(_group_from(g, i) for i, g in enumerate(groups))
    slot_groups = doc.get("slot_groups")
    if slot_groups is not None:
        ok = isinstance(slot_groups, list) and len(slot_groups) == len(schema.shapes)
        if not ok or not all(
            g is None or (isinstance(g, int) and not isinstance(g, bool) and g >= 0)
            for g in slot_groups
        ):
            raise description_error("slot_groups must list a group index or null per slot")
        slot_groups = tuple(slot_groups)
    dtypes = doc.get("dtypes")
    if dtypes is not None:
        ok = isinstance(dtypes, list) and len(dtypes) == len(schema.shapes)
        if not ok or not all(d is None or d in MOMENT_DTYPE_NAMES for d in dtypes):
            names = ", ".join(MOMENT_DTYPE_NAMES)
            raise description_error(f"dtypes must list one of {names} or null per slot")
        dtypes = tuple(dtypes)
    return OptimizerTarget(schema, groups, slot_groups, dtypes)


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
