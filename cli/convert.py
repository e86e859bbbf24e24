"""``tlckpt convert``: model state among TLSF32B, exact-bits JSON, safetensors and ``.pt``.

Every conversion is exact or refused:

* the target keeps each value's bits where it holds the source's scalar type; where it holds
  another type (float64 into ``TLSF32B``, an int64 buffer into a float32 file), every value
  must convert exactly both ways, else :class:`~tlckpt.codec.errors.ConfigError` names the
  tensor and the first value that does not fit;
* TorchLean files are positional, safetensors and ``.pt`` files are named. Going to a named
  file, tensors are called ``"0"``, ``"1"``, ... (or take the names of a reference file); the
  order is kept in the safetensors ``__metadata__`` entry ``tlckpt.order``, so converting back
  restores it. A safetensors file without that entry (written by another tool) does not say
  in which order its tensors go: going to a positional file it needs the order given
  (``names_from``: a text file of names, a ``.pt`` state_dict or a tlckpt-written safetensors
  file, or in the API a list of names, a state_dict or a module), else it is refused — taking
  the keys' sorted order would silently permute ``layers.10`` before ``layers.2``.
* ``.pt`` files are read only with ``torch.load(weights_only=True)``: no code runs.

TLSF32B ↔ JSON needs only numpy; safetensors, ``.pt`` and conversions of bfloat16, float8
and complex32 values use torch.
"""

from __future__ import annotations

import os
from typing import Any

from ..codec import (
    DEFAULT_MAX_JSON_BYTES,
    CheckpointError,
    ConfigError,
    inspect,
)
from ..codec.errors import names_the_file
from ..codec.families import families_differ
from ..formats.state_bits import ENCODINGS, encoding_by_name
from . import progress
from .file_formats import EXTENSIONS, FORMATS, POSITIONAL, POSITIONAL_FAMILIES, format_of_path
from .named_formats import NAMED_READERS, ORDER_KEY, SAFETENSORS_MISSING, names_for, write_named
from .names import NameSource, in_order, label_of, names_from_reference, names_in
from .tensor_state import INTEGER_DTYPES, State, StateTensor, exact_cast

__all__ = [
    "FORMATS",
    "EXTENSIONS",
    "POSITIONAL",
    "ORDER_KEY",
    "SAFETENSORS_MISSING",
    "NameSource",
    "format_of_path",
    "names_in",
    "read_state",
    "write_state",
    "convert",
]


# --------------------------------------------------------------------------- reading


def read_state(
    path: str | os.PathLike, fmt: str, *, max_json_bytes: int = DEFAULT_MAX_JSON_BYTES
) -> State:
    """Read a model-state file of format ``fmt`` (a key of :data:`FORMATS`).

    Args:
        path: the file.
        fmt: its format.
        max_json_bytes: the largest exact-bits JSON file read (the cap of
            :func:`tlckpt.inspect`, which describes a TorchLean file before it is read).

    Raises:
        CheckpointError: the file is not a well-formed file of that format.
        OSError: from the file system.
    """
    family = POSITIONAL_FAMILIES.get(fmt)
    if family is None:
        return NAMED_READERS[fmt](path)
    with progress.reading(path, "reading") as src:
        info = inspect(src, max_json_bytes=max_json_bytes)
    if info["family"] != family.name:
        raise families_differ(info["family"], family.name).with_path(path)
    with progress.reading(path, "reading") as src:
        arrays, encoding = family.read_arrays(src, info, max_json_bytes)
    return State([StateTensor(None, encoding, a) for a in arrays], encoding, named=False)


# --------------------------------------------------------------------------- writing


def _file_encoding(state: State, requested: str | None, label: str) -> str:
    """The one scalar type of a file of a family that holds any: the requested one, or the
    state's one floating type."""
    if requested is not None:
        if encoding_by_name(requested) is None:
            raise ConfigError(
                f"unknown encoding {requested!r}; expected one of {', '.join(ENCODINGS)}"
                " or a torchlean_state_*_v1 tag",
                field="dtype",
                actual=requested,
            )
        return requested
    floating = []
    for t in state.tensors:
        if t.encoding not in INTEGER_DTYPES and t.encoding not in floating:
            floating.append(t.encoding)
    if len(floating) > 1:
        raise ConfigError(
            f"the state mixes {' and '.join(floating)} tensors and one {label} file holds one"
            " scalar type; pass --dtype to convert all of them (exactly) to one",
            field="dtype",
            actual=floating,
        )
    if floating:
        return floating[0]
    return state.encoding or "float64"  # binary64 holds every integer up to 2^53


