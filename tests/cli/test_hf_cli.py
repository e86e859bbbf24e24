"""``tlckpt export-hf`` and ``tlckpt import-hf``: a set exported as huggingface_hub saves
it, a huggingface_hub folder imported exactly, unsafe folders refused in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from cli_support import one_line_rejection, run, run_ok

torch = pytest.importorskip("torch")
hub = pytest.importorskip("huggingface_hub")
import tlckpt  # noqa: E402


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    m = torch.nn.Sequential(
        torch.nn.Embedding(50, 16), torch.nn.Linear(16, 16), torch.nn.Linear(16, 50, bias=False)
    )
    m[2].weight = m[0].weight  # tied
    return m.to(torch.bfloat16)


def test_export_hf_of_a_set(capsys, tmp_path):
    m = model()
    tlckpt.CheckpointManager(tmp_path / "ckpt").save(1, model=m)  # bf16: version 2, ties kept
    theirs = tmp_path / "hub"
    theirs.mkdir()
    hub.save_torch_state_dict(m.state_dict(), theirs, max_shard_size=1000)
    out = run_ok(
        capsys, "export-hf", tmp_path / "ckpt", tmp_path / "ours", "--max-shard-size", "1000"
    )
    assert out.startswith("wrote ")
    assert sorted(os.listdir(tmp_path / "ours")) == sorted(os.listdir(theirs))
    for name in os.listdir(theirs):
        assert (tmp_path / "ours" / name).read_bytes() == (theirs / name).read_bytes()
    run_ok(capsys, "export-hf", tmp_path / "ckpt", tmp_path / "one", "--max-shard-size", "5GB")
    assert os.listdir(tmp_path / "one") == ["model.safetensors"]


def test_export_hf_warns_where_ties_are_unknown(capsys, tmp_path):
    # A set of one float32 model as earlier versions wrote it (version 1, ties unrecorded);
    # this version writes a tied model's set as version 2.
    from tlckpt.runtime.sets.set_writing import live_source, write_set

    m = model().float()
    (tmp_path / "ckpt").mkdir()
    write_set(tmp_path / "ckpt" / f"step-{1:020d}", 1, live_source(1, m, None, None, None, None))
    code, _, err = run(capsys, "export-hf", tmp_path / "ckpt", tmp_path / "ours")
    assert code == 0 and "warning" in err and "records no tied names" in err
    assert len(err.strip().splitlines()) == 1


def test_import_hf_is_exact(capsys, tmp_path):
    m = model()
    theirs = tmp_path / "hub"
    theirs.mkdir()
    hub.save_torch_state_dict(m.state_dict(), theirs, max_shard_size=1000)
    run_ok(capsys, "import-hf", theirs, tmp_path / "m.safetensors")
    fresh = model()
    torch.nn.init.zeros_(fresh[0].weight)
    tlckpt.load_module_state(fresh, tmp_path / "m.safetensors")
    assert torch.equal(fresh[0].weight.view(torch.int16), m[0].weight.view(torch.int16))
    run_ok(capsys, "import-hf", theirs, tmp_path / "m.json")
    code, _, err = run(capsys, "import-hf", theirs, tmp_path / "m.tlsf32")  # bf16: not exact
    assert code == 1
    one_line_rejection(err)
    assert not (tmp_path / "m.tlsf32").exists()


def test_import_hf_refuses_a_path_outside(capsys, tmp_path):
    theirs = tmp_path / "hub"
    theirs.mkdir()
    hub.save_torch_state_dict(model().state_dict(), theirs, max_shard_size=1000)
    index_path = theirs / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    index["weight_map"]["1.weight"] = "../x.safetensors"
    index_path.write_text(json.dumps(index))
    code, _, err = run(capsys, "import-hf", theirs, tmp_path / "m.safetensors")
    assert code == 1
    assert "outside the folder" in one_line_rejection(err, "MalformedError")
    assert not (tmp_path / "m.safetensors").exists()


def test_export_hf_usage(capsys, tmp_path):
    code, _, err = run(
        capsys, "export-hf", tmp_path / "nothing", tmp_path / "out", "--max-shard-size", "5GiB"
    )
    assert code == 1
    one_line_rejection(err)


_WITHOUT_TORCH = """
import runpy, sys
sys.modules["torch"] = None
sys.argv = ["tlckpt", *{args!r}]
runpy.run_module("tlckpt", run_name="__main__", alter_sys=True)
"""


def _without_torch(*args: object) -> subprocess.CompletedProcess:
    code = _WITHOUT_TORCH.format(args=[str(a) for a in args])
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_export_hf_needs_no_torch(tmp_path):
    m = model()
    tlckpt.CheckpointManager(tmp_path / "ckpt").save(1, model=m)
    theirs = tmp_path / "hub"
    theirs.mkdir()
    hub.save_torch_state_dict(m.state_dict(), theirs, max_shard_size=1000)
    out = _without_torch(
        "export-hf", tmp_path / "ckpt", tmp_path / "ours", "--max-shard-size", "1KB"
    )
    assert out.returncode == 0, out.stderr
    for name in os.listdir(theirs):
        assert (tmp_path / "ours" / name).read_bytes() == (theirs / name).read_bytes()
    out = _without_torch("import-hf", theirs, tmp_path / "m.safetensors")
    assert out.returncode == 1 and "torch" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
