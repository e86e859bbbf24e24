"""save_module_state/load_module_state in the safetensors layout: any dtype, by name, tied
tensors once, strict=False partial loads, all or nothing."""

from __future__ import annotations

import pytest
import torch

import tlckpt
from tlckpt import CheckpointError, ConfigError, SchemaMismatchError
from tlckpt.codec.fileio import leases
from tlckpt.runtime.ops import entry_staging, named_module_state

st = pytest.importorskip("safetensors.torch")


class Tied(torch.nn.Module):
    def __init__(self, tie: bool = True, head: int = 10) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(10, 4)
        self.body = torch.nn.Linear(4, 4)
        self.head = torch.nn.Linear(4, head, bias=False)
        if tie and head == 10:
            self.head.weight = self.embed.weight
        self.register_buffer("count", torch.tensor(3))


def _state(model: torch.nn.Module) -> dict[str, bytes]:
    return {
        k: v.detach().reshape(-1).view(torch.uint8).numpy().tobytes()
        for k, v in model.state_dict().items()
    }


def _bf16(model: torch.nn.Module) -> torch.nn.Module:
    return model.to(torch.bfloat16)


def test_the_suffix_chooses_the_family(tmp_path) -> None:
    model = _bf16(Tied())
    tlckpt.save_module_state(model, tmp_path / "m.safetensors")
    tlckpt.save_module_state(model, tmp_path / "m.json")
    assert tlckpt.sniff_family(tmp_path / "m.safetensors") == "safetensors"
    assert tlckpt.sniff_family(tmp_path / "m.json") == "state_bits"
    tlckpt.save_module_state(model, tmp_path / "m.bin", format="safetensors")
    assert tlckpt.sniff_family(tmp_path / "m.bin") == "safetensors"
    with pytest.raises(ConfigError):  # TLSF32B holds float32 only, as before
        tlckpt.save_module_state(model, tmp_path / "m.tlsf32")
    with pytest.raises(ValueError):
        tlckpt.save_module_state(model, tmp_path / "m.x", format="pickle")
    for name in ("m.safetensors", "m.json"):
        other = _bf16(Tied())
        tlckpt.load_module_state(other, tmp_path / name)
        assert _state(other) == _state(model)


def test_tied_tensors_are_stored_once_as_save_model_does(tmp_path) -> None:
    model = _bf16(Tied())
    ours, ref = tmp_path / "ours.safetensors", tmp_path / "ref.safetensors"
    tlckpt.save_module_state(model, ours)
    st.save_model(model, ref)
    assert ours.read_bytes() == ref.read_bytes()
    assert tlckpt.read_metadata(ours) == {"head.weight": "embed.weight"}
    assert "head.weight" not in tlckpt.load_tensors(ours)
    # Into a model that ties them: one memory, loaded once.
    tied = _bf16(Tied())
    assert tlckpt.load_module_state(tied, ours) == ([], [])
    assert tied.head.weight is tied.embed.weight and _state(tied) == _state(model)
    # Into a model that does not: both get the values.
    untied = _bf16(Tied(tie=False))
    assert tlckpt.load_module_state(untied, ours) == ([], [])
    assert _state(untied) == _state(model)
    # The reference loader reads ours.
    again = _bf16(Tied())
    st.load_model(again, ours)
    assert _state(again) == _state(model)


def test_strict_false_loads_a_backbone_into_a_model_with_a_new_head(tmp_path) -> None:
    path = tmp_path / "backbone.safetensors"
    source = Tied(tie=False)
    tlckpt.save_module_state(source, path)
    target = Tied(tie=False, head=3)
    head_before = target.head.weight.detach().clone()
    with pytest.raises(SchemaMismatchError):  # the head's shape differs: nothing loads
        tlckpt.load_module_state(target, path, strict=False)
    assert torch.equal(target.head.weight, head_before)
    del target.head
    target.classifier = torch.nn.Linear(4, 3)
    before = _state(target)
    with pytest.raises(SchemaMismatchError):
        tlckpt.load_module_state(target, path)  # strict: the names differ
    assert _state(target) == before
    missing, unexpected = tlckpt.load_module_state(target, path, strict=False)
    assert missing == ["classifier.weight", "classifier.bias"]
    assert unexpected == ["head.weight"]
    assert torch.equal(target.body.weight, source.body.weight)
    assert torch.equal(target.embed.weight, source.embed.weight)


def test_a_dtype_or_shape_difference_changes_nothing(tmp_path) -> None:
    path = tmp_path / "m.safetensors"
    tlckpt.save_module_state(Tied(), path)
    bf16 = _bf16(Tied())
    before = _state(bf16)
    with pytest.raises(ConfigError, match="does not convert"):
        tlckpt.load_module_state(bf16, path)
    assert _state(bf16) == before


@pytest.mark.parametrize("lease", [True, False])
def test_an_interrupt_while_planning_changes_nothing(tmp_path, monkeypatch, lease) -> None:
    """Staged (no lease granted): while the staging is read; leased: while the tensors are
    checked against the header."""
    path = tmp_path / "m.safetensors"
    tlckpt.save_module_state(Tied(), path)
    model = Tied()
    before = _state(model)
    calls = []
    if lease:
        module, attribute = named_module_state, "check_fits"
    else:
        monkeypatch.setattr(leases, "_break_seconds", lambda: 1.0)  # no lease granted
        module, attribute = entry_staging, "torch_shape"  # called per tensor of a run
    real = getattr(module, attribute)

    def interrupted(*args):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*args)

    monkeypatch.setattr(module, attribute, interrupted)
    with pytest.raises(KeyboardInterrupt):
        tlckpt.load_module_state(model, path)
    assert _state(model) == before


def test_tied_names_with_different_values_in_the_file_are_refused(tmp_path) -> None:
    path = tmp_path / "m.safetensors"
    untied = Tied(tie=False)
    tlckpt.save_module_state(untied, path)
    model = Tied()
    before = _state(model)
    with pytest.raises(SchemaMismatchError, match="one tensor"):
        tlckpt.load_module_state(model, path)
    assert _state(model) == before


def test_positional_files_take_strict_loads_only(tmp_path) -> None:
    path = tmp_path / "m.tlsf32"
    model = torch.nn.Linear(2, 2)
    tlckpt.save_module_state(model, path)
    with pytest.raises(CheckpointError, match="by position"):
        tlckpt.load_module_state(model, path, strict=False)
    assert tlckpt.load_module_state(model, path) is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_models_save_the_same_bytes_and_load_on_their_device(tmp_path) -> None:
    cpu = _bf16(Tied())
    tlckpt.save_module_state(cpu, tmp_path / "cpu.safetensors")
    cuda = _bf16(Tied()).cuda()
    cuda.load_state_dict(cpu.state_dict())
    tlckpt.save_module_state(cuda, tmp_path / "cuda.safetensors")
    assert (tmp_path / "cpu.safetensors").read_bytes() == (
        tmp_path / "cuda.safetensors"
    ).read_bytes()
    fresh = _bf16(Tied()).cuda()
    assert tlckpt.load_module_state(fresh, tmp_path / "cpu.safetensors") == ([], [])
    assert fresh.embed.weight.device.type == "cuda"
    assert _state(fresh.cpu()) == _state(cpu)
    loaded = tlckpt.load_tensors(tmp_path / "cpu.safetensors", device="cuda")
    assert all(t.device.type == "cuda" for t in loaded.values())
