"""The named formats of ``tlckpt convert``: safetensors files and torch state_dicts.

Safetensors files are read and written by the repository's own codec
(:mod:`tlckpt.codec.safetensors`, :mod:`tlckpt.runtime.ops.tensor_files`), never by the
``safetensors`` package. Tensors in these files are known by name. A safetensors file
written by tlckpt keeps the tensors' order in its ``__metadata__`` entry :data:`ORDER_KEY`;
one written by another tool does not say which tensor comes first, and is read in name
order, marked unordered. Tied names (``other → kept`` entries, as ``save_model`` writes them)
stand for their kept tensor. Optimizer trees and state trees are refused. ``.pt`` files are
read only with ``torch.load(weights_only=True)``: no code runs.
"""

from __future__ import annotations

import collections
import os
from typing import Any

import orjson

from ..codec import (
    CheckpointError,
    ConfigError,
    MalformedError,
    UnsupportedFormatError,
    atomic_output,
)
from ..codec.fileio.source import open_regular, open_source
from ..codec.safetensors.reader import read_header
from ..formats.optimizer_tree import DOCUMENT_KEY
from .tensor_state import State, from_torch, label, to_torch, torch_module

__all__ = [
    "ORDER_KEY",
    "SAFETENSORS_MISSING",
    "NAMED_READERS",
    "read_safetensors",
    "read_pt",
    "safetensors_names",
    "TREE_KEYS",
    "stored_order",
    "names_for",
    "write_named",
]

#: safetensors ``__metadata__`` key holding the tensors' order (a JSON list of names).
ORDER_KEY = "tlckpt.order"

#: ``__metadata__`` keys of the safetensors files that are not model state: what each is, and
#: what reads it instead (``tlckpt.state`` is ``runtime.ops.state_trees.STATE_KEY``, named
#: here without importing torch).
TREE_KEYS = (
    (DOCUMENT_KEY, "an optimizer's state (an optimizer tree)", "load it with load_optimizer"),
    ("tlckpt.state", "a state tree", "load it with load_state"),
)

#: Encodings torch has and safetensors 0.8 does not (its dtype table lacks them).
SAFETENSORS_MISSING = frozenset({"complex128", "complex32"})


def _refuse_trees(path: str | os.PathLike, header: Any) -> None:
    """A safetensors file that is not model state (an optimizer tree, a state tree) keeps its
    structure in ``__metadata__``, which no target format of ``convert`` holds: refused."""
    metadata = header.metadata or {}
    for key, what, how in TREE_KEYS:
        if key in metadata:
            raise ConfigError(
                f"this safetensors file is {what}, not model state: its structure lives in its"
                f" __metadata__ ({key!r}), which convert's formats do not hold; {how}",
                path=path,
                field=f"__metadata__.{key}",
            )


def safetensors_names(path: str | os.PathLike) -> tuple[list[str], dict[str, str], str | None]:
    """The tensor names of a safetensors file of model state (header order), the tied names
    its ``__metadata__`` records (``other → kept``, as ``save_model`` and
    ``save_module_state`` write them) and its :data:`ORDER_KEY` entry (``None`` if absent).

    Raises:
        CheckpointError: not a valid safetensors file, or not model state.
    """
    open_regular(path).close()  # a FIFO or a device is refused, never handed to the reader
    try:
        with open_source(path) as src:
            header = read_header(src)
    except CheckpointError as exc:
        raise exc.with_path(path) from None
    _refuse_trees(path, header)
    metadata = header.metadata or {}
    tied = {
        k: v
        for k, v in metadata.items()
        if k != ORDER_KEY and k not in header.entries and v in header.entries
    }
    return list(header.entries), tied, metadata.get(ORDER_KEY)


