"""What an export reads: a checkpoint set's model member, or a model file, as named tensors
produced one at a time, with the ties the source records.

* **A set** (a step folder, or a :class:`CheckpointManager` directory: its newest set that
  verifies) is opened and verified whole first; the tensors are then read through the
  verified handles, and the members are checked unchanged before the export commits. The
  names and ties are the manifest's: a version-2 manifest records, for each model member,
  which names are one tensor (``tied``); a version-1 manifest (one float32 or exact-bits
  model, the TorchLean layout) records names but no ties.
* **A safetensors file**: its names, and its ties as ``save_model`` records them
  (``__metadata__`` entries ``dropped → kept``). Its order is the file's.
* **A ``TLSF32B`` or exact-bits JSON file**: tensors by position; the names must be given.

Where a source records no ties, :attr:`ExportSource.groups` is ``None`` and the caller
decides (equal values are not a tie: two names may hold equal values and be two tensors).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ...formats.checkpoint_set import MANIFEST_FILE
from ...formats.float32_state import TENSOR_DTYPE
from ...formats.safetensors import DTYPES
from ..errors import CheckpointError, ConfigError
from ..fileio.source import open_source
from ..inspection import sniff_family
from ..model_state.float32_state import scan_float32_sizes
from ..model_state.float32_state_writer import float32_state_layout
from ..model_state.state_bits import inspect_state_bits, read_state_bits
from ..safetensors.lazy import SafetensorsReader
from ..safetensors.writer import TensorData
from ..sets.checkpoint_set import VerifiedSet, latest_verified
from ..sets.set_folders import set_path
from ..sets.set_manifest_v2 import member_role
from ..sniffing import JSON_FAMILY

__all__ = ["ExportSource", "tie_groups", "open_export_source"]

_SAFETENSORS = "safetensors"
_FLOAT32 = "float32_state"
_WORD_OF_ENCODING = {d.torch: d.name for d in DTYPES if d.torch}


@dataclass
class ExportSource:
    """Named tensors to export.

    Attributes:
        names: every state name, in the source's order (tied names included).
        groups: the tie groups (names that are one tensor, two or more), in the order of
            their first name; ``None`` where the source records no ties.
        tensor: name → its :class:`TensorData` (bytes read when the writer asks).
        confirm: raises if the source changed since it was opened.
        description: what the source is, for messages.
    """

    names: list[str]
    groups: list[list[str]] | None
    tensor: Callable[[str], TensorData]
    confirm: Callable[[], None]
    description: str


def tie_groups(names: Sequence[str], tied: dict[str, str]) -> list[list[str]]:
    """Groups of ``names`` from ``tied`` (name → the name it is one tensor with), in the
    order of each group's first name."""

    groups: dict[str, list[str]] = {}
    for name in names:
        groups.setdefault(_root(name, tied), []).append(name)
    return [g for g in groups.values() if len(g) > 1]


def _safetensors_tensors(reader: SafetensorsReader, stored_of: dict[str, str]) -> Callable:
    def tensor(name: str) -> TensorData:
        stored = stored_of.get(name, name)
        entry = reader.entry(stored)
        return TensorData(entry.dtype.name, entry.shape, lambda: reader.array(stored))

    return tensor


def _positional_tensors(file: Any, family: str, names: Sequence[str], where: str) -> Callable:
    """name → TensorData for a ``TLSF32B`` or exact-bits JSON file (``file`` a path or an
    open handle), whose positions are ``names``."""

    def fresh() -> Any:  # a path, or the handle back at its start
        if not isinstance(file, (str, os.PathLike)):
            file.seek(0)
        return file

    if family == _FLOAT32:
        _, shapes, _ = scan_float32_sizes(fresh())
        offsets = [p.offset for p in float32_state_layout(shapes).payloads]
        word = "F32"
    else:
        info = inspect_state_bits(fresh())
        shapes = [tuple(t["shape"]) for t in info["tensors"]]
        encoding = info.get("encoding") or info["format"]
        word = _WORD_OF_ENCODING.get(encoding, "")
        if not word:
            raise ConfigError(
                f"{where} holds {encoding}, which the safetensors layout cannot hold",
                actual=encoding,
            )
    if len(shapes) != len(names):
        raise CheckpointError(
            f"{where} holds {len(shapes)} tensors, and {len(names)} names are known for them",
            actual=len(shapes),
            expected=len(names),
        )
    position = {name: i for i, name in enumerate(names)}
    cached: list[np.ndarray] = []

    def payload(i: int) -> np.ndarray:
        if family == _FLOAT32:
            array = np.empty(shapes[i], dtype=TENSOR_DTYPE)
            with open_source(fresh()) as src:
                src.need(offsets[i] + array.nbytes, names[i], offset=0)
                src.seek(src.start + offsets[i])
                src.readinto(array, names[i])
            return array
        if not cached:  # a JSON document is read whole, once
            cached.extend(read_state_bits(fresh(), shapes, encoding))
        return cached[i]

    def tensor(name: str) -> TensorData:
        i = position[name]
        return TensorData(word, shapes[i], lambda: payload(i))

    return tensor


