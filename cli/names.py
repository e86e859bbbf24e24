"""Tensor names in order, for ``tlckpt convert``'s ``names_from`` / ``--names-from``.

TorchLean files are positional; safetensors and ``.pt`` files are named. Going from a
positional source to a named file, the names come from a reference (:func:`names_in`); a named
source is put into a reference's order (:func:`in_order`), which is how a safetensors file
without tlckpt's order metadata becomes a positional file.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from ..codec import CheckpointError, MalformedError, SchemaMismatchError
from ..codec.fileio.source import open_regular
from .file_formats import POSITIONAL, format_of_path
from .named_formats import NAMED_READERS, ORDER_KEY, read_pt, safetensors_names, stored_order
from .tensor_state import State

__all__ = ["NameSource", "label_of", "names_in", "in_order", "names_from_reference"]

#: What gives tensor names in order: a file (see :func:`names_in`), a sequence of names, a
#: mapping (a state_dict: its keys) or a module (its ``state_dict()``'s keys).
NameSource = Any


def label_of(reference: NameSource) -> str:
    if isinstance(reference, (str, os.PathLike)):
        return os.fspath(reference)
    return "the given names"


def _unique_names(names: list[Any], where: str) -> list[str]:
    seen: set[str] = set()
    for name in names:
        if not isinstance(name, str):
            raise CheckpointError(f"{where}: name {name!r} is not a string", field="names-from")
        if name in seen:
            raise CheckpointError(f"{where}: name {name!r} appears twice", field="names-from")
        seen.add(name)
    return names


def _names_in_file(path: str | os.PathLike) -> list[str]:
    where = os.fspath(path)
    fmt = format_of_path(path)
    if fmt == "safetensors":
        keys, tied, stored = safetensors_names(path)
        if stored is None:
            raise CheckpointError(
                f"{where} has no {ORDER_KEY!r} metadata either: its order is not known",
                field="names-from",
            )
        return stored_order(path, stored, keys + list(tied))
    if fmt == "pt":
        ref = read_pt(path)
        if not ref.named:
            raise CheckpointError(f"{where} holds no names", field="names-from")
        return [str(t.name) for t in ref.tensors]
    if fmt in POSITIONAL:
        raise CheckpointError(
            f"{where} is positional and holds no names; --names-from takes a text file of"
            " names, one per line, or a .pt/.safetensors file",
            field="names-from",
        )
    with open_regular(path) as f:  # a FIFO or a device is refused, never read
        data = f.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MalformedError(
            f"a names file is UTF-8 text, one name per line: {exc}",
            path=path,
            field="names-from",
        ) from None
    return _unique_names([line for line in text.splitlines() if line.strip()], where)


def names_in(reference: NameSource) -> list[str]:
    """Tensor names in order, from a reference.

    Args:
        reference: a path — a ``.pt``/``.pth`` state_dict (its key order), a ``.safetensors``
            file with tlckpt's order metadata, or any other file as UTF-8 text, one name per
            line (blank lines ignored) — or a sequence of names, a mapping (a state_dict:
            its keys) or a module (its ``state_dict()``'s keys).

    Returns:
        The names, each once.

    Raises:
        CheckpointError: the reference holds no names, or repeats one.
        OSError: from the file system.
    """
    if isinstance(reference, (str, os.PathLike)):
        return _names_in_file(reference)
    if isinstance(reference, Mapping):
        names = list(reference.keys())
    elif callable(getattr(reference, "state_dict", None)):
        names = list(reference.state_dict().keys())
    elif isinstance(reference, Sequence):
        names = list(reference)
    else:
        raise TypeError(
            "names_from takes a path, a sequence of names, a state_dict or a module,"
            f" not {type(reference).__name__}"
        )
    return _unique_names(names, "the given names")


def in_order(state: State, names: list[str], where: str) -> State:
    """A named state's tensors in the order of ``names``, which must name each exactly once."""
    by_name = {t.name: t for t in state.tensors}
    listed = set(names)
    missing = [n for n in names if n not in by_name]
    extra = [str(n) for n in by_name if n not in listed]
    if missing or extra:

        def few(items: list[str]) -> str:
            return ", ".join(map(repr, items[:5])) + (
                f" and {len(items) - 5} more" if len(items) > 5 else ""
            )

        parts = [f"{len(missing)} not in the file ({few(missing)})"] if missing else []
        parts += [f"{len(extra)} of the file's not listed ({few(extra)})"] if extra else []
        raise SchemaMismatchError(
            f"the order in {where} must name exactly the file's {len(by_name)} tensors: "
            + "; ".join(parts),
            field="names-from",
            actual=sorted(listed),
            expected=sorted(map(str, by_name)),
        )
    return State([by_name[n] for n in names], state.encoding, named=True, ordered=True)


def names_from_reference(reference: NameSource, state: State) -> list[str]:
    """Names for a positional state's tensors, from a reference with as many (and, for a
    model-state file, the same shapes)."""
    where = label_of(reference)
    fmt = format_of_path(reference) if isinstance(reference, (str, os.PathLike)) else None
    if fmt in NAMED_READERS:
        ref = NAMED_READERS[fmt](reference)
        if not ref.named:
            raise CheckpointError(f"{where} holds no names", field="names-from")
        if not ref.ordered:
            raise CheckpointError(
                f"{where} has no {ORDER_KEY!r} metadata: the order of its names is not known",
                field="names-from",
            )
        shapes: list[tuple[int, ...]] | None = [t.shape for t in ref.tensors]
        names = [str(t.name) for t in ref.tensors]
    else:
        shapes, names = None, names_in(reference)
    if len(names) != len(state.tensors):
        raise SchemaMismatchError(
            f"{where} has {len(names)} tensors, the source {len(state.tensors)}",
            field="names-from",
            actual=len(state.tensors),
            expected=len(names),
        )
    for i, (want, t) in enumerate(zip(shapes or [], state.tensors)):
        if want != t.shape:
            raise SchemaMismatchError(
                f"tensor {i}: shape {t.shape} in the source, {want} for {names[i]!r} in {where}",
                field=f"tensors[{i}]",
                actual=t.shape,
                expected=want,
            )
    return names
