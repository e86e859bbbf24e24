"""Modules ↔ Hugging Face folders: a live state as ``huggingface_hub`` would save it, and a
folder's tensors planned into a module.

Exporting a module mirrors ``save_torch_state_dict(model.state_dict())``: names sharing
storage are found as it finds them (same device, storage and storage size, then split where
the views do not overlap), one name of each group kept (the alphabetically first of those
covering the whole storage), and each tensor sized as its storage (a view of a larger
storage counts the storage, as there).

Loading plans every value first, from every shard, and commits nothing unless all are read
and checked (:mod:`..commit.plans`). A model name is loaded from its own tensor in the
folder, else from the name the folder's metadata says it was dropped for (``dropped →
kept``), else — for a name the live model ties to another — from its partner's: the
folder may hold only one name of a tied group, as ``transformers`` allows.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any

import torch

from ...codec.errors import CheckpointError, SchemaMismatchError
from ...codec.hf_folders.hf_index import HFFolder
from ...codec.hf_folders.shard_plan import HFItem
from ...codec.safetensors.lazy import SafetensorsReader
from ..commit.plans import StatePlan
from .named_module_state import require_same
from .state_tensors import NamedTensors, state_tensors, tied_copies
from .tensor_files import empty_for, torch_dtype, torch_shape

__all__ = ["hf_state", "plan_hf_load", "hf_folder_tensors"]


def _storage(t: torch.Tensor) -> tuple[int, int]:
    storage = t.untyped_storage()
    return storage.data_ptr(), storage.nbytes()


def _end(t: torch.Tensor) -> int:
    if t.nelement():
        return t.view(-1)[-1].data_ptr() + t.element_size()
    return t.data_ptr()


def _shared_groups(state: Mapping[str, torch.Tensor]) -> list[set[str]]:
    """``huggingface_hub``'s ``_find_shared_tensors``: names by storage, split where their
    areas do not overlap."""
    by_storage: dict[Hashable, set[str]] = {}
    for name, t in state.items():
        ptr, size = _storage(t)
        if t.device.type != "meta" and ptr != 0 and size != 0:
            by_storage.setdefault((t.device, ptr, size), set()).add(name)
    out: list[set[str]] = []
    for shared in sorted(by_storage.values()):  # its order, sets compared as it compares them
        if len(shared) < 2:
            out.append(shared)
            continue
        areas = sorted((state[n].data_ptr(), _end(state[n]), n) for n in shared)
        _, last_stop, last_name = areas[0]
        out.append({last_name})
        for start, stop, name in areas[1:]:
            if start >= last_stop:
                out.append({name})
            else:
                out[-1].add(name)
            last_stop = stop
    return out


def _complete(t: torch.Tensor) -> bool:
    ptr, size = _storage(t)
    return t.data_ptr() == ptr and t.nelement() * t.element_size() == size


def hf_state(
    state: Mapping[str, torch.Tensor],
) -> tuple[dict[str, torch.Tensor], dict[str, str], list[HFItem]]:
    """A state as ``huggingface_hub`` saves it.

    Returns:
        The kept tensors (contiguous) by name in state order; dropped name → kept name; the
        items for :func:`~tlckpt.codec.hf_folders.shard_plan.plan_shards`.

    Raises:
        CheckpointError: a group of names sharing storage none of which covers it (a
            partial view; ``huggingface_hub`` refuses it too); an entry that is not a
            tensor.
    """
    for name, t in state.items():
        if not isinstance(t, torch.Tensor):
            raise CheckpointError(f"{name!r} is a {type(t).__name__}, not a tensor", field=name)
    removals: dict[str, str] = {}
    for shared in _shared_groups(state):
        complete = sorted(n for n in shared if _complete(state[n]))
        if not complete:
            raise CheckpointError(
                f"the tensors {sorted(shared)} share storage and none covers all of it;"
                " export copies of them (.clone())",
                field=sorted(shared)[0],
            )
        for name in sorted(shared):
            if name != complete[0]:
                removals.setdefault(name, complete[0])
    kept = {n: t.detach().contiguous() for n, t in state.items() if n not in removals}
    items = []
    for name, t in kept.items():
        ptr, size = _storage(t)
        items.append(HFItem(name, size, None if t.device.type == "meta" else (t.device, ptr, size)))
    return kept, removals, items


def _sources(named: NamedTensors, names: set[str], aliases: Mapping[str, str]) -> dict[str, str]:
    sources: dict[str, str] = {}
    for name, _ in named:
        if name in names:
            sources[name] = name
        elif aliases.get(name) in names:
            sources[name] = aliases[name]
    return sources


def _read(folder: HFFolder, wanted: dict[str, str], named: NamedTensors) -> dict[str, Any]:
    """Each wanted folder tensor, read from its file into fresh memory (``wanted``: folder
    name → a model name it feeds, for the checks)."""
    live = dict(named)
    staged: dict[str, torch.Tensor] = {}
    by_file: dict[str, list[str]] = {}
    for name in wanted:
        file = next(iter(folder.files)) if folder.weight_map is None else folder.weight_map[name]
        by_file.setdefault(file, []).append(name)
    for file, names in by_file.items():
        with SafetensorsReader(folder.files[file]) as reader:
            for name in names:
                try:
                    entry = reader.entry(name)
                except CheckpointError:
                    raise SchemaMismatchError(
                        f"the index puts {name!r} in {file!r}, which does not hold it",
                        path=folder.files[file],
                        field=name,
                    ) from None
                dtype = torch_dtype(entry)
                require_same(
                    wanted[name],
                    live[wanted[name]],
                    dtype,
                    torch_shape(entry, dtype),
                    name,
                    "the folder",
                )
                tensor = empty_for(entry)
                reader.read_into(name, tensor.reshape(-1).view(torch.uint8).numpy())
                staged[name] = tensor
    return staged


def plan_hf_load(
    module: Any, folder: HFFolder, *, strict: bool
) -> tuple[StatePlan, list[str], list[str]]:
    """Read and check every tensor the module takes from ``folder``; nothing live changes.

    Returns:
        The plan, the missing model names and the unexpected folder names.

    Raises:
        SchemaMismatchError: with ``strict``, names missing or unexpected; a shape that
            differs; a tensor the index places in a file that lacks it; tied names given
            different values.
        ConfigError: a dtype that differs.
        CheckpointError: a shard that is not a valid safetensors file.
    """
    named = state_tensors(module)
    if folder.weight_map is not None:
        names = set(folder.weight_map)
        aliases = folder.metadata
    else:
        with SafetensorsReader(next(iter(folder.files.values()))) as reader:
            names = set(reader.header.entries)
            aliases = dict(reader.header.metadata or {})
    sources = _sources(named, names, aliases)
    copies = tied_copies(named)
    group_of = {i: copies.get(i, i) for i in range(len(named))}
    fed = {group_of[i] for i, (name, _) in enumerate(named) if name in sources}
    missing = [n for i, (n, _) in enumerate(named) if n not in sources and group_of[i] not in fed]
    unexpected = sorted(names - set(sources.values()))
    if strict and (missing or unexpected):
        raise SchemaMismatchError(
            f"the names differ: missing in the folder {missing[:8]}, unexpected in the folder"
            f" {unexpected[:8]} (strict=False loads the names both have)",
            field="names",
            actual=unexpected[:8],
            expected=missing[:8],
        )
    wanted: dict[str, str] = {}
    for name, _ in named:
        if name in sources:
            wanted.setdefault(sources[name], name)
    staged = _read(folder, wanted, named)
    for name, live in named:  # the names fed by a tensor read for another name
        if name in sources and wanted[sources[name]] != name:
            value = staged[sources[name]]
            require_same(name, live, value.dtype, tuple(value.shape), sources[name], "the folder")
    pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
    first_of_group: dict[int, torch.Tensor] = {}
    for i, (name, live) in enumerate(named):
        if name not in sources:
            continue
        value = staged[sources[name]]
        group = group_of[i]
        if group in first_of_group:  # one memory: its first value is written, the rest agree
            if not torch.equal(_bits(value), _bits(first_of_group[group])):
                raise SchemaMismatchError(
                    f"{name!r} and {named[group][0]!r} are one tensor in the model and differ"
                    " in the folder",
                    field=name,
                )
            continue
        first_of_group[group] = value
        pairs.append((live, value if live.device.type == "cpu" else value.to(live.device)))
    return StatePlan(pairs), missing, unexpected


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.uint8)


def hf_folder_tensors(folder: HFFolder) -> dict[str, torch.Tensor]:
    """Every tensor of ``folder``, read exactly into fresh CPU tensors, in the index's order
    (a single file's: its header's); each name dropped for a tie (the metadata's ``dropped
    → kept``) is the very tensor of the name it was dropped for.

    Raises:
        SchemaMismatchError: a tensor the index places in a file that lacks it.
        CheckpointError: a shard that is not a valid safetensors file.
    """
    out: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = dict(folder.metadata)
    by_file: dict[str, list[str]] = {}
    for name, file in (folder.weight_map or {}).items():
        by_file.setdefault(file, []).append(name)
    for file, path in folder.files.items():
        with SafetensorsReader(path) as reader:
            if folder.weight_map is None:
                names = list(reader.header.entries)
                aliases = dict(reader.header.metadata or {})
            else:
                names = by_file[file]
            for name in names:
                try:
                    entry = reader.entry(name)
                except CheckpointError:
                    raise SchemaMismatchError(
                        f"the index puts {name!r} in {file!r}, which does not hold it",
                        path=path,
                        field=name,
                    ) from None
                tensor = empty_for(entry)
                reader.read_into(name, tensor.reshape(-1).view(torch.uint8).numpy())
                out[name] = tensor
    for dropped, kept in aliases.items():
        if dropped not in out and kept in out:
            out[dropped] = out[kept]
    return out
