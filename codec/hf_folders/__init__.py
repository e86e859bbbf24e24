"""Hugging Face model folders (numpy only): ``model.safetensors``, or shards
``model-0000i-of-0000N.safetensors`` and ``model.safetensors.index.json``.

Holds :mod:`.shard_plan` (``huggingface_hub``'s rules, reproduced: which tied name is kept,
how tensors are cut into shards, the file names, the index's bytes), :mod:`.hf_index`
(reading a folder's index within bounds, every shard path confined to the folder),
:mod:`.hf_writing` (writing a folder: shards first, the index last, stale files after),
:mod:`.export_sources` (a checkpoint set's model member or a model file as tensors to export,
one at a time, with the ties the set records) and :mod:`.hf_export` (the export itself).

May import :mod:`tlckpt.formats`, the shared codec modules, :mod:`..safetensors`,
:mod:`..model_state` and :mod:`..sets`; never torch, never ``huggingface_hub`` or
``safetensors``.
"""

from .hf_index import HFFolder, read_hf_folder
from .hf_writing import write_hf_folder
from .shard_plan import HFItem, ShardPlan, hf_removals, parse_max_shard_size, plan_shards

__all__ = [
    "HFFolder",
    "HFItem",
    "ShardPlan",
    "hf_removals",
    "parse_max_shard_size",
    "plan_shards",
    "read_hf_folder",
    "write_hf_folder",
]
