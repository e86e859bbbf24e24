"""export_hf and load_hf against the real huggingface_hub and transformers: the same files,
index and bytes as ``save_torch_state_dict``; ``from_pretrained`` of an export; exact loads of
folders ``huggingface_hub`` wrote; tie handling; hostile folders leave the model unchanged;
an interrupted export leaves no index."""

from __future__ import annotations

import json
import os
import struct
import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
hub = pytest.importorskip("huggingface_hub")
transformers = pytest.importorskip("transformers")

import tlckpt  # noqa: E402
from tlckpt import (  # noqa: E402
    CheckpointError,
    CheckpointManager,
    IntegrityError,
    MalformedError,
    SchemaMismatchError,
    TiesUnknownWarning,
    export_hf,
    load_hf,
    save_module_state,
)
from tlckpt.runtime.ops import tensor_files  # noqa: E402
from tlckpt.runtime.sets.set_writing import live_source, write_set  # noqa: E402

SHARD = "20KB"  # the tiny GPT-2 in 9 shards


def gpt2(seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    torch.manual_seed(seed)
    config = transformers.GPT2Config(
        n_layer=2,
        n_embd=32,
        n_head=2,
        vocab_size=100,
        n_positions=32,
        bos_token_id=0,
        eos_token_id=0,
    )
    return transformers.GPT2LMHeadModel(config).to(dtype)


def reference(model: torch.nn.Module, folder: Path, size: str | int = SHARD) -> Path:
    folder.mkdir()
    hub.save_torch_state_dict(model.state_dict(), folder, max_shard_size=size)
    return folder


def header(path: Path) -> tuple[bytes, dict]:
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    return data[8 + n :], json.loads(data[8 : 8 + n])


def assert_same_folder(ours: Path, theirs: Path, *, exact_single: bool = True) -> None:
    names = sorted(os.listdir(theirs))
    assert sorted(os.listdir(ours)) == names
    for name in names:
        a, b = (ours / name).read_bytes(), (theirs / name).read_bytes()
        if name.endswith(".json"):
            assert json.loads(a) == json.loads(b)
            assert list(json.loads(a)["weight_map"]) == list(json.loads(b)["weight_map"])
            assert a == b
        elif exact_single or len(names) > 1:
            assert a == b, name
        else:  # one file: the metadata's key order is the reference's hash map's
            assert header(ours / name) == header(theirs / name)


def state_bits(model: torch.nn.Module) -> dict[str, bytes]:
    return {
        k: v.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        for k, v in model.state_dict().items()
    }


def test_a_gpt2_set_exports_as_huggingface_hub_saves_it(tmp_path):
    model = gpt2()
    theirs = reference(model, tmp_path / "hub")
    manager = CheckpointManager(tmp_path / "ckpt", model_format="safetensors")
    manager.save(3, model=model)
    written = export_hf(tmp_path / "ckpt", tmp_path / "ours", max_shard_size=SHARD)
    assert len(written) == len(os.listdir(theirs)) >= 4 and written[-1].name.endswith(".json")
    assert_same_folder(tmp_path / "ours", theirs)
    index = json.loads((theirs / "model.safetensors.index.json").read_text())
    assert index["metadata"]["transformer.wte.weight"] == "lm_head.weight"
    assert "transformer.wte.weight" not in index["weight_map"]
    # The step folder itself exports the same.
    export_hf(
        manager.directory / os.listdir(manager.directory)[0],
        tmp_path / "again",
        max_shard_size=SHARD,
    )
    assert_same_folder(tmp_path / "again", theirs)


def test_a_module_exports_as_huggingface_hub_saves_it(tmp_path):
    model = gpt2(1, torch.bfloat16)
    for size in (SHARD, 5000, "1KB"):
        theirs = reference(model, tmp_path / f"hub{size}", size)
        export_hf(model, tmp_path / f"ours{size}", max_shard_size=size)
        assert_same_folder(tmp_path / f"ours{size}", theirs)


def test_single_file_and_from_pretrained(tmp_path):
    model = gpt2(2)
    theirs = reference(model, tmp_path / "hub", "5GB")
    save_module_state(model, tmp_path / "m.safetensors")
    export_hf(tmp_path / "m.safetensors", tmp_path / "ours")
    assert_same_folder(tmp_path / "ours", theirs, exact_single=False)
    model.config.save_pretrained(tmp_path / "ours")
    loaded = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "ours")
    assert state_bits(loaded) == state_bits(model)
    # from_pretrained of a sharded export too
    export_hf(model, tmp_path / "sharded", max_shard_size=SHARD)
    model.config.save_pretrained(tmp_path / "sharded")
    loaded = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "sharded")
    assert state_bits(loaded) == state_bits(model)


