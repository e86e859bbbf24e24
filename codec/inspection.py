"""``inspect`` and ``sniff_family``: describe any checkpoint file without being told what it is.

Both dispatch through the family registry (:mod:`.families`): the first bytes name the
family, and the family's handler describes the file. The helpers at the end are what the
handlers' descriptions share.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from ..formats import registry
from ..formats.primitives import float_bits, product
from .errors import UnsupportedFormatError, names_the_file
from .families import HEAD_BYTES, family_named, head_family
from .gcpause import without_gc
from .json_document import DEFAULT_MAX_JSON_BYTES
from .schema import ParameterSchema
from .source import PathOrFile, open_source

__all__ = [
    "inspect",
    "sniff_family",
    "ElementCounts",
    "file_size",
    "float_entry",
    "optimizer_contents",
]


@names_the_file()
def sniff_family(path: PathOrFile) -> str:
    """``"adam"``, ``"tlckpt_optimizer"``, ``"float32_state"``, ``"safetensors"`` or
    ``"state_bits"`` from the first bytes (the name of a registered family).

    At most :data:`~tlckpt.codec.families.HEAD_BYTES` bytes are read: a registered magic, or
    a JSON document (its first significant byte ``{`` or ``[``, a byte order mark, or only
    whitespace as far as that), whose reader then says precisely what is wrong with it.

    Raises:
        UnsupportedFormatError: neither a known magic nor a JSON document.
        TruncatedError: the file ends inside a known magic.
    """
    with open_source(path) as src:
        head = src.peek(HEAD_BYTES)
        family = head_family(head, src.remaining)
        if family is not None:
            return family
        for magic in registry.FAMILIES:
            if head and len(head) < len(magic) and magic.startswith(head):
                src.need(len(magic), "magic")  # ends inside a known magic: truncated
        raise UnsupportedFormatError(
            f"not a TorchLean checkpoint: starts with {head[:8]!r}",
            offset=src.start,
            field="magic",
            actual=head[:8],
        )


@names_the_file()
@without_gc  # a description of 10⁶ tensors is 10⁶ small dicts: collections would dominate
def inspect(path: PathOrFile, *, max_json_bytes: int = DEFAULT_MAX_JSON_BYTES) -> dict[str, Any]:
    """Describe a checkpoint: family, version, config, schema or tensors, counter, sizes.

    The whole file is checked against its own stored layout on the way (payloads are
    skipped, not read), so a description is only returned for a well-formed file.

    Args:
        path: any file of a registered family (path or seekable binary file object).
        max_json_bytes: the largest exact-bits JSON file read (a JSON document is read whole;
            see :data:`~tlckpt.codec.state_bits.DEFAULT_MAX_JSON_BYTES`). Binary files are
            read record by record and need no cap.

    Returns:
        A JSON-serialisable dict. Keys depend on the family; always ``family`` and ``bytes``.

    Raises:
        CheckpointError: the file is not well-formed (the subclass says how);
            :class:`FileTooLargeError` for a JSON file above ``max_json_bytes``, or any file
            that does not fit in memory.
        OSError: from the file system.
    """
    family = sniff_family(path)
    handler = family_named(family)
    if handler is None:  # a magic registered in formats/ with no reader in the codec
        raise UnsupportedFormatError(
            f"no reader is registered for the {family} family", field="magic", actual=family
        )
    return handler.describe(path, max_json_bytes)


# --------------------------------------------------------------------------- shared by handlers


def file_size(path: PathOrFile) -> int | None:
    """The size of the file at ``path``; ``None`` for a file object (its caller knows)."""
    if isinstance(path, (str, os.PathLike)):
        return os.path.getsize(path)
    return None


def float_entry(x: float) -> dict[str, Any]:
    """A binary64 value as descriptions show it: decimal, and its exact bits in hex."""
    return {"value": x, "bits": f"0x{float_bits(x):016x}"}


class ElementCounts(dict):
    """Element counts by shape, each product computed once (files repeat their shapes)."""

    def __missing__(self, shape: tuple[int, ...]) -> int:
        n = self[shape] = product(shape)
        return n


def optimizer_contents(
    checkpoint: Any,
    payload_bytes: Mapping[int, int],
    *,
    slot_groups: Sequence[int | None] | None = None,
    entry_fields: Sequence[str] = (),
) -> dict[str, Any]:
    """What the descriptions of both optimizer families show of a checked file's state.

    Args:
        checkpoint: an ``AdamCheckpoint`` or ``OptimizerCheckpoint`` (its stored schema,
            random counter and entries).
        payload_bytes: each entry's payload bytes, by slot.
        slot_groups: each slot's param group, shown with the slot (``None``: no groups).
        entry_fields: attributes of an entry shown after its step (``"dtype"``).

    Returns:
        ``random_counter``, ``has_aliases``, ``slots`` (shape, elements, trainable,
        representative, and group) and ``entries`` (id, step, ``entry_fields``, elements,
        bytes; in slot order), in that order.
    """
    schema: ParameterSchema = checkpoint.schema
    elements = ElementCounts()
    slots = [
        {
            "slot": i,
            "shape": list(shape),
            "elements": elements[shape],
            "trainable": schema.requires_grad[i],
            "representative": schema.representative(i),
            **({} if slot_groups is None else {"group": slot_groups[i]}),
        }
        for i, shape in enumerate(schema.shapes)
    ]
    entries = [
        {
            "id": i,
            "step": e.step,
            **{name: getattr(e, name) for name in entry_fields},
            "elements": elements[schema.shapes[i]],
            "bytes": payload_bytes[i],
        }
        for i, e in sorted(checkpoint.entries.items())
    ]
    return {
        "random_counter": checkpoint.random_counter,
        "has_aliases": schema.has_aliases,
        "slots": slots,
        "entries": entries,
    }
