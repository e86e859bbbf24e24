"""The shard planner against huggingface_hub's own functions (no torch needed): sizes,
shards, names, the index's bytes, and which tied name is kept."""

from __future__ import annotations

import json
import random

import pytest

base = pytest.importorskip("huggingface_hub.serialization._base")

from tlckpt.codec import ConfigError  # noqa: E402
from tlckpt.codec.hf_folders.shard_plan import (  # noqa: E402
    HFItem,
    hf_removals,
    index_bytes,
    parse_max_shard_size,
    plan_shards,
)


@pytest.mark.parametrize(
    "text", ["5GB", "20KB", "1.5GB", " 3 mb ", "0.001TB", "7kb", "10MB", "2.25KB"]
)
def test_sizes_read_as_huggingface_hub_reads_them(text):
    assert parse_max_shard_size(text) == base.parse_size_to_int(text)


@pytest.mark.parametrize("bad", ["5GiB", "GB", "12", "-1KB", "nanKB", "infGB", 2.5, None, True, -3])
def test_bad_sizes_are_refused(bad):
    with pytest.raises(ConfigError):
        parse_max_shard_size(bad)


def _theirs(items: list[HFItem], limit: int):
    state = {item.name: item for item in items}
    return base.split_state_dict_into_shards_factory(
        state,
        get_storage_size=lambda item: item.size,
        get_storage_id=lambda item: item.storage,
        filename_pattern="model{suffix}.safetensors",
        max_shard_size=limit,
    )


@pytest.mark.parametrize("seed", range(200))
def test_shards_are_huggingface_hubs(seed):
    rng = random.Random(seed)
    items = []
    for i in range(rng.randint(1, 40)):
        storage = rng.choice([None, None, None, f"s{rng.randint(0, 4)}"])
        items.append(
            HFItem(
                f"layer.{rng.randint(0, 99)}.w{i}", rng.choice([0, 1, 7, 100, 5000, 20000]), storage
            )
        )
    limit = rng.choice([0, 1, 100, 4096, 10000, 50000, 10**9])
    ours = plan_shards(items, limit)
    theirs = _theirs(items, limit)
    assert ours.files == theirs.filename_to_tensors
    assert list(ours.weight_map.items()) == list(theirs.tensor_to_filename.items())
    assert ours.total_size == theirs.metadata["total_size"]
    assert ours.sharded == theirs.is_sharded
    removals = {"x.tied": items[0].name} if seed % 2 else {}
    if theirs.is_sharded:
        document = {
            "metadata": {**theirs.metadata, **removals},
            "weight_map": theirs.tensor_to_filename,
        }
        assert index_bytes(ours, removals) == json.dumps(document, indent=2).encode()


def test_nothing_to_export_is_refused():
    with pytest.raises(ConfigError, match="no tensor"):
        plan_shards([], 10)


def test_the_alphabetically_first_tied_name_is_kept():
    groups = [["transformer.wte.weight", "lm_head.weight"], ["b", "c", "a"]]
    assert hf_removals(groups) == {"transformer.wte.weight": "lm_head.weight", "b": "a", "c": "a"}
    assert list(hf_removals(groups)) == ["transformer.wte.weight", "b", "c"]
