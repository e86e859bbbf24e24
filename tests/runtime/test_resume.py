"""The heart of it: a run resumed from a checkpoint continues bit-identically.

Model: tied embedding/output weights, a frozen layer, BatchNorm buffers (float running stats
and the int64 ``num_batches_tracked``). Matrix: Adam and AdamW, float32 and float64,
default / foreach=False / foreach=True / fused. Each combination trains k steps, saves model
and optimizer, builds fresh objects with a different initialisation, loads, trains n more
steps, and must equal the uninterrupted run in every parameter, buffer and optimizer tensor
(``step`` included, dtype and device too).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from runtime_support import resume_run

from tlckpt.runtime import load_optimizer, save_optimizer
from tlckpt.testing.models import IMPLS, TiedNet, make_adam, train


@pytest.mark.parametrize("impl", list(IMPLS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("kind", ["adam", "adamw"])
def test_resume_matrix_is_bit_exact(kind: str, dtype: torch.dtype, impl: str, tmp_path: Path):
    version = resume_run(kind, dtype, impl, tmp_path, tied=True, counter=False)
    assert version == (3 if dtype == torch.float32 else 5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("kind", ["adam", "adamw"])
def test_resume_with_random_counter(kind: str, dtype: torch.dtype, tmp_path: Path):
    """Dropout masks follow the random counter: restoring it resumes stochastic training."""
    version = resume_run(kind, dtype, "default", tmp_path, tied=True, counter=True)
    assert version == (4 if dtype == torch.float32 else 5)


@pytest.mark.parametrize("impl", ["default", "fused"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_resume_untied(dtype: torch.dtype, impl: str, tmp_path: Path):
    version = resume_run("adamw", dtype, impl, tmp_path, tied=False, counter=False)
    assert version == (2 if dtype == torch.float32 else 5)


def test_resume_with_float64_default_dtype(tmp_path: Path):
    """With float64 as torch's default dtype, Adam's own CPU ``step`` is float64: the
    installed one must be too."""
    torch.set_default_dtype(torch.float64)
    version = resume_run("adam", torch.float64, "foreach_false", tmp_path, tied=True, counter=False)
    assert version == 5


def test_resume_across_settings_installs_destination_form(tmp_path: Path):
    """A file saved by a fused optimizer loads into a default one with Adam's default step
    form (CPU float32), and the other way round: the form follows the destination."""
    torch.manual_seed(0)
    model = TiedNet()
    fused = make_adam("adamw", model.parameters(), "fused")
    train(model, fused, 0, 2)
    save_optimizer(fused, model, tmp_path / "o")

    plain = make_adam("adamw", model.parameters(), "default")
    load_optimizer(plain, model, tmp_path / "o")
    for p, state in plain.state.items():
        assert state["step"].dtype == torch.float32 and state["step"].device.type == "cpu"
        assert torch.equal(state["exp_avg"], fused.state[p]["exp_avg"])
        assert state["step"].item() == fused.state[p]["step"].item() == 2
    assert list(plain.state[model.emb.weight]) == ["step", "exp_avg", "exp_avg_sq"]


def test_negative_control_without_optimizer_state_the_run_differs(tmp_path: Path):
    """The comparison is sharp enough to notice a resume that drops the optimizer state."""
    from tlckpt.runtime import load_module_state, save_module_state
    from tlckpt.testing.bitwise import optimizer_states_equal

    torch.manual_seed(0)
    reference = TiedNet()
    reference_opt = make_adam("adam", reference.parameters())
    train(reference, reference_opt, 0, 5)
    torch.manual_seed(0)
    model = TiedNet()
    opt = make_adam("adam", model.parameters())
    train(model, opt, 0, 3)
    save_module_state(model, tmp_path / "m")
    fresh = TiedNet()
    fresh_opt = make_adam("adam", fresh.parameters())
    load_module_state(fresh, tmp_path / "m")
    train(fresh, fresh_opt, 3, 2)
    assert optimizer_states_equal(reference_opt, fresh_opt) != []