def test_a_default_float32_set_of_a_tied_model_exports_as_huggingface_hub_saves_it(tmp_path):
    # A float32 model is written as TLSF32B; its ties make the set version 2, which records
    # them (version 1 cannot), so the export drops the tied name as huggingface_hub does.
    model = gpt2(4)
    theirs = reference(model, tmp_path / "hub")
    manager = CheckpointManager(tmp_path / "ckpt")
    manager.save(1, model=model)
    manifest = json.loads(
        (manager.directory / os.listdir(manager.directory)[0] / "manifest.json").read_bytes()
    )
    assert manifest["version"] == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        export_hf(tmp_path / "ckpt", tmp_path / "ours", max_shard_size=SHARD)
    assert_same_folder(tmp_path / "ours", theirs)
    fresh = gpt2(5)
    manager.restore(model=fresh)
    assert state_bits(fresh) == state_bits(model)
    assert fresh.lm_head.weight is fresh.transformer.wte.weight


def test_a_version_1_set_records_no_ties(tmp_path):
    # Sets written before version 2 recorded ties: one float32 model, as version 1.
    model = gpt2(3)
    theirs = reference(model, tmp_path / "hub")
    step = 1
    path = tmp_path / "ckpt" / f"step-{step:020d}"
    path.parent.mkdir()
    write_set(path, step, live_source(step, model, None, None, None, None))
    with pytest.warns(TiesUnknownWarning, match="records no tied names"):
        export_hf(tmp_path / "ckpt", tmp_path / "untied", max_shard_size=SHARD)
    index = json.loads((tmp_path / "untied" / "model.safetensors.index.json").read_text())
    assert {"lm_head.weight", "transformer.wte.weight"} <= set(index["weight_map"])
    tied = {"lm_head.weight": "transformer.wte.weight"}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        export_hf(tmp_path / "ckpt", tmp_path / "tied", max_shard_size=SHARD, tied=tied)
    assert_same_folder(tmp_path / "tied", theirs)
    # equal values are not a tie, and a claimed tie of different values is refused
    with pytest.raises(SchemaMismatchError, match="different tensors"):
        export_hf(
            tmp_path / "ckpt",
            tmp_path / "wrong",
            tied={"transformer.h.0.ln_1.weight": "transformer.h.0.ln_1.bias"},
        )
    assert not (tmp_path / "wrong" / "model.safetensors").exists()