@contextlib.contextmanager
def _open_set(folder: Path, model: str | None, key: Any) -> Iterator[ExportSource]:
    with VerifiedSet.open(folder, key=key) as verified:
        manifest = verified.manifest
        structure = manifest.structure or {}
        kind, keys = structure.get("model") or ("single", None)
        if kind == "single":
            if model is not None:
                raise ConfigError(
                    f"the set of {folder} holds one model; model={model!r} names none",
                    field="model",
                    actual=model,
                )
            role = "model"
        else:
            if model is None or model not in (keys or ()):
                raise ConfigError(
                    f"the set of {folder} holds the models {list(keys or ())}: choose one"
                    f" with model=… (got {model!r})",
                    field="model",
                    actual=model,
                    expected=list(keys or ()),
                )
            role = member_role("model", kind, model)
        record = manifest.members[role]
        if record.tensors is not None:
            names = [name for name, _ in record.tensors]
            groups: list[list[str]] | None = tie_groups(names, record.tied or {})
        else:  # version 1: the manifest's state, no ties recorded
            names = [name for name, _ in manifest.state]
            groups = None
        where = f"member {role} of the set {folder}"
        f = verified.file(role)
        if record.family == _SAFETENSORS:
            reader = SafetensorsReader(f)
            tied = record.tied or {}
            stored_of = {n: _root(n, tied) for n in names if n not in reader.header.entries}
            tensor = _safetensors_tensors(reader, stored_of)
        elif record.family in (_FLOAT32, JSON_FAMILY):
            tensor = _positional_tensors(f, record.family, names, where)
        else:
            raise CheckpointError(f"{where} is a {record.family} file", actual=record.family)
        yield ExportSource(names, groups, tensor, verified.confirm_unchanged, where)


def _root(name: str, tied: dict[str, str]) -> str:
    seen = {name}
    while name in tied and tied[name] not in seen:
        name = tied[name]
        seen.add(name)
    return name


@contextlib.contextmanager
def _open_file(path: Path, names: Sequence[str] | None) -> Iterator[ExportSource]:
    family = sniff_family(path)
    where = f"the {family} file {path}"
    if family == _SAFETENSORS:
        if names is not None:
            raise ConfigError("names= is for files without names (TLSF32B, exact-bits JSON)")
        with SafetensorsReader(path) as reader:
            entries = reader.header.entries
            aliases = {
                k: v
                for k, v in (reader.header.metadata or {}).items()
                if k not in entries and v in entries
            }
            dropped: dict[str, list[str]] = {}
            for k, v in aliases.items():
                dropped.setdefault(v, []).append(k)
            order: list[str] = []
            for name in entries:  # each dropped name right after the name it is tied to
                order.append(name)
                order.extend(dropped.get(name, ()))
            yield ExportSource(
                order,
                tie_groups(order, aliases),
                _safetensors_tensors(reader, aliases),
                lambda: None,
                where,
            )
        return
    if family not in (_FLOAT32, JSON_FAMILY):
        raise CheckpointError(f"{where} holds no model state", actual=family)
    if names is None:
        raise ConfigError(
            f"{where} holds tensors by position, without names: give names=[…] (the"
            " model's state_dict() keys, in order), or export the set it belongs to",
            field="names",
        )
    yield ExportSource(
        list(names), None, _positional_tensors(path, family, names, where), lambda: None, where
    )


@contextlib.contextmanager
def open_export_source(
    source: str | os.PathLike,
    *,
    model: str | None = None,
    key: Any = None,
    names: Sequence[str] | None = None,
) -> Iterator[ExportSource]:
    """Open ``source`` for an export (see the module docstring).

    Args:
        source: a set's folder, a :class:`CheckpointManager` directory, or a model file.
        model: the model's key, for a set of several models.
        key: the key a signed set was signed with.
        names: the names of a positional file's tensors, in order.

    Raises:
        CheckpointError: no verified set in a directory; a set that does not verify; a
            multi-model set without ``model`` (``ConfigError`` listing the keys); a file
            of no model family; a positional file without ``names``.
        OSError: from the file system.
    """
    path = Path(source)
    if path.is_dir():
        if not (path / MANIFEST_FILE).exists():
            step = latest_verified(path, key=key)
            if step is None:
                raise CheckpointError(f"{path} holds no checkpoint set that verifies", path=path)
            path = set_path(path, step)
        with _open_set(path, model, key) as opened:
            yield opened
        return
    if model is not None:
        raise ConfigError("model= chooses a model of a set; the source is a file", field="model")
    with _open_file(path, names) as opened:
        yield opened
