"""Exporting a checkpoint set's model or a model file as a Hugging Face folder, without torch.

The tensors go from the source's file to the shards one at a time (each read into one
buffer, written, released); names, tied names, shards and index are those
``huggingface_hub.save_torch_state_dict`` gives the same state (:mod:`.shard_plan`), written
in the order of :mod:`.hf_writing`.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ...formats.safetensors import DTYPE_BY_NAME
from ..errors import ConfigError, SchemaMismatchError
from ..safetensors.writer import TensorData
from .export_sources import ExportSource, open_export_source, tie_groups
from .hf_writing import write_hf_folder
from .shard_plan import HFItem, hf_removals, parse_max_shard_size, plan_shards

__all__ = ["TiesUnknownWarning", "export_source", "export_tensors"]


class TiesUnknownWarning(UserWarning):
    """The source records no tied names (a version-1 set, a ``TLSF32B`` or exact-bits JSON
    file): every name is exported as a tensor of its own."""


def nbytes(item: TensorData) -> int:
    """The bytes of a tensor's data."""
    return math.prod(item.shape) * DTYPE_BY_NAME[item.dtype].bits // 8


def _raw(item: TensorData) -> np.ndarray:
    data = item.data() if callable(item.data) else item.data
    if isinstance(data, np.ndarray):
        return np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    return np.frombuffer(bytes(memoryview(data)), dtype=np.uint8)


def _given_groups(source: ExportSource, tied: Mapping[str, str]) -> list[list[str]]:
    """The groups of ``tied`` for a source without a record of its own, each name checked
    to exist and to hold the very bits of the name it is tied to."""
    known = set(source.names)
    for name, other in tied.items():
        if name not in known or other not in known or name == other:
            raise ConfigError(
                f"tied maps {name!r} to {other!r}; both must be names of {source.description}",
                field="tied",
                actual=[name, other],
            )
    groups = tie_groups(source.names, dict(tied))
    for group in groups:
        first = source.tensor(group[0])
        bits = _raw(first)
        for name in group[1:]:
            item = source.tensor(name)
            if (item.dtype, tuple(item.shape)) != (first.dtype, tuple(first.shape)) or not (
                np.array_equal(_raw(item), bits)
            ):
                raise SchemaMismatchError(
                    f"tied names {group[0]!r} and {name!r} hold different tensors in"
                    f" {source.description}",
                    field="tied",
                    actual=name,
                )
    return groups


def export_tensors(
    source: ExportSource,
    out_dir: str | os.PathLike,
    max_shard_size: int | str,
    tied: Mapping[str, str] | None = None,
) -> list[Path]:
    """Write ``source`` as a Hugging Face folder.

    Args:
        source: the named tensors, their order and ties.
        out_dir: the folder.
        max_shard_size: bytes, or a size such as ``"5GB"`` (powers of ten).
        tied: for a source that records no ties, which names are one tensor (name → the
            name it is tied to); ``{}`` says there are none.

    Returns:
        The files written, the index last.

    Raises:
        ConfigError: ``tied`` given for a source that records other ties, or naming
            unknown names; a bad ``max_shard_size``.
        SchemaMismatchError: ``tied`` names tensors of different values.
        CheckpointError: from the source or the writer; no index is written.
    """
    limit = parse_max_shard_size(max_shard_size)
    groups = source.groups
    if groups is None:
        if tied is None:
            warnings.warn(
                f"{source.description} records no tied names: each name is exported as a"
                " tensor of its own (give tied={...}, or {} for none, to say which are one"
                " tensor)",
                TiesUnknownWarning,
                stacklevel=3,
            )
            groups = []
        else:
            groups = _given_groups(source, tied)
    elif tied is not None and sorted(map(sorted, tie_groups(source.names, dict(tied)))) != sorted(
        map(sorted, groups)
    ):
        raise ConfigError(
            f"tied= differs from the ties {source.description} records",
            field="tied",
        )
    removals = hf_removals(groups)
    kept = [name for name in source.names if name not in removals]
    plan = plan_shards([HFItem(n, nbytes(source.tensor(n))) for n in kept], limit)
    return write_hf_folder(out_dir, plan, source.tensor, removals, before_commit=source.confirm)


def export_source(
    source: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    max_shard_size: int | str = "5GB",
    model: str | None = None,
    key: Any = None,
    names: Sequence[str] | None = None,
    tied: Mapping[str, str] | None = None,
) -> list[Path]:
    """Export a set's model or a model file (see
    :func:`~.export_sources.open_export_source` and :func:`export_tensors`)."""
    with open_export_source(source, model=model, key=key, names=names) as opened:
        return export_tensors(opened, out_dir, max_shard_size, tied)