def write_state(
    state: State,
    path: str | os.PathLike,
    fmt: str,
    *,
    encoding: str | None = None,
    names: list[str] | None = None,
    pretty: bool = True,
) -> str | None:
    """Write ``state`` to ``path`` as format ``fmt``, atomically.

    Every tensor is converted (exactly) before the first byte is written.

    Args:
        state: what :func:`read_state` returned.
        path: destination.
        fmt: a key of :data:`FORMATS`.
        encoding: the scalar type of a JSON target (default: the state's one floating type).
        names: names for a safetensors/``.pt`` target (default: the source's, else indices).
        pretty: indented JSON.

    Returns:
        The encoding written for TLSF32B/JSON targets, ``None`` for named targets (each
        tensor keeps its dtype).

    Raises:
        ConfigError: a value the target cannot hold exactly, or mixed floating types into
            JSON without ``encoding``.
        CheckpointError: other refusals (duplicate names, torch missing).
        OSError: from the file system.
    """
    if fmt in POSITIONAL and not state.ordered:
        raise CheckpointError(
            f"this safetensors file has no {ORDER_KEY!r} metadata (tlckpt writes it; other"
            f" tools do not), so it does not say in which order its tensors go, and"
            f" {FORMATS[fmt]} files are positional: give the model's order with --names-from"
            " FILE (a text file of names, one per line, or a .pt state_dict or a"
            " tlckpt-written .safetensors file whose order to copy), or names_from= in the"
            " API (also a list of names, a state_dict or a module)",
            field=f"__metadata__.{ORDER_KEY}",
        )
    family = POSITIONAL_FAMILIES.get(fmt)
    if family is None:
        write_named(state, path, fmt, names_for(state, names))
        return None
    target = family.holds or _file_encoding(state, encoding, family.label)
    arrays = [exact_cast(t, i, target) for i, t in enumerate(state.tensors)]
    total = sum(a.nbytes for a in arrays)
    family.write_arrays(path, progress.counting(arrays, total, "writing"), target, pretty)
    return target


@names_the_file("src")
def convert(
    src: str | os.PathLike,
    dst: str | os.PathLike,
    *,
    src_format: str,
    dst_format: str,
    encoding: str | None = None,
    names_from: NameSource | None = None,
    pretty: bool = True,
    max_json_bytes: int = DEFAULT_MAX_JSON_BYTES,
) -> dict[str, Any]:
    """Convert one model-state file into another format, exactly.

    Args:
        src, dst: source and destination paths.
        src_format, dst_format: keys of :data:`FORMATS`.
        encoding: scalar type of a JSON destination (see :func:`write_state`).
        names_from: names in order (see :func:`names_in`). For a positional source (TLSF32B,
            JSON) going to a named file: the names of its tensors. For a named source: the
            order of its tensors, naming each exactly once — required to write a positional
            file from a safetensors file without tlckpt's order metadata.
        pretty: indented JSON.
        max_json_bytes: the largest exact-bits JSON source read (see :func:`read_state`).

    Returns:
        A summary: tensor count, the encoding written, and what became of the names
        (``None`` when neither file has any).

    Raises:
        CheckpointError: the source is not well-formed or the destination cannot hold it
            exactly, or the source's order is not known and is needed; the destination is
            then untouched.
        OSError: from the file system.
    """
    state = read_state(src, src_format, max_json_bytes=max_json_bytes)
    names = None
    ordered_by = None
    if names_from is not None:
        if state.named:
            state = in_order(state, names_in(names_from), label_of(names_from))
            ordered_by = label_of(names_from)
        else:
            names = names_from_reference(names_from, state)
    written = write_state(state, dst, dst_format, encoding=encoding, names=names, pretty=pretty)
    if dst_format in POSITIONAL:
        kept = "dropped (TorchLean files are positional)" if state.named else None
        if ordered_by is not None:
            kept = f"dropped, tensors in the order of {ordered_by}"
    elif names is not None:
        kept = f"taken from {label_of(names_from)}"
    elif ordered_by is not None:
        kept = f"kept, in the order of {ordered_by}"
    else:
        kept = "kept" if state.named else "are the positions 0..n-1"
    return {
        "source": FORMATS[src_format],
        "target": FORMATS[dst_format],
        "tensors": len(state.tensors),
        "encoding": written,
        "names": kept,
    }
