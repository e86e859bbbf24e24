"""``tlckpt validate``: is a file well-formed, and does it fit a given destination?

Without a destination the file is checked against its own stored layout: every record, every
size, the end of the file (that is :func:`tlckpt.inspect`). With ``--against`` it is also
read the way a load into that destination reads it, so schema, config, dtype, entry and
shape mismatches are found before a training job trips over them.

A destination (:class:`Destination`) comes from either

* a reference checkpoint: an Adam file (its schema, moment dtype and config: the
  destination is "the optimizer that wrote the reference"), a ``TLSF32B`` or exact-bits JSON
  file (its shapes and scalar type), or a ``.safetensors`` / ``.pt`` model state (its shapes
  and floating type); or
* a JSON description, the same vocabulary as the conformance manifest's ``invalid[]``::

      {"kind": "adam",
       "schema": {"shapes": [[2, 3], [4], []], "requires_grad": [true, false, true],
                  "representatives": null},
       "dtype": "float32",
       "expected_config": {"kind": "adamw", "dtype": "float32",
                           "beta1_bits": "0x3feccccccccccccd", ...}}
      {"kind": "float32_state", "shapes": [[3, 4], [8]]}
      {"kind": "state_bits", "encoding": "float32", "shapes": [[2]]}

  ``kind`` may be left out (``schema`` means ``adam``; ``shapes`` alone fits either model
  state family). A JSON object with a ``format`` key is a reference checkpoint instead.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from typing import Any

import orjson

from ..codec import (
    DEFAULT_MAX_JSON_BYTES,
    AdamConfig,
    AdamKind,
    CheckpointError,
    ConfigError,
    MalformedError,
    MomentDtype,
    ParameterSchema,
    inspect,
    read_adam,
    read_state_bits,
    scan_adam,
    sniff_family,
    validate_float32_state,
)
from ..codec.families import JSON_FAMILY, families_differ
from ..codec.json_document import read_document
from ..codec.source import open_source
from ..codec.state_bits import inspect_state_bits
from ..formats.state_bits import encoding_by_name
from . import progress
from .convert import ORDER_KEY, format_of_path, read_state
from .tensor_state import INTEGER_DTYPES

__all__ = ["Destination", "load_destination", "validate"]

_MODEL_FAMILIES = ("float32_state", "state_bits")


@dataclass(frozen=True)
class Destination:
    """What a file must fit.

    Attributes:
        kind: ``"adam"``, ``"float32_state"``, ``"state_bits"`` or ``"model_state"`` (either
            model-state family).
        schema, dtype, config: an Adam destination's parameter schema, moment dtype and
            bound config (``None``: no config bound yet, any valid one fits).
        shapes, encoding: a model-state destination's tensor shapes and scalar type
            (``None``: the file's own).
        source: where the destination came from, for messages.
    """

    kind: str
    source: str
    schema: ParameterSchema | None = None
    dtype: MomentDtype = MomentDtype.FLOAT32
    config: AdamConfig | None = None
    shapes: tuple[tuple[int, ...], ...] | None = None
    encoding: str | None = None


class _SkipPayloads:
    """A payload sink that skips every moment (their bits cannot be wrong, only their size)."""

    def buffer(self, record: int, field: str, count: int, dtype: Any) -> None:
        return None

    def done(self, record: int, field: str, buffer: Any) -> None:
        return None


# --------------------------------------------------------------------------- destinations


def _bad(source: str, message: str) -> MalformedError:
    return MalformedError(f"destination description: {message}", path=source)


def _float_from(entry: dict[str, Any], name: str, source: str) -> float:
    if f"{name}_bits" in entry:
        bits = entry[f"{name}_bits"]
        try:
            return struct.unpack("<d", struct.pack("<Q", int(bits, 16)))[0]
        except (TypeError, ValueError, struct.error):
            raise _bad(
                source, f"{name}_bits must be a hex binary64 pattern, got {bits!r}"
            ) from None
    value = entry.get(name)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _bad(source, f"expected_config needs {name} (a number) or {name}_bits (hex)")
    return float(value)


def _config_from(entry: Any, source: str) -> AdamConfig:
    if not isinstance(entry, dict):
        raise _bad(source, "expected_config must be an object")
    kinds = {"adam": AdamKind.ADAM, "adamw": AdamKind.ADAMW}
    if entry.get("kind") not in kinds:
        raise _bad(
            source, f"expected_config.kind must be 'adam' or 'adamw', got {entry.get('kind')!r}"
        )
    return AdamConfig(
        kinds[entry["kind"]],
        *(_float_from(entry, n, source) for n in ("beta1", "beta2", "epsilon", "weight_decay")),
        dtype=_dtype_from(entry.get("dtype", "float32"), source),
    )


def _dtype_from(value: Any, source: str) -> MomentDtype:
    try:
        return MomentDtype(value)
    except ValueError:
        raise _bad(source, f"dtype must be 'float32' or 'float64', got {value!r}") from None


def _shapes_from(value: Any, source: str, what: str) -> tuple[tuple[int, ...], ...]:
    ok = isinstance(value, list) and all(
        isinstance(s, list)
        and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in s)
        for s in value
    )
    if not ok:
        raise _bad(source, f"{what} must be a list of shapes (lists of non-negative integers)")
    return tuple(tuple(s) for s in value)


def _schema_from(value: Any, source: str) -> ParameterSchema:
    if not isinstance(value, dict):
        raise _bad(source, "schema must be an object with shapes and requires_grad")
    shapes = _shapes_from(value.get("shapes"), source, "schema.shapes")
    grads = value.get("requires_grad")
    if not isinstance(grads, list) or not all(isinstance(g, bool) for g in grads):
        raise _bad(source, "schema.requires_grad must be a list of booleans")
    reps = value.get("representatives")
    if reps is not None and (
        not isinstance(reps, list)
        or not all(r is None or (isinstance(r, int) and not isinstance(r, bool)) for r in reps)
    ):
        raise _bad(source, "schema.representatives must be null or a list of slot indices/nulls")
    schema = ParameterSchema(shapes, grads, reps)
    if not schema.is_well_formed():
        raise _bad(source, "schema is not well-formed (see FORMAT.md §2)")
    return schema


def _from_description(doc: dict[str, Any], source: str) -> Destination:
    kind = doc.get("kind")
    if kind is None:
        kind = "adam" if "schema" in doc else "model_state"
    if kind == "adam":
        return Destination(
            "adam",
            source,
            schema=_schema_from(doc.get("schema"), source),
            dtype=_dtype_from(doc.get("dtype", "float32"), source),
            config=None
            if doc.get("expected_config") is None
            else _config_from(doc["expected_config"], source),
        )
    if kind not in (*_MODEL_FAMILIES, "model_state"):
        raise _bad(source, f"unknown kind {kind!r}; expected adam, float32_state or state_bits")
    encoding = doc.get("encoding")
    if encoding is not None and (
        not isinstance(encoding, str) or encoding_by_name(encoding) is None
    ):
        raise _bad(source, f"encoding {encoding!r} names no exact-bits encoding")
    if kind == "float32_state":
        encoding = "float32"
    return Destination(
        kind, source, shapes=_shapes_from(doc.get("shapes"), source, "shapes"), encoding=encoding
    )


def _from_named_state(path: str, fmt: str) -> Destination:
    state = read_state(path, fmt)
    if not state.ordered:  # its name order is no model's order: comparing by it misleads
        raise CheckpointError(
            f"this safetensors file has no {ORDER_KEY!r} metadata, so the order of its tensors"
            " is not known and a positional file cannot be checked against it; validate"
            " against a .pt state_dict of the model, or a file converted with --names-from",
            path=path,
            field=f"__metadata__.{ORDER_KEY}",
        )
    floating = {t.encoding for t in state.tensors} - INTEGER_DTYPES
    encoding = floating.pop() if len(floating) == 1 else None
    return Destination(
        "model_state", path, shapes=tuple(t.shape for t in state.tensors), encoding=encoding
    )


def load_destination(
    path: str | os.PathLike, *, max_json_bytes: int = DEFAULT_MAX_JSON_BYTES
) -> Destination:
    """The destination a reference checkpoint or a JSON description describes.

    Args:
        path: a reference checkpoint or a JSON description.
        max_json_bytes: the largest JSON file read (a description, or a JSON checkpoint).

    Raises:
        CheckpointError: the reference is not well-formed, or the description is malformed;
            :class:`~tlckpt.codec.errors.FileTooLargeError` for JSON above ``max_json_bytes``.
        OSError: from the file system.
    """
    source = os.fspath(path)
    fmt = format_of_path(source)
    if fmt in ("safetensors", "pt"):
        return _from_named_state(source, fmt)
    try:
        family = sniff_family(source)
    except CheckpointError:
        family = None  # no checkpoint: a description, or the JSON reader says what is wrong
    if family == "adam":
        ckpt = scan_adam(source)
        return Destination(
            "adam", source, schema=ckpt.schema, dtype=ckpt.config.dtype, config=ckpt.config
        )
    if family == "float32_state":
        shapes = tuple(tuple(t["shape"]) for t in inspect(source)["tensors"])
        return Destination("float32_state", source, shapes=shapes, encoding="float32")
    # Not a binary checkpoint: exact-bits JSON, or a JSON description of a destination.
    neither = "neither a checkpoint nor a JSON destination description"
    try:
        with open_source(source) as src:
            data = read_document(src, max_json_bytes, "the JSON read cap --max-json-bytes")
        doc = orjson.loads(data)
    except MalformedError as exc:
        raise MalformedError(f"{neither} ({exc.reason})", path=source) from None
    except orjson.JSONDecodeError as exc:
        raise MalformedError(f"{neither} (not JSON: {exc})", path=source) from None
    if not isinstance(doc, dict):
        raise _bad(source, "the top level must be a JSON object")
    if "format" in doc:
        del doc, data  # the checkpoint is read again, by its own reader
        info = inspect_state_bits(source, max_json_bytes=max_json_bytes)
        shapes = tuple(tuple(t["shape"]) for t in info["tensors"])
        return Destination("state_bits", source, shapes=shapes, encoding=info["format"])
    return _from_description(doc, source)


# --------------------------------------------------------------------------- validation


def _reader_family(path: str | os.PathLike, against: Destination) -> str:
    """The family a load into ``against`` reads the file as: the destination's (or, when it
    takes either model-state family, the file's). A file of another family is refused here,
    from its first bytes, with the families named."""
    wanted = _MODEL_FAMILIES if against.kind == "model_state" else (against.kind,)
    try:
        found = sniff_family(path)
    except CheckpointError:
        found = None  # no checkpoint of any family: the reader says what is wrong with it
    if found is not None and found not in wanted:
        raise families_differ(found, wanted, destination=against.source)
    return found or (JSON_FAMILY if against.kind == "model_state" else against.kind)


def _read_against(
    src: Any, family: str, against: Destination, path: str | os.PathLike, max_json_bytes: int
) -> None:
    """Read ``src`` the way a load into ``against`` reads it (payloads skipped where allowed)."""
    if family == "adam":
        read_adam(
            src,
            against.schema,
            dtype=against.dtype,
            expected_config=against.config,
            sink=_SkipPayloads(),
        )
    elif family == "float32_state":
        validate_float32_state(src, against.shapes)
        if against.encoding not in (None, "float32"):
            raise ConfigError(
                f"TLSF32B holds float32; the destination ({against.source}) is {against.encoding}",
                path=path,
                actual="float32",
                expected=against.encoding,
            )
    else:
        # A destination that does not name a scalar type takes the file's own tag.
        encoding = (
            against.encoding or inspect_state_bits(path, max_json_bytes=max_json_bytes)["format"]
        )
        read_state_bits(src, against.shapes, encoding)


def validate(
    path: str | os.PathLike,
    against: Destination | None = None,
    *,
    max_json_bytes: int = DEFAULT_MAX_JSON_BYTES,
) -> dict[str, Any]:
    """Check a file, alone or against a destination; return its ``inspect`` description.

    Args:
        path: the file.
        against: the destination it must fit (see :func:`load_destination`), or ``None``.
        max_json_bytes: the largest exact-bits JSON file read without a destination (a
            destination bounds the read by itself).

    Returns:
        The file's :func:`tlckpt.inspect` dict.

    Raises:
        CheckpointError: the first rule the file breaks (the subclass says which kind).
        OSError: from the file system.
    """
    if against is not None:
        # Read as a load into the destination reads, so the error is the one it would raise.
        family = _reader_family(path, against)
        with progress.reading(path, f"checking against {against.source}") as src:
            _read_against(src, family, against, path, max_json_bytes)
    with progress.reading(path, "checking") as src:
        info = inspect(src, max_json_bytes=max_json_bytes)
    info["bytes"] = os.path.getsize(path)
    return info