def read_safetensors(path: str | os.PathLike) -> State:
    """A safetensors file of model state, read exactly by the repository's own reader; a
    tied name (metadata ``other → kept``) stands for its kept tensor."""
    torch_module()
    from ..runtime.ops.tensor_files import read_entry

    keys, tied, stored = safetensors_names(path)
    names = keys + list(tied)
    # Without tlckpt's order the file does not say which tensor comes first: name order
    # here, marked unordered (a positional target then needs the order given).
    order = sorted(names) if stored is None else stored_order(path, stored, names)
    try:
        with open_source(path) as src:
            header = read_header(src)
            read = {k: read_entry(src, header, header.entries[k]) for k in keys}
    except CheckpointError as exc:
        raise exc.with_path(path) from None
    tensors = [from_torch(k, read[tied.get(k, k)]) for k in order]
    return State(tensors, None, named=True, ordered=stored is not None)


def stored_order(path: str | os.PathLike, stored: str, keys: list[str]) -> list[str]:
    try:
        names = orjson.loads(stored)
    except orjson.JSONDecodeError:
        names = None
    if (
        not isinstance(names, list)
        or not all(isinstance(n, str) for n in names)
        or sorted(names) != sorted(keys)
    ):
        raise MalformedError(
            f"safetensors metadata {ORDER_KEY!r} does not list the file's tensors exactly once",
            path=path,
            field=f"__metadata__.{ORDER_KEY}",
        )
    return names


def read_pt(path: str | os.PathLike) -> State:
    torch = torch_module()
    open_regular(path).close()  # a FIFO or a device is refused, never handed to the reader
    try:
        loaded = torch.load(os.fspath(path), map_location="cpu", weights_only=True)
    except OSError:
        raise
    except Exception as exc:  # torch raises a zoo of types on hostile bytes; none may escape
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UnsupportedFormatError(
            f"not a torch state_dict loadable with weights_only=True: {first}", path=path
        ) from None
    if isinstance(loaded, dict):
        items = list(loaded.items())
        named = True
    elif isinstance(loaded, (list, tuple)):
        items = [(None, t) for t in loaded]
        named = False
    else:
        raise MalformedError(
            f"expected a state_dict (a mapping of names to tensors), found a"
            f" {type(loaded).__name__}",
            path=path,
        )
    tensors = []
    for name, t in items:
        if not isinstance(t, torch.Tensor):
            raise MalformedError(
                f"entry {name!r} is a {type(t).__name__}, not a tensor; only flat"
                " state_dicts convert",
                path=path,
                field=str(name),
            )
        if name is not None and not isinstance(name, str):
            raise MalformedError(f"key {name!r} is not a string", path=path, field=str(name))
        tensors.append(from_torch(name, t))
    return State(tensors, None, named=named)


def names_for(state: State, names: list[str] | None) -> list[str]:
    if names is not None:
        return names
    if state.named:
        return [str(t.name) for t in state.tensors]
    return [str(i) for i in range(len(state.tensors))]


def write_named(state: State, path: str | os.PathLike, fmt: str, names: list[str]) -> None:
    torch = torch_module()
    if fmt == "safetensors":
        for i, t in enumerate(state.tensors):
            if t.encoding in SAFETENSORS_MISSING:
                raise ConfigError(
                    f"{label(t, i)} is {t.encoding}, which safetensors cannot hold;"
                    " convert it to .pt or exact-bits JSON instead",
                    field=t.name or f"tensors[{i}]",
                    actual=t.encoding,
                )
    tensors = [to_torch(t) for t in state.tensors]
    if len(set(names)) != len(names):
        raise CheckpointError("tensor names are not unique", field="names")
    if fmt == "safetensors":
        from ..runtime.ops.tensor_files import save_tensors

        metadata = {ORDER_KEY: orjson.dumps(names).decode()}
        save_tensors(dict(zip(names, tensors)), path, metadata=metadata)
    else:
        with atomic_output(path) as f:
            torch.save(collections.OrderedDict(zip(names, tensors)), f)


#: Readers of the named formats, by format name.
NAMED_READERS = {"safetensors": read_safetensors, "pt": read_pt}
