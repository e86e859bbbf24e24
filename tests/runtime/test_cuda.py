"""CUDA: parameters and moments stay on the device, payloads pass through one reusable pinned
host buffer, ``step`` lives where each optimizer setting expects it, and resume is
bit-exact there too. Skipped without a GPU."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest
import torch
from recipes import RECIPES, resume_recipe
from runtime_support import resume_run

from tlckpt.codec import CheckpointError, MomentDtype, read_adam
from tlckpt.runtime import (
    load_module_state,
    load_optimizer,
    load_state_bits,
    save_module_state,
    save_optimizer,
    save_state_bits,
    schema_of,
)
from tlckpt.runtime.binding.tensors import HostBuffer
from tlckpt.testing.bitwise import (
    module_unchanged,
    optimizer_unchanged,
    same,
    snapshot_module,
    snapshot_optimizer,
)
from tlckpt.testing.models import CUDA_IMPLS, TiedNet, make_adam, train

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.fixture(autouse=True)
def _deterministic():
    """cuBLAS and embedding backward are deterministic only when asked to be."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    yield
    torch.use_deterministic_algorithms(before)


@pytest.mark.parametrize("impl", list(CUDA_IMPLS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("kind", ["adam", "adamw"])
def test_resume_on_cuda_is_bit_exact(kind, dtype, impl, tmp_path: Path):
    version = resume_run(kind, dtype, impl, tmp_path, tied=True, counter=False, device="cuda")
    assert version == (3 if dtype == torch.float32 else 5)


def test_resume_on_cuda_with_counter(tmp_path: Path):
    assert (
        resume_run(
            "adamw", torch.float32, "fused", tmp_path, tied=True, counter=True, device="cuda"
        )
        == 4
    )


@pytest.mark.parametrize(
    "impl, step_device, step_dtype",
    [
        ("default", "cpu", torch.float32),
        ("foreach_false", "cpu", torch.float32),
        ("fused", "cuda", torch.float32),
        ("capturable", "cuda", torch.float32),
    ],
)
def test_installed_state_has_the_optimizers_own_form(tmp_path, impl, step_device, step_dtype):
    torch.manual_seed(0)
    model = TiedNet().cuda()
    opt = make_adam("adamw", model.parameters(), impl)
    train(model, opt, 0, 2, "cuda")
    save_optimizer(opt, model, tmp_path / "o")
    fresh = make_adam("adamw", model.parameters(), impl)
    load_optimizer(fresh, model, tmp_path / "o")
    for p, state in fresh.state.items():
        assert state["step"].device.type == step_device and state["step"].dtype == step_dtype
        assert state["exp_avg"].device == p.device and state["exp_avg_sq"].is_cuda
        for key in state:
            assert same(state[key], opt.state[p][key]), key


@pytest.mark.parametrize("impl", list(CUDA_IMPLS))
@pytest.mark.parametrize("name", sorted(RECIPES))
def test_recipes_resume_on_cuda_in_tlckpts_family(name: str, impl: str, tmp_path: Path):
    """Every recipe only tlckpt's own family holds (two groups, amsgrad, bfloat16/float16,
    an unused pooler, maximize, ...) resumes bit for bit on the device in every flavour,
    capturable included: moments on the parameter's device in its dtype, ``step`` where the
    flavour keeps it."""
    result = resume_recipe(RECIPES[name], impl, True, tmp_path, device="cuda")
    assert (result["family"], result["version"]) == ("tlckpt_optimizer", 1)
    options = CUDA_IMPLS[impl]
    on_device = options.get("capturable", False) or options.get("fused", False)
    for p, state in result["optimizer"].state.items():
        assert state["step"].device.type == ("cuda" if on_device else "cpu")
        for key, value in state.items():
            if key != "step":
                assert value.device == p.device and value.dtype == p.dtype, key


def test_cpu_file_loads_onto_cuda_and_back(tmp_path: Path):
    torch.manual_seed(0)
    cpu_model = TiedNet()
    cpu_opt = make_adam("adam", cpu_model.parameters())
    train(cpu_model, cpu_opt, 0, 2)
    save_module_state(cpu_model, tmp_path / "m")
    save_optimizer(cpu_opt, cpu_model, tmp_path / "o")

    gpu_model = TiedNet().cuda()
    gpu_opt = make_adam("adam", gpu_model.parameters(), "fused")
    pointers = [p.data_ptr() for p in gpu_model.parameters()]
    load_module_state(gpu_model, tmp_path / "m")
    load_optimizer(gpu_opt, gpu_model, tmp_path / "o")
    assert [p.data_ptr() for p in gpu_model.parameters()] == pointers
    for a, b in zip(cpu_model.state_dict().values(), gpu_model.state_dict().values()):
        assert b.is_cuda and same(a, b.cpu())

    save_optimizer(gpu_opt, gpu_model, tmp_path / "o2")
    save_module_state(gpu_model, tmp_path / "m2")
    assert (tmp_path / "o2").read_bytes() == (tmp_path / "o").read_bytes()
    assert (tmp_path / "m2").read_bytes() == (tmp_path / "m").read_bytes()
    ckpt = read_adam(tmp_path / "o2", schema_of(gpu_model), dtype=MomentDtype.FLOAT32)
    slots = [p for _, p in gpu_model.named_parameters(remove_duplicate=False)]
    for slot, entry in ckpt.entries.items():
        live = gpu_opt.state[slots[slot]]["exp_avg"].reshape(-1).cpu().numpy()
        assert entry.m.tobytes() == live.tobytes()


def test_state_bits_on_cuda(tmp_path: Path):
    torch.manual_seed(0)
    model = TiedNet(torch.bfloat16).cuda()
    save_state_bits(model, tmp_path / "b.json")
    dest = TiedNet(torch.bfloat16).cuda()
    load_state_bits(dest, tmp_path / "b.json")
    for a, b in zip(model.state_dict().values(), dest.state_dict().values()):
        assert b.is_cuda and same(a, b)


def test_bad_files_change_nothing_on_cuda():
    torch.manual_seed(0)
    model = TiedNet().cuda()
    opt = make_adam("adamw", model.parameters(), "capturable")
    train(model, opt, 0, 2, "cuda")
    opt_file, model_file = io.BytesIO(), io.BytesIO()
    save_optimizer(opt, model, opt_file)
    save_module_state(model, model_file)
    train(model, opt, 2, 1, "cuda")
    snap, params = snapshot_optimizer(opt), snapshot_module(model)
    loads = [
        (opt_file.getvalue(), lambda f: load_optimizer(opt, model, f)),
        (model_file.getvalue(), lambda f: load_module_state(model, f)),
    ]
    for data, load in loads:
        for n in range(0, len(data), 7):
            with pytest.raises(CheckpointError):
                load(io.BytesIO(data[:n]))
            assert optimizer_unchanged(opt, snap)
            assert module_unchanged(model, params)


def test_host_buffer_is_pinned_and_reused():
    buffer = HostBuffer(pin=True)
    a = buffer.tensor(100, torch.float32)
    assert a.is_pinned()
    b = buffer.tensor(10, torch.float64)
    assert b.data_ptr() == a.data_ptr()
    c = buffer.tensor(1000, torch.float32)
    assert c.is_pinned() and c.numel() == 1000
