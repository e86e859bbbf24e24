"""Hugging Face model folders: ``export_hf`` and ``load_hf``.

``export_hf`` writes ``model.safetensors``, or ``model-0000i-of-0000N.safetensors`` and
``model.safetensors.index.json``, as ``huggingface_hub.save_torch_state_dict`` names, cuts and
indexes them (tied names as it drops them; the shards' bytes equal its), from a module, a
checkpoint set or a model file — from a set or a file one tensor at a time, without torch
(:mod:`tlckpt.codec.hf_folders`). ``load_hf`` loads such a folder into a module through the
hostile-input-safe safetensors reader, all or nothing.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from ..codec.errors import ConfigError, names_the_file
from ..codec.hf_folders.hf_export import export_source
from ..codec.hf_folders.hf_index import read_hf_folder
from ..codec.hf_folders.hf_writing import write_hf_folder
from ..codec.hf_folders.shard_plan import parse_max_shard_size, plan_shards
from .ops.hf_modules import hf_state, plan_hf_load
from .ops.tensor_files import tensor_data
from .placement.choice import placement_for
from .placement.local_placement import LOCAL

__all__ = ["export_hf", "load_hf"]


def export_hf(
    source: Any,
    out_dir: str | os.PathLike,
    *,
    max_shard_size: int | str = "5GB",
    model: str | None = None,
    key: Any = None,
    names: Sequence[str] | None = None,
    tied: Mapping[str, str] | None = None,
) -> list[Path]:
    """Write a model's state as a Hugging Face folder, as ``huggingface_hub`` would.

    The shards are written first, each atomically, and the index last; an index left by an
    earlier export is removed first and its stale shards after, so that an interrupted
    export never leaves an index over a mix of files (see
    :mod:`tlckpt.codec.hf_folders.hf_writing`). Other files of ``out_dir`` stay.

    Args:
        source: an ``nn.Module`` or a mapping of names to tensors (its ``state_dict``); a
            checkpoint set's folder, or a :class:`CheckpointManager` directory (its newest
            set that verifies); or a model file (safetensors, ``TLSF32B``, exact-bits
            JSON).
        out_dir: the folder (made if missing).
        max_shard_size: the most bytes per shard, an int or a string such as ``"5GB"`` or
            ``"20KB"`` (powers of ten, as ``huggingface_hub`` reads them); a larger tensor
            gets a shard of its own.
        model: for a set of several models, the key of the one to export.
        key: the key a signed set was signed with.
        names: the names of a ``TLSF32B`` or exact-bits JSON file's tensors, in order.
        tied: for a source that records no ties (a version-1 set, a ``TLSF32B`` or JSON
            file), which names are one tensor (name → the name it is tied to; checked to
            hold the same bits); ``{}`` says none. Without it such a source exports every
            name as its own tensor, with a :class:`TiesUnknownWarning`.

    Returns:
        The files written, the index last.

    Raises:
        CheckpointError: a set that does not verify, a source of no model, a dtype the
            layout cannot hold; nothing is committed (no index).
        ConfigError: an option that does not fit the source; a bad ``max_shard_size``.
        OSError: from the file system.

    Example:
        >>> export_hf(model, "hf", max_shard_size="2GB")          # doctest: +SKIP
        >>> export_hf("checkpoints", "hf")                       # doctest: +SKIP
    """
    if isinstance(source, (torch.nn.Module, Mapping)):
        if model is not None or key is not None or names is not None or tied is not None:
            raise ConfigError(
                "model=, key=, names= and tied= are for sets and files; a module's ties are"
                " its shared storage",
                field="source",
            )
        if isinstance(source, torch.nn.Module):
            if placement_for(source) is not LOCAL:
                raise ConfigError("export_hf takes a local module (gather a sharded one)")
            source = source.state_dict()
        kept, removals, items = hf_state(source)
        data = {name: tensor_data(t, name) for name, t in kept.items()}  # all checked first
        plan = plan_shards(items, parse_max_shard_size(max_shard_size))
        return write_hf_folder(out_dir, plan, data.__getitem__, removals)
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError(
            f"export_hf takes a module, a state dict or a path, not {type(source).__name__}"
        )
    return export_source(
        source,
        out_dir,
        max_shard_size=max_shard_size,
        model=model,
        key=key,
        names=names,
        tied=tied,
    )


@names_the_file("hf_dir")
def load_hf(
    model: torch.nn.Module, hf_dir: str | os.PathLike, *, strict: bool = True
) -> tuple[list[str], list[str]]:
    """Load a Hugging Face folder (``model.safetensors``, or shards and their index) into
    ``model``, exactly and all or nothing.

    Every file the index names must lie inside the folder (no absolute path, no ``..``, no
    symlink out of it) and hold the tensors the index puts there. Every value is read and
    checked before any is written; an error, or Ctrl-C, leaves the model as it was. A name
    the model ties to another may be absent when its partner is there (as ``transformers``
    saves tied weights); names dropped for a tie in the metadata (``dropped → kept``) are
    read from the kept tensor.

    Args:
        model: the module; its tensors keep their device and dtype (no conversion: a
            dtype that differs is refused).
        hf_dir: the folder.
        strict: refuse names the model has and the folder lacks, or the other way round;
            ``False`` loads the names both have.

    Returns:
        ``(missing, unexpected)``: the model's names the folder did not fill, the folder's
        names the model has not (both empty when ``strict``).

    Raises:
        CheckpointError: the index or a shard is malformed or unsafe (a subclass naming
            the file and what is wrong), a shard is missing, names or shapes differ
            (``SchemaMismatchError``), a dtype differs (``ConfigError``).
        OSError: from the file system.

    Example:
        >>> load_hf(model, "hf")                                  # doctest: +SKIP
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"load_hf loads into an nn.Module, not {type(model).__name__}")
    if placement_for(model) is not LOCAL:
        raise ConfigError("load_hf loads into a local module (not a sharded one)")
    folder = read_hf_folder(hf_dir)
    plan, missing, unexpected = plan_hf_load(model, folder, strict=strict)
    plan.commit()
    return missing, unexpected
