"""The staging of safetensors loads (:mod:`tlckpt.runtime.ops.entry_staging`): tensors read in
file order by runs into one region, exact bytes, whatever subset, alignment or size."""

from __future__ import annotations

import json
import struct

import pytest
import torch

import tlckpt
from tlckpt.codec.fileio.source import open_source
from tlckpt.codec.safetensors.reader import read_header
from tlckpt.runtime.ops import entry_staging
from tlckpt.runtime.ops.entry_staging import REGION_MIN_BYTES, stage_entries


def _stage(path, names):
    with open_source(path) as src:
        header = read_header(src)
        return stage_entries(src, header, names)


@pytest.mark.parametrize("huge", [True, False], ids=["huge-pages", "no-free-blocks"])
def test_a_subset_with_gaps_is_read_exactly_from_a_region(tmp_path, monkeypatch, huge) -> None:
    if not huge:  # no free 2 MiB blocks: ordinary pages, the same region and reads
        monkeypatch.setattr(entry_staging, "free_huge_blocks", lambda: 0)
    torch.manual_seed(0)
    per = REGION_MIN_BYTES // 4  # several runs, the region path
    tensors = {
        f"t{i}": torch.randn(per // 2, dtype=torch.float32).to(torch.bfloat16) for i in range(8)
    }
    tensors["nan"] = torch.tensor([float("nan"), -0.0], dtype=torch.float32)
    tensors["empty"] = torch.empty(0, 3, dtype=torch.float16)
    path = tmp_path / "t.safetensors"
    tlckpt.save_tensors(tensors, path)
    wanted = ["t6", "t0", "t1", "t3", "nan", "empty", "t1"]  # out of order, a gap, a repeat
    staged = _stage(path, wanted)
    assert sorted(staged) == sorted(set(wanted))
    for name, value in staged.items():
        assert value.dtype == tensors[name].dtype and value.shape == tensors[name].shape
        assert torch.equal(
            value.view(-1).view(torch.uint8), tensors[name].view(-1).view(torch.uint8)
        )


def _raw_file(path, entries: list[tuple[str, str, list[int], bytes]]) -> None:
    header, data = {}, b""
    for name, dtype, shape, payload in entries:
        header[name] = {
            "dtype": dtype,
            "shape": shape,
            "data_offsets": [len(data), len(data) + len(payload)],
        }
        data += payload
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)


def test_a_tensor_not_aligned_in_the_file_is_read_exactly(tmp_path) -> None:
    path = tmp_path / "odd.safetensors"
    floats = struct.pack("<3f", 1.5, float("inf"), -2.0)
    _raw_file(
        path,
        [
            ("b", "U8", [3], b"\x01\x02\x03"),
            ("f", "F32", [3], floats),
            ("h", "F16", [1], b"\x00\x3c"),
        ],
    )
    staged = _stage(path, ["f", "b", "h"])
    assert staged["b"].tolist() == [1, 2, 3]
    assert staged["f"].tolist() == [1.5, float("inf"), -2.0]
    assert staged["h"].tolist() == [1.0]


def test_a_load_copies_into_the_live_tensors(tmp_path) -> None:
    """Every live tensor keeps its memory and identity and gets the new values in place:
    code holding a parameter's memory (a view, DDP's reducer) sees them. A load that gave
    unreferenced tensors the staged storages instead broke a two-rank DDP resume."""
    torch.manual_seed(0)
    source = torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(4)])
    source = source.to(torch.bfloat16)
    path = tmp_path / "m.safetensors"
    tlckpt.save_module_state(source, path)
    target = torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(4)])
    target = target.to(torch.bfloat16)
    viewed = target[1].weight[0]  # a view of layer 1's weight, held here
    params = dict(target.named_parameters())
    before = {n: t.data_ptr() for n, t in target.state_dict().items()}
    tlckpt.load_module_state(target, path)
    after = target.state_dict()
    for name, value in source.state_dict().items():
        assert torch.equal(after[name].view(torch.uint8), value.view(torch.uint8)), name
        assert after[name].data_ptr() == before[name], name
    assert torch.equal(viewed, source[1].weight[0])
    assert all(p is params[n] for n, p in target.named_parameters())
    assert target[0].weight.requires_grad and isinstance(target[0].weight, torch.nn.Parameter)


def test_one_file_tensor_feeding_two_untied_tensors_is_copied_into_each(tmp_path) -> None:
    """A file whose tensors are tied (metadata alias) loaded into a model that does not tie
    them: each live tensor gets its own copy, and they stay apart."""
    emb = torch.nn.Embedding(8, 4)
    head = torch.nn.Linear(4, 8, bias=False)
    head.weight = emb.weight
    path = tmp_path / "tied.safetensors"
    tlckpt.save_module_state(torch.nn.ModuleDict({"e": emb, "h": head}), path)
    untied = torch.nn.ModuleDict(
        {"e": torch.nn.Embedding(8, 4), "h": torch.nn.Linear(4, 8, bias=False)}
    )
    tlckpt.load_module_state(untied, path)
    assert torch.equal(untied["e"].weight, emb.weight)
    assert torch.equal(untied["h"].weight, emb.weight)
    assert untied["e"].weight.data_ptr() != untied["h"].weight.data_ptr()
