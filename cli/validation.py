"""``tlckpt validate``: is a file well-formed, and does it fit a given destination?

Without a destination the file is checked against its own stored layout: every record, every
size, the end of the file (that is :func:`tlckpt.inspect`). With ``--against`` it is also
read the way a load into that destination reads it, so schema, config, dtype, entry and
shape mismatches are found before a training job trips over them.

A destination (:class:`Destination`) comes from either

* a reference checkpoint of any registered family: what a load into "the writer of the
  reference" expects (an Adam file: its schema, moment dtype and config; a ``TLCKOPT`` file:
  its schema, param groups, each slot's group and dtype; a ``TLSF32B`` or exact-bits JSON
  file: its shapes and scalar type), or a ``.safetensors`` / ``.pt`` model state (its shapes
  and floating type); or
* a JSON description, in the vocabulary of the conformance manifest's ``invalid[]``
  (:mod:`tlckpt.codec.values.destinations`). ``kind`` names a family, or ``model_state`` for either
  model-state family; left out, a family's marker member decides (``schema`` means
  ``adam``), else ``shapes`` alone fits either model-state family. A JSON object with a
  ``format`` key is a reference checkpoint instead.

What a family takes as a destination, derives from a reference and checks is its handler's
business (:mod:`tlckpt.codec.families`); nothing here knows a family by name.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import orjson

from ..codec import (
    DEFAULT_MAX_JSON_BYTES,
    CheckpointError,
    MalformedError,
    inspect,
    sniff_family,
)
from ..codec.exact_json.json_document import read_document
from ..codec.families import (
    FamilyHandler,
    ModelStateFamily,
    families,
    families_differ,
    family_named,
)
from ..codec.fileio.source import open_source
from ..codec.values.destinations import (
    ModelStateTarget,
    description_error,
    parse_model_state_target,
)
from ..formats.optimizer_tree import FAMILY as OPTIMIZER_TREE
from ..formats.state_bits import FORMAT_KEY
from . import progress
from .convert import ORDER_KEY, format_of_path, read_state
from .file_formats import NAMED_FORMATS
from .tensor_state import INTEGER_DTYPES

__all__ = ["Destination", "load_destination", "validate"]

#: A description's ``kind`` for a destination either model-state family fits.
MODEL_STATE = "model_state"


@dataclass(frozen=True)
class Destination:
    """What a file must fit.

    Attributes:
        kind: a family's name, or :data:`MODEL_STATE` (either model-state family).
        source: where the destination came from, for messages.
        target: the destination itself, of the type the families' ``read`` takes
            (:class:`~tlckpt.codec.values.destinations.AdamTarget`, ``ModelStateTarget``).
        families: the families whose files fit it: the destination's own family first, then
            every family that takes its destinations (:meth:`FamilyHandler.takes`).
    """

    kind: str
    source: str
    target: Any
    families: tuple[FamilyHandler, ...]


def _model_state_families() -> tuple[FamilyHandler, ...]:
    return tuple(f for f in families() if isinstance(f, ModelStateFamily))


def _takers(family: FamilyHandler, target: Any) -> tuple[FamilyHandler, ...]:
    """The families whose files fit ``target``, a destination ``family`` made: its own, then
    every other family that takes it (either optimizer family's files load into an
    optimizer)."""
    return (family, *(f for f in families() if f is not family and f.takes(target)))


# --------------------------------------------------------------------------- destinations


def _from_description(doc: dict[str, Any], source: str) -> Destination:
    kind = doc.get("kind")
    if kind is None:
        marked = [f for f in families() if f.marker is not None and f.marker in doc]
        kind = marked[0].name if marked else MODEL_STATE
    if kind == MODEL_STATE:
        target = parse_model_state_target(doc, source)
        return Destination(kind, source, target, _model_state_families())
    handler = family_named(kind) if isinstance(kind, str) else None
    if handler is None:
        known = ", ".join(f.name for f in families())
        raise description_error(f"unknown kind {kind!r}; expected {known} or {MODEL_STATE}")
    target = handler.parse_destination(doc, source)
    return Destination(kind, source, target, _takers(handler, target))


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
    target = ModelStateTarget(tuple(t.shape for t in state.tensors), encoding, path)
    return Destination(MODEL_STATE, path, target, _model_state_families())


def _sniffed(path: str | os.PathLike) -> tuple[str | None, FamilyHandler | None]:
    """The family a file is, from its first bytes (once), and its handler; ``None`` for a
    file of no family (the reader given it then says what is wrong)."""
    try:
        name = sniff_family(path)
    except CheckpointError:
        return None, None
    return name, family_named(name)


def _is_optimizer_tree(path: str) -> bool:
    """Whether ``path`` is an optimizer tree (a ``.safetensors`` file that is not model
    state: its destination is its family's, an optimizer's class and groups)."""
    try:
        return sniff_family(path) == OPTIMIZER_TREE
    except (CheckpointError, OSError):  # not one: the model-state reader says what it is
        return False


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
    if fmt in NAMED_FORMATS and not _is_optimizer_tree(source):
        return _from_named_state(source, fmt)
    _, family = _sniffed(source)
    if family is not None and (family.magic is not None or family.name == OPTIMIZER_TREE):
        target = family.destination(source, max_json_bytes)
        return Destination(family.name, source, target, _takers(family, target))
    # No binary checkpoint: a JSON checkpoint, or a JSON description of a destination.
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
        raise description_error("the top level must be a JSON object").with_path(source)
    if family is not None and FORMAT_KEY in doc:
        del doc, data  # the checkpoint is read again, by its own reader
        target = family.destination(source, max_json_bytes)
        return Destination(family.name, source, target, _takers(family, target))
    try:
        return _from_description(doc, source)
    except CheckpointError as exc:
        raise exc.with_path(source) from None


# --------------------------------------------------------------------------- validation


def _reader_family(path: str | os.PathLike, against: Destination) -> FamilyHandler:
    """The family a load into ``against`` reads the file as: the file's own, if the
    destination takes it. A file of another family is refused here, from its first bytes,
    with the families named; a file of none is read by the destination's family that has no
    magic, if any (its reader says what is wrong), else by its first."""
    wanted = against.families
    name, found = _sniffed(path)
    if name is not None and found not in wanted:
        raise families_differ(name, [f.name for f in wanted], destination=against.source)
    return found or next((f for f in wanted if f.magic is None), wanted[0])


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
            family.read(src, against.target, False, max_json_bytes)
    with progress.reading(path, "checking") as src:
        info = inspect(src, max_json_bytes=max_json_bytes)
    info["bytes"] = os.path.getsize(path)
    return info
