"""``inspect``: describe any checkpoint file without being told what to expect."""

from __future__ import annotations

import os
from typing import Any

from ..formats import registry
from ..formats.primitives import product
from .adam import scan_adam
from .config import float_bits
from .errors import UnsupportedFormatError, names_the_file
from .families import HEAD_BYTES, JSON_FAMILY, JSON_WHITESPACE, UTF8_BOM, magic_family
from .float32_state import scan_float32_state
from .gcpause import without_gc
from .source import PathOrFile, open_source
from .state_bits import DEFAULT_MAX_JSON_BYTES, inspect_state_bits

__all__ = ["inspect", "sniff_family"]


@names_the_file()
def sniff_family(path: PathOrFile) -> str:
    """``"adam"``, ``"float32_state"`` or ``"state_bits"`` from the first bytes.

    At most :data:`~tlckpt.codec.families.HEAD_BYTES` bytes are read: a registered magic, or
    a JSON document (its first significant byte ``{`` or ``[``, a byte order mark, or only
    whitespace as far as that), whose reader then says precisely what is wrong with it.

    Raises:
        UnsupportedFormatError: neither a known magic nor a JSON document.
        TruncatedError: the file ends inside a known magic.
    """
    with open_source(path) as src:
        head = src.peek(HEAD_BYTES)
        family = magic_family(head)
        if family is not None:
            return family
        for magic in registry.FAMILIES:
            if head and len(head) < len(magic) and magic.startswith(head):
                src.need(len(magic), "magic")  # ends inside a known magic: truncated
        first = head.lstrip(JSON_WHITESPACE)[:1]
        more_whitespace = not first and len(head) < src.remaining
        if head.startswith(UTF8_BOM) or first in (b"{", b"[") or more_whitespace:
            return JSON_FAMILY
        raise UnsupportedFormatError(
            f"not a TorchLean checkpoint: starts with {head[:8]!r}",
            offset=src.start,
            field="magic",
            actual=head[:8],
        )


def _size(path: PathOrFile) -> int | None:
    if isinstance(path, (str, os.PathLike)):
        return os.path.getsize(path)
    return None


def _float(x: float) -> dict[str, Any]:
    return {"value": x, "bits": f"0x{float_bits(x):016x}"}


class _Elements(dict):
    """Element counts by shape, each product computed once (files repeat their shapes)."""

    def __missing__(self, shape: tuple[int, ...]) -> int:
        n = self[shape] = product(shape)
        return n


@names_the_file()
@without_gc  # a description of 10⁶ tensors is 10⁶ small dicts: collections would dominate
def inspect(path: PathOrFile, *, max_json_bytes: int = DEFAULT_MAX_JSON_BYTES) -> dict[str, Any]:
    """Describe a checkpoint: family, version, config, schema or tensors, counter, sizes.

    The whole file is checked against its own stored layout on the way (payloads are
    skipped, not read), so a description is only returned for a well-formed file.

    Args:
        path: any file of the six formats (path or seekable binary file object).
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
    if family == "adam":
        ckpt = scan_adam(path)
        schema = ckpt.schema
        itemsize = ckpt.config.dtype.numpy.itemsize
        elements = _Elements()
        slots = [
            {
                "slot": i,
                "shape": list(shape),
                "elements": elements[shape],
                "trainable": schema.requires_grad[i],
                "representative": schema.representative(i),
            }
            for i, shape in enumerate(schema.shapes)
        ]
        entries = [
            {
                "id": i,
                "step": e.step,
                "elements": elements[schema.shapes[i]],
                "bytes": 2 * itemsize * elements[schema.shapes[i]],
            }
            for i, e in sorted(ckpt.entries.items())
        ]
        cfg = ckpt.config
        return {
            "family": "adam",
            "magic": "TLADAMF",
            "version": ckpt.version,
            "kind": cfg.kind.name.lower(),
            "moment_dtype": cfg.dtype.value,
            "config": {
                "beta1": _float(cfg.beta1),
                "beta2": _float(cfg.beta2),
                "epsilon": _float(cfg.epsilon),
                "weight_decay": _float(cfg.weight_decay),
            },
            "random_counter": ckpt.random_counter,
            "has_aliases": schema.has_aliases,
            "slots": slots,
            "entries": entries,
            **({"fields": ckpt.fields} if ckpt.fields else {}),
            "bytes": _size(path),
        }
    if family == "float32_state":
        shapes = scan_float32_state(path)
        elements = _Elements()
        return {
            "family": "float32_state",
            "magic": "TLSF32B",
            "version": 1,
            "tensors": [
                {"shape": list(s), "elements": elements[s], "bytes": 4 * elements[s]}
                for s in shapes
            ],
            "bytes": _size(path),
        }
    return inspect_state_bits(path, max_json_bytes=max_json_bytes)
