"""The default load of a ``.safetensors`` path under a read lease
(``runtime/ops/named_in_place.py``): payloads read straight into the live tensors, staged only
where no lease is granted or a tensor's memory is not its values."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest
import torch

import tlckpt
from tlckpt.codec import PartialLoadError, SchemaMismatchError
from tlckpt.codec.fileio import leases, transfer
from tlckpt.runtime.ops import entry_staging, named_in_place

pytestmark = pytest.mark.skipif(
    not leases.lease_possible(__file__), reason="no read leases on this file system"
)


class _Model(torch.nn.Module):
    """bf16 weights (one of 4 MiB: copied from a mapping when warm), a tie, an int buffer,
    a non-contiguous buffer, and special values."""

    def __init__(self, seed: int):
        super().__init__()
        torch.manual_seed(seed)
        self.embed = torch.nn.Embedding(2048, 1024).to(torch.bfloat16)
        self.head = torch.nn.Linear(1024, 2048, bias=False).to(torch.bfloat16)
        self.head.weight = self.embed.weight
        self.norm = torch.nn.LayerNorm(64)
        self.register_buffer("steps", torch.tensor([seed, 2 * seed], dtype=torch.int64))
        self.register_buffer("strided", torch.randn(8, 16).t())  # not contiguous
        with torch.no_grad():
            self.norm.weight[:4] = torch.tensor([float("nan"), -0.0, 1e-45, float("inf")])


def _bits(model: torch.nn.Module) -> list[bytes]:
    tensors = model.state_dict().values()
    return [t.contiguous().view(-1).view(torch.uint8).numpy().tobytes() for t in tensors]


class _Taken:
    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self.plans: list[str] = []
        self.staged: list[list[str]] = []
        real_plan, real_stage = named_in_place.plan_in_place, named_in_place.stage_entries

        def plan(*args: Any) -> Any:
            out = real_plan(*args)
            self.plans.append("leased" if out is not None else "overlap")
            return out

        def stage(src: Any, header: Any, names: Any) -> Any:
            names = list(names)
            self.staged.append(names)
            return real_stage(src, header, names)

        monkeypatch.setattr(named_in_place, "plan_in_place", plan)
        monkeypatch.setattr(named_in_place, "stage_entries", stage)


def test_the_default_load_reads_into_the_live_tensors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "m.safetensors"
    saved = _Model(1)
    tlckpt.save_module_state(saved, path)
    taken = _Taken(monkeypatch)
    copies: list[bool] = []
    real_copy = transfer._copy_mapped
    monkeypatch.setattr(
        transfer, "_copy_mapped", lambda m, c: copies.append(real_copy(m, c)) or copies[-1]
    )
    live = _Model(2)
    embed = live.embed.weight
    tlckpt.load_module_state(live, path)
    assert _bits(live) == _bits(saved)
    assert live.embed.weight is embed and live.head.weight is embed  # same objects, tie kept
    assert taken.plans == ["leased"]
    assert taken.staged == [["strided"]]  # only the tensor whose memory is not its values
    assert True in copies  # the 4 MiB weight, warm, came from the mapping
    os.close(os.open(path, os.O_RDWR | os.O_NONBLOCK))  # released: a writer opens at once


def test_without_a_lease_it_stages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "m.safetensors"
    saved = _Model(1)
    tlckpt.save_module_state(saved, path)
    monkeypatch.setattr(leases, "_break_seconds", lambda: 1.0)  # no lease granted
    taken = _Taken(monkeypatch)
    staged: list[int] = []
    real = entry_staging.stage_entries
    monkeypatch.setattr(
        "tlckpt.runtime.ops.named_module_state.stage_entries",
        lambda *a: staged.append(1) or real(*a),
    )
    live = _Model(2)
    tlckpt.load_module_state(live, path)
    assert _bits(live) == _bits(saved)
    assert taken.plans == [] and staged == [1]


def test_the_file_cannot_be_opened_for_writing_during_the_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "m.safetensors"
    saved = _Model(1)
    tlckpt.save_module_state(saved, path)
    refused: list[int] = []
    real = named_in_place.read_extents

    def read(*args: Any) -> None:
        try:
            os.close(os.open(path, os.O_RDWR | os.O_NONBLOCK))
        except BlockingIOError as exc:  # the lease: a writer would wait for the load's end
            refused.append(exc.errno)
        real(*args)

    monkeypatch.setattr(named_in_place, "read_extents", read)
    live = _Model(2)
    tlckpt.load_module_state(live, path)
    assert refused == [errno.EWOULDBLOCK]
    assert _bits(live) == _bits(saved)


@pytest.mark.parametrize("after", [0, 2])
def test_a_disk_error_in_the_commit_says_what_it_touched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, after: int
) -> None:
    """The only failure left under a lease: the disk. Before any write, the model is
    unchanged and the error is the disk's; after some, a PartialLoadError counts them."""
    path = tmp_path / "m.safetensors"
    tlckpt.save_module_state(_Model(1), path)
    live = _Model(2)
    if after == 0:  # nothing staged: no tensor is written before the reads
        live.register_buffer("strided", live.strided.contiguous())
    before = _bits(live)

    def failing(file: Any, extents: Any, what: Any, progress: Any, mapping: Any) -> None:
        progress(after)
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(named_in_place, "read_extents", failing)
    if after == 0:
        with pytest.raises(OSError, match="Input/output"):
            tlckpt.load_module_state(live, path)
        assert _bits(live) == before
    else:
        with pytest.raises(PartialLoadError, match="3 of 5 tensors") as info:
            tlckpt.load_module_state(live, path)
        assert not isinstance(info.value.__cause__, PartialLoadError)


def test_tied_names_differing_in_the_file_are_refused_before_anything_changes(
    tmp_path: Path,
) -> None:
    """A file (not ours) that stores both names of the model's tie, with different bytes."""
    from safetensors.torch import save_file

    path = tmp_path / "m.safetensors"
    state = {k: v.contiguous() for k, v in _Model(1).state_dict().items()}
    state["head.weight"] = state["embed.weight"].clone()
    state["head.weight"].view(-1)[-1] += 1
    save_file(state, str(path))
    live = _Model(2)
    before = _bits(live)
    with pytest.raises(SchemaMismatchError, match="one tensor in the model"):
        tlckpt.load_module_state(live, path)
    assert _bits(live) == before
    state["head.weight"] = state["embed.weight"].clone()  # equal: loads
    save_file(state, str(path))
    tlckpt.load_module_state(live, path)
    assert torch.equal(live.head.weight, state["embed.weight"])


def test_tensors_sharing_memory_are_staged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two entries over overlapping bytes (not a tie: different views) cannot be read in
    place in any order that equals copying them in turn: the whole load stages."""
    model = torch.nn.Module()
    base = torch.randn(64)
    model.register_buffer("a", base[:48])
    model.register_buffer("b", base[16:])
    path = tmp_path / "m.safetensors"
    tlckpt.save_module_state({"a": torch.randn(48), "b": torch.randn(48)}, path)
    taken = _Taken(monkeypatch)
    tlckpt.load_module_state(model, path, strict=False)
    assert taken.plans == ["overlap"]
    expected = tlckpt.load_tensors(path)
    assert torch.equal(model.b, expected["b"])  # copied in turn: b's bytes land last
