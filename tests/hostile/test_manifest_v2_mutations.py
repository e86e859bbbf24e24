"""Version-2 manifests edited field by field (issue #21): every value of the document
replaced by values of every other kind, the manifest re-digested so that the field checks
(not the digest) meet it. Reading one raises only ``CheckpointError`` subclasses."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import torch

from tlckpt.codec.errors import CheckpointError
from tlckpt.codec.sets.set_documents import parse_manifest, self_digest
from tlckpt.formats.checkpoint_set import MAX_MANIFEST_BYTES
from tlckpt.runtime.sets.checkpoint_sets import save_checkpoint

_REPLACEMENTS = [None, -1, 0, 2**64 - 1, 1.5, "", "x", "../x", "model", [], [1], {}, {"a": 1}, True]


def _paths(value: Any, path: tuple = ()) -> Iterator[tuple]:
    yield path
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, (*path, i))


def _replaced(document: dict, path: tuple, new: Any) -> dict:
    out = copy.deepcopy(document)
    target = out
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = new
    return out


@pytest.fixture(scope="module")
def document(tmp_path_factory: pytest.TempPathFactory) -> dict:
    torch.manual_seed(0)
    tied = torch.nn.Module()
    tied.emb, tied.head = torch.nn.Embedding(4, 2), torch.nn.Linear(2, 4, bias=False)
    tied.head.weight = tied.emb.weight
    models = {"G": tied.to(torch.bfloat16), "D": torch.nn.Linear(2, 1)}
    opts = [torch.optim.Adam(models["G"].parameters()), torch.optim.SGD(models["D"].parameters())]
    folder = save_checkpoint(
        Path(tmp_path_factory.mktemp("v2")) / "s", model=models, optimizer=opts
    )
    return orjson.loads((folder / "manifest.json").read_bytes())


def test_every_field_edited_is_refused_or_read(document: dict) -> None:
    base = {k: v for k, v in document.items() if k != "self_digest"}
    parse_manifest(orjson.dumps(document), MAX_MANIFEST_BYTES)  # the original reads
    refused = 0
    paths = [p for p in _paths(base) if p]
    assert len(paths) > 60
    for path in paths:
        for new in _REPLACEMENTS:
            edited = _replaced(base, path, new)
            edited["self_digest"] = self_digest(edited)
            try:
                parse_manifest(orjson.dumps(edited), MAX_MANIFEST_BYTES)
            except CheckpointError:
                refused += 1
    assert refused > len(paths) * len(_REPLACEMENTS) // 2


def test_members_added_or_removed_are_refused(document: dict) -> None:
    base = {k: v for k, v in document.items() if k != "self_digest"}
    for edit in ("drop", "extra", "rename"):
        edited = copy.deepcopy(base)
        members = edited["members"]
        if edit == "drop":
            del members["optimizer.1"]
        elif edit == "extra":
            members["model.X"] = copy.deepcopy(members["model.D"])
        else:
            members["model.Z"] = members.pop("model.D")
        edited["self_digest"] = self_digest(edited)
        with pytest.raises(CheckpointError):
            parse_manifest(orjson.dumps(edited), MAX_MANIFEST_BYTES)
