"""``huggingface_hub.save_torch_state_dict``'s choices, reproduced without it.

* **Tied names** (:func:`hf_removals`): of each group of names that are one tensor, the
  alphabetically first is kept and the others are dropped, each recorded in the metadata as
  ``dropped → kept`` (its ``_remove_duplicate_names`` without ``discard_names``). Groups come
  in the order of their first name in the state; a group's dropped names sorted.
* **Shards** (:func:`plan_shards`): the state, tied names dropped, is walked in order; a
  tensor larger than the limit gets a shard of its own, appended at once (before the shard
  being filled); a tensor that would take the current shard over the limit closes it.
  Tensors sharing storage go to the shard of the first of them (its
  ``split_state_dict_into_shards_factory``).
* **Names**: ``model.safetensors`` for one shard, else ``model-{i:05d}-of-{n:05d}.safetensors``
  and ``model.safetensors.index.json``: ``{"metadata": {"total_size": …, dropped → kept…},
  "weight_map": {name: file…}}`` in shard order, as ``json.dump(…, indent=2)`` writes it.
* **Sizes** (:func:`parse_max_shard_size`): an int, or digits and a unit of
  ``huggingface_hub``'s (``"20KB"`` is 20,000 bytes; TB, GB, MB, KB: powers of ten).
"""

from __future__ import annotations

import json
import math
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from ..errors import ConfigError

__all__ = [
    "SINGLE_FILE",
    "INDEX_FILE",
    "SHARD_PATTERN",
    "HFItem",
    "ShardPlan",
    "hf_removals",
    "index_bytes",
    "parse_max_shard_size",
    "plan_shards",
    "shard_file_name",
]

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
#: The shard names ``huggingface_hub`` removes before it saves (and so do we, after).
SHARD_PATTERN = r"model(-\d{5}-of-\d{5})?\.safetensors(\.index\.json)?"
_UNITS = {"TB": 10**12, "GB": 10**9, "MB": 10**6, "KB": 10**3}


def parse_max_shard_size(size: int | str) -> int:
    """``max_shard_size`` in bytes, read as ``huggingface_hub.parse_size_to_int`` reads it.

    Args:
        size: a non-negative int, or a number and one of TB, GB, MB, KB (any case;
            ``"1.5GB"`` is 1,500,000,000).

    Raises:
        ConfigError: anything else.
    """
    if isinstance(size, int) and not isinstance(size, bool):
        if size < 0:
            raise ConfigError(f"max_shard_size must not be negative, not {size}", actual=size)
        return size
    if not isinstance(size, str):
        raise ConfigError(
            f"max_shard_size is an int or a string such as '5GB', not {type(size).__name__}",
            field="max_shard_size",
        )
    text = size.strip()
    unit = text[-2:].upper()
    try:
        value = float(text[:-2].strip())
    except ValueError:
        value = math.nan
    if unit not in _UNITS or not math.isfinite(value) or value < 0:
        raise ConfigError(
            f"max_shard_size {size!r} is not a number followed by TB, GB, MB or KB",
            field="max_shard_size",
            actual=size,
        )
    return int(value * _UNITS[unit])


def hf_removals(groups: Iterable[Sequence[str]]) -> dict[str, str]:
    """Dropped name → kept name, in ``huggingface_hub``'s order, for tie groups given in the
    order of their first name in the state (a group of one drops nothing)."""
    out: dict[str, str] = {}
    for group in groups:
        keep = min(group)
        for name in sorted(group):
            if name != keep:
                out.setdefault(name, keep)
    return out


@dataclass(frozen=True)
class HFItem:
    """One tensor to place: its name, its size as ``huggingface_hub`` counts it (its
    storage's bytes), and its storage's identity (``None``: its own)."""

    name: str
    size: int
    storage: Hashable = None


@dataclass(frozen=True)
class ShardPlan:
    """Where each tensor goes.

    Attributes:
        files: file name → tensor names, in shard order.
        total_size: the sum of the sizes (each shared storage once).
    """

    files: dict[str, list[str]]
    total_size: int

    @property
    def sharded(self) -> bool:
        """Whether there is an index (more than one file)."""
        return len(self.files) > 1

    @property
    def weight_map(self) -> dict[str, str]:
        """Tensor name → its file, in shard order."""
        return {name: file for file, names in self.files.items() for name in names}


def shard_file_name(index: int, count: int) -> str:
    """The name of shard ``index`` (from 0) of ``count``."""
    return f"model-{index + 1:05d}-of-{count:05d}.safetensors"


def plan_shards(items: Sequence[HFItem], max_shard_size: int) -> ShardPlan:
    """Cut ``items`` (the state in order, tied names dropped) into shards of at most
    ``max_shard_size`` bytes where a tensor fits, as ``huggingface_hub`` does.

    Raises:
        ConfigError: no tensor at all (``huggingface_hub`` would write nothing).
    """
    if not items:
        raise ConfigError("there is no tensor to export", field="state")
    sharing: dict[Hashable, list[str]] = {}
    shards: list[list[str]] = []
    current: list[str] = []
    current_size = total = 0
    for item in items:
        if item.storage is not None:
            if item.storage in sharing:
                sharing[item.storage].append(item.name)  # placed with the first, below
                continue
            sharing[item.storage] = [item.name]
        if item.size > max_shard_size:
            total += item.size
            shards.append([item.name])
            continue
        if current_size + item.size > max_shard_size:
            shards.append(current)
            current, current_size = [], 0
        current.append(item.name)
        current_size += item.size
        total += item.size
    if current:
        shards.append(current)
    for names in sharing.values():
        for shard in shards:
            if names[0] in shard:
                shard.extend(n for n in names[1:] if n not in shard)
                break
    if len(shards) == 1:
        return ShardPlan({SINGLE_FILE: shards[0]}, total)
    return ShardPlan(
        {shard_file_name(i, len(shards)): names for i, names in enumerate(shards)}, total
    )


def index_bytes(plan: ShardPlan, removals: Mapping[str, str]) -> bytes:
    """The index ``huggingface_hub`` writes for ``plan`` (its bytes: ``json.dump`` with
    ``indent=2``, ASCII, no final newline)."""
    document = {
        "metadata": {"total_size": plan.total_size, **removals},
        "weight_map": plan.weight_map,
    }
    return json.dumps(document, indent=2).encode("ascii")