def test_a_set_of_several_models_needs_model(tmp_path):
    a, b = gpt2(4), gpt2(5, torch.bfloat16)
    CheckpointManager(tmp_path / "ckpt").save(1, model={"g": a, "d": b})
    with pytest.raises(CheckpointError, match=r"choose one with model="):
        export_hf(tmp_path / "ckpt", tmp_path / "out")
    export_hf(tmp_path / "ckpt", tmp_path / "out", model="d", max_shard_size=SHARD)
    assert_same_folder(tmp_path / "out", reference(b, tmp_path / "hub"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("size", [SHARD, "5GB"])
def test_load_hf_of_a_huggingface_hub_folder_is_exact(tmp_path, dtype, size):
    source = gpt2(6, dtype)
    with torch.no_grad():
        source.transformer.h[0].ln_1.weight[:3] = torch.tensor([float("nan"), -0.0, 1e-40])
    folder = reference(source, tmp_path / "hub", size)
    target = gpt2(7, dtype)
    assert load_hf(target, folder) == ([], [])
    assert state_bits(target) == state_bits(source)
    assert target.lm_head.weight is target.transformer.wte.weight  # still tied


def test_load_hf_strict_false(tmp_path):
    source = gpt2(8)
    folder = reference(source, tmp_path / "hub")
    target = torch.nn.ModuleDict({"lm_head": torch.nn.Linear(32, 100, bias=False)})
    target.add_module("extra", torch.nn.Linear(2, 2))
    with pytest.raises(SchemaMismatchError, match="names differ"):
        load_hf(target, folder)
    missing, unexpected = load_hf(target, folder, strict=False)
    assert missing == ["extra.weight", "extra.bias"]
    assert "transformer.h.0.attn.c_attn.weight" in unexpected
    assert torch.equal(target.lm_head.weight, source.lm_head.weight)


def _rewrite_index(folder: Path, change) -> None:
    path = folder / "model.safetensors.index.json"
    index = json.loads(path.read_text())
    change(index)
    path.write_text(json.dumps(index))


HOSTILE = {
    "missing shard": (IntegrityError, "is missing"),
    "dotdot": (MalformedError, "outside the folder"),
    "absolute": (MalformedError, "outside the folder"),
    "symlink out": (MalformedError, "a link to .* outside the folder"),
    "not in shard": (SchemaMismatchError, "which does not hold it"),
    "duplicate": (MalformedError, "twice, with different values"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_folders_leave_the_model_unchanged(tmp_path, case):
    folder = reference(gpt2(9), tmp_path / "hub")
    shards = sorted(n for n in os.listdir(folder) if n.endswith(".safetensors"))
    first, last = shards[0], shards[-1]
    name = "lm_head.weight"
    if case == "missing shard":
        (folder / last).unlink()
    elif case == "dotdot":
        (tmp_path / "outside.safetensors").write_bytes((folder / last).read_bytes())
        _rewrite_index(folder, lambda i: i["weight_map"].update({name: "../outside.safetensors"}))
    elif case == "absolute":
        _rewrite_index(folder, lambda i: i["weight_map"].update({name: str(folder / first)}))
    elif case == "symlink out":
        (tmp_path / "outside.safetensors").write_bytes((folder / last).read_bytes())
        (folder / last).unlink()
        (folder / last).symlink_to(tmp_path / "outside.safetensors")
    elif case == "not in shard":
        _rewrite_index(folder, lambda i: i["weight_map"].update({name: first}))
    else:
        path = folder / "model.safetensors.index.json"
        text = path.read_text()
        path.write_text(text.replace('"weight_map": {', f'"weight_map": {{"{name}": "{first}",'))
    target = gpt2(10)
    before = state_bits(target)
    error, match = HOSTILE[case]
    with pytest.raises(error, match=match):
        load_hf(target, folder)
    assert state_bits(target) == before


def test_an_interrupted_export_leaves_no_index(tmp_path, monkeypatch):
    model = gpt2(11)
    theirs = reference(model, tmp_path / "hub")
    out = tmp_path / "out"
    export_hf(gpt2(12), out, max_shard_size=SHARD)  # an earlier export
    (out / "config.json").write_text("{}")
    calls = []
    real = tensor_files._host_bytes

    def failing(tensor):
        calls.append(1)
        if len(calls) == 17:  # in the middle of a shard
            raise KeyboardInterrupt
        return real(tensor)

    monkeypatch.setattr(tensor_files, "_host_bytes", failing)
    with pytest.raises(KeyboardInterrupt):
        export_hf(model, out, max_shard_size=SHARD)
    monkeypatch.undo()
    left = sorted(os.listdir(out))
    assert "model.safetensors.index.json" not in left and "config.json" in left
    assert all(name.startswith("model-") or name == "config.json" for name in left)
    finished = [
        n
        for n in left
        if (theirs / n).exists() and (out / n).read_bytes() == (theirs / n).read_bytes()
    ]
    assert 0 < len(finished) < len(os.listdir(theirs)) - 1
    with pytest.raises(CheckpointError):
        load_hf(gpt2(13), out)
    export_hf(model, out, max_shard_size=SHARD)  # then done again
    assert sorted(os.listdir(out)) == sorted([*os.listdir(theirs), "config.json"])
    os.remove(out / "config.json")
    assert_same_folder(out, theirs)


@pytest.mark.parametrize("suffix", [".tlsf32", ".json"])
def test_positional_files_export_with_names(tmp_path, suffix):
    model = gpt2(14, torch.float32 if suffix == ".tlsf32" else torch.bfloat16)
    theirs = reference(model, tmp_path / "hub")
    path = tmp_path / f"m{suffix}"
    save_module_state(model, path)
    with pytest.raises(CheckpointError, match="give names="):
        export_hf(path, tmp_path / "nameless")
    names = list(model.state_dict())
    tied = {"lm_head.weight": "transformer.wte.weight"}
    export_hf(path, tmp_path / "ours", max_shard_size=SHARD, names=names, tied=tied)
    assert_same_folder(tmp_path / "ours", theirs)


def test_options_that_do_not_fit_the_source(tmp_path):
    model = gpt2(15)
    with pytest.raises(CheckpointError, match="for sets and files"):
        export_hf(model, tmp_path / "a", tied={})
    with pytest.raises(CheckpointError, match="max_shard_size"):
        export_hf(model, tmp_path / "b", max_shard_size="5GiB")
    with pytest.raises(CheckpointError, match="holds no checkpoint set"):
        export_hf(tmp_path, tmp_path / "c")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_a_damaged_set_is_not_exported(tmp_path):
    old, new = gpt2(16, torch.bfloat16), gpt2(17, torch.bfloat16)
    manager = CheckpointManager(tmp_path / "ckpt")
    manager.save(1, model=old)
    manager.save(2, model=new)
    newest = sorted((tmp_path / "ckpt").iterdir())[-1]
    member = newest / "model.safetensors"
    data = bytearray(member.read_bytes())
    data[-1] ^= 1
    member.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match="digest"):
        export_hf(newest, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    with pytest.warns(tlckpt.SkippedCheckpointWarning):
        export_hf(tmp_path / "ckpt", tmp_path / "out", max_shard_size=SHARD)
    assert_same_folder(tmp_path / "out", reference(old, tmp_path / "hub"))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_modules_export_and_load(tmp_path):
    model = gpt2(18, torch.bfloat16)
    theirs = reference(model, tmp_path / "hub")
    export_hf(model.cuda(), tmp_path / "ours", max_shard_size=SHARD)
    assert_same_folder(tmp_path / "ours", theirs)
    target = gpt2(19, torch.bfloat16).cuda()
    load_hf(target, theirs)
    assert state_bits(target.cpu()) == state_bits(model.cpu())


def test_an_export_replaces_an_earlier_one_of_the_other_kind(tmp_path):
    model = gpt2(20)
    out = tmp_path / "out"
    export_hf(model, out)  # one file
    export_hf(model, out, max_shard_size=SHARD)  # shards: the single file goes
    assert_same_folder(out, reference(model, tmp_path / "sharded"))
    export_hf(model, out)  # one file again: the index and the shards go
    assert_same_folder(out, reference(model, tmp_path / "single", "5GB"), exact_single=False)


@pytest.mark.parametrize("size", [SHARD, "5GB"])
def test_load_hf_of_save_pretrained(tmp_path, size):
    model = gpt2(21, torch.bfloat16)
    model.save_pretrained(tmp_path / "pretrained", max_shard_size=size)
    target = gpt2(22, torch.bfloat16)
    assert load_hf(target, tmp_path / "pretrained") == ([], [])
    assert state_bits(target) == state_bits(model)
