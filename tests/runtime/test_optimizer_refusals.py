"""Everything ``save_optimizer`` / ``load_optimizer`` must refuse, clearly, changing nothing.

What no file can hold is refused by both. What only TorchLean's ``TLADAMF`` versions cannot
hold (amsgrad, differing groups, bfloat16 moments, slots without state, ...) is saved in
tlckpt's own family instead, refused with ``require_torchlean=True`` (every reason named),
and refused when a ``TLADAMF`` file is loaded into such an optimizer.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from runtime_support import step_once

from tlckpt.codec import (
    AdamEntry,
    AdamKind,
    ConfigError,
    EntryError,
    SchemaMismatchError,
    inspect,
    read_adam,
    write_adam,
)
from tlckpt.runtime import (
    MissingRandomCounterWarning,
    load_optimizer,
    save_optimizer,
    schema_of,
)
from tlckpt.testing.adam import adamw_config
from tlckpt.testing.bitwise import optimizer_unchanged, snapshot_optimizer
from tlckpt.testing.models import TiedNet, make_adam, train


@pytest.fixture
def trained(tmp_path: Path):
    """A tied model, its AdamW after two steps, and the optimizer file they saved."""
    torch.manual_seed(0)
    model = TiedNet()
    opt = make_adam("adamw", model.parameters())
    train(model, opt, 0, 2)
    path = tmp_path / "opt.tladam"
    save_optimizer(opt, model, path)
    return model, opt, path


def _assert_refused_both_ways(opt, model, path: Path, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        save_optimizer(opt, model, path.with_suffix(".new"))
    assert not path.with_suffix(".new").exists()
    snap = snapshot_optimizer(opt)
    with pytest.raises(error, match=match):
        load_optimizer(opt, model, path)
    assert optimizer_unchanged(opt, snap)


def _torchlean_file(params, path: Path) -> Path:
    """A ``TLADAMF`` file for parameters of these shapes (float32, one AdamW group)."""
    twins = [torch.nn.Parameter(torch.ones(p.shape)) for p in params]
    opt = torch.optim.AdamW(twins, lr=0.01)
    step_once(opt, twins)
    assert save_optimizer(opt, twins, path) == 2
    return path


def _assert_not_torchlean(opt, model, torchlean: Path, match: str) -> None:
    """Saved in tlckpt's family; refused with ``require_torchlean``; a TLADAMF file (of the
    same schema) refused by the optimizer, which is left as it was."""
    out = torchlean.with_suffix(".own")
    with pytest.raises(ConfigError, match=match) as info:
        save_optimizer(opt, model, out, require_torchlean=True)
    assert "does not fit TorchLean's TLADAMF versions" in str(info.value)
    assert not out.exists()
    assert save_optimizer(opt, model, out) == 1
    assert inspect(out)["family"] == "tlckpt_optimizer"
    snap = snapshot_optimizer(opt)
    with pytest.raises(ConfigError, match=match):
        load_optimizer(opt, model, torchlean)
    assert optimizer_unchanged(opt, snap)
    load_optimizer(opt, model, out)  # its own file loads (and changes nothing)
    assert optimizer_unchanged(opt, snap)


def test_not_adam(trained, tmp_path):
    # Any other optimizer is an optimizer tree (tests/runtime/test_optimizer_trees.py); an
    # Adam file does not load into it, nor it into TorchLean's families.
    model, _, path = trained
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ConfigError, match="TorchLean"):
        save_optimizer(sgd, model, tmp_path / "sgd.bin", require_torchlean=True)
    assert save_optimizer(sgd, model, tmp_path / "sgd.bin") == 1
    assert inspect(tmp_path / "sgd.bin")["family"] == "optimizer_tree"
    with pytest.raises(ConfigError, match="SGD"):
        load_optimizer(sgd, model, path)


def test_amsgrad(trained):
    model, _, path = trained
    opt = make_adam("adamw", model.parameters(), amsgrad=True)
    train(model, opt, 0, 1)
    _assert_not_torchlean(opt, model, path, "amsgrad")


def test_maximize(trained):
    model, _, path = trained
    opt = make_adam("adamw", model.parameters(), maximize=True)
    train(model, opt, 0, 1)
    _assert_not_torchlean(opt, model, path, "maximize")


def test_adam_with_weight_decay_says_use_adamw(trained):
    model, _, path = trained
    opt = make_adam("adam", model.parameters(), weight_decay=0.01)
    train(model, opt, 0, 1)
    _assert_not_torchlean(opt, model, path, "AdamW")


def test_adam_with_decoupled_weight_decay_is_adamw(tmp_path: Path):
    torch.manual_seed(0)
    model = TiedNet()
    opt = torch.optim.Adam(
        model.parameters(), lr=0.01, weight_decay=0.02, decoupled_weight_decay=True
    )
    train(model, opt, 0, 1)
    save_optimizer(opt, model, tmp_path / "o")
    ckpt = read_adam(tmp_path / "o", schema_of(model))
    assert ckpt.config.kind is AdamKind.ADAMW and ckpt.config.weight_decay == 0.02
    # ... and the same file loads into torch.optim.AdamW with those values.
    adamw = torch.optim.AdamW(model.parameters(), lr=0.5, weight_decay=0.02)
    load_optimizer(adamw, model, tmp_path / "o")
    assert adamw.param_groups[0]["lr"] == 0.5  # the learning rate is not in the file


@pytest.mark.parametrize(
    "field, value",
    [("betas", (0.8, 0.99)), ("betas", (0.81, 0.95)), ("eps", 1e-6), ("weight_decay", 0.5)],
)
def test_groups_that_differ(trained, field: str, value):
    model, _, path = trained
    params = list(model.parameters())
    opt = make_adam("adamw", [{"params": params[:3]}, {"params": params[3:], field: value}])
    train(model, opt, 0, 1)
    _assert_not_torchlean(opt, model, path, "param group 1 differs")


def test_groups_that_differ_only_in_lr_are_fine(trained, tmp_path: Path):
    model, _, _ = trained
    params = list(model.parameters())
    opt = make_adam("adamw", [{"params": params[:3]}, {"params": params[3:], "lr": 0.5}])
    train(model, opt, 0, 2)
    save_optimizer(opt, model, tmp_path / "g")
    other = make_adam("adamw", [{"params": params[:3], "lr": 0.1}, {"params": params[3:]}])
    load_optimizer(other, model, tmp_path / "g")
    assert [g["lr"] for g in other.param_groups] == [0.1, 0.05]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_moment_dtype_other_than_float32_or_float64(tmp_path: Path, dtype: torch.dtype):
    p = torch.nn.Parameter(torch.ones(3, dtype=dtype))
    opt = torch.optim.AdamW([p], lr=0.01)
    p.grad = torch.ones(3, dtype=dtype)
    opt.step()
    _assert_not_torchlean(opt, [p], _torchlean_file([p], tmp_path / "x"), "float32 or float64")


def test_moment_dtype_no_file_holds(tmp_path: Path):
    p = torch.nn.Parameter(torch.ones(3, dtype=torch.complex64))
    opt = torch.optim.AdamW([p], lr=0.01)
    p.grad = torch.ones(3, dtype=torch.complex64)
    opt.step()
    _assert_refused_both_ways(opt, [p], tmp_path / "x", ConfigError, "float32 or float64")


def test_mixed_parameter_dtypes(tmp_path: Path):
    a = torch.nn.Parameter(torch.ones(3))
    b = torch.nn.Parameter(torch.ones(3, dtype=torch.float64))
    opt = torch.optim.AdamW([a, b], lr=0.01)
    step_once(opt, [a, b])
    torchlean = _torchlean_file([a, b], tmp_path / "x")
    _assert_not_torchlean(opt, [a, b], torchlean, "different dtypes")


def test_saving_before_any_step(tmp_path: Path):
    model = TiedNet()
    opt = make_adam("adamw", model.parameters())
    with pytest.raises(ConfigError, match="no state yet"):
        save_optimizer(opt, model, tmp_path / "o", require_torchlean=True)
    assert not (tmp_path / "o").exists()
    assert save_optimizer(opt, model, tmp_path / "o") == 1  # TLCKOPT: no entries
    assert inspect(tmp_path / "o")["entries"] == []
    trained = make_adam("adamw", model.parameters())
    train(model, trained, 0, 1)
    load_optimizer(trained, model, tmp_path / "o")
    assert len(trained.state) == 0  # as torch has it before the first step


def test_trainable_parameter_without_state_is_named(tmp_path: Path):
    model = TiedNet()
    opt = make_adam("adamw", model.parameters())
    model.mix.bias.requires_grad_(False)  # no gradient in this step ...
    train(model, opt, 0, 1)
    model.mix.bias.requires_grad_(True)  # ... trainable again when saving
    with pytest.raises(ConfigError, match=r"mix\.bias"):
        save_optimizer(opt, model, tmp_path / "o", require_torchlean=True)
    assert save_optimizer(opt, model, tmp_path / "o") == 1
    slot = [n for n, _ in model.named_parameters(remove_duplicate=False)].index("mix.bias")
    entries = inspect(tmp_path / "o")["entries"]
    assert slot not in [e["id"] for e in entries] and len(entries) == len(opt.state)


def test_optimizer_parameter_missing_from_module(tmp_path: Path):
    model = TiedNet()
    extra = torch.nn.Parameter(torch.zeros(2))
    opt = make_adam("adamw", [*model.parameters(), extra])
    with pytest.raises(SchemaMismatchError, match="not among the given parameters"):
        save_optimizer(opt, model, tmp_path / "o")


def test_module_parameter_missing_from_optimizer(trained):
    model, _, path = trained
    opt = make_adam("adamw", [p for n, p in model.named_parameters() if n != "mix.bias"])
    with pytest.raises(SchemaMismatchError, match=r"mix\.bias.*not managed"):
        load_optimizer(opt, model, path)


def test_tied_slots_tracked_separately(tmp_path: Path):
    base = torch.nn.Parameter(torch.randn(3))
    twin = torch.nn.Parameter(base.data)
    opt = torch.optim.AdamW([base, twin], lr=0.01)
    with pytest.raises(SchemaMismatchError, match="separate histories"):
        save_optimizer(opt, [base, twin], tmp_path / "o")


def test_eps_that_rounds_to_zero_in_float32(tmp_path: Path):
    p = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.AdamW([p], lr=0.01, eps=1e-50)
    step_once(opt, [p])
    _assert_not_torchlean(opt, [p], _torchlean_file([p], tmp_path / "o"), "epsilon")
    q = torch.nn.Parameter(torch.ones(2, dtype=torch.float64))
    opt64 = torch.optim.AdamW([q], lr=0.01, eps=1e-50)
    step_once(opt64, [q])
    assert save_optimizer(opt64, [q], tmp_path / "o64") == 5  # fine in float64


def test_config_differing_in_one_bit(trained):
    model, _, path = trained
    eps = np.nextafter(1e-7, 1.0)
    opt = make_adam("adamw", model.parameters(), eps=float(eps))
    train(model, opt, 0, 1)
    snap = snapshot_optimizer(opt)
    with pytest.raises(ConfigError, match="epsilon"):
        load_optimizer(opt, model, path)
    assert optimizer_unchanged(opt, snap)


def test_kind_mismatch(trained):
    model, _, path = trained
    opt = make_adam("adam", model.parameters())
    train(model, opt, 0, 1)
    snap = snapshot_optimizer(opt)
    with pytest.raises(ConfigError, match="kind"):
        load_optimizer(opt, model, path)
    assert optimizer_unchanged(opt, snap)


def test_float64_file_into_float32_optimizer(tmp_path: Path, trained):
    model, opt, _ = trained
    torch.manual_seed(0)
    model64 = TiedNet(torch.float64)
    opt64 = make_adam("adamw", model64.parameters())
    train(model64, opt64, 0, 1)
    save_optimizer(opt64, model64, tmp_path / "f64")
    snap = snapshot_optimizer(opt)
    with pytest.raises(ConfigError, match="float64"):
        load_optimizer(opt, model, tmp_path / "f64")
    assert optimizer_unchanged(opt, snap)


def test_random_counter_rules(trained, tmp_path: Path):
    model, opt, plain = trained
    with_counter = tmp_path / "c.tladam"
    assert save_optimizer(opt, model, with_counter, random_counter=2**64 - 1) == 4
    snap = snapshot_optimizer(opt)
    with pytest.raises(ConfigError, match="restore_random_counter=True"):
        load_optimizer(opt, model, with_counter)
    assert optimizer_unchanged(opt, snap)
    assert load_optimizer(opt, model, with_counter, restore_random_counter=True) == 2**64 - 1
    with pytest.warns(MissingRandomCounterWarning):
        assert load_optimizer(opt, model, plain, restore_random_counter=True) is None
    assert load_optimizer(opt, model, plain) is None
    for bad in (-1, 2**64, 1.5, True):
        with pytest.raises(ConfigError):
            save_optimizer(opt, model, tmp_path / "bad", random_counter=bad)


def test_step_not_representable_in_the_step_tensor(tmp_path: Path):
    p = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.AdamW([p], lr=0.01)
    step_once(opt, [p])
    config = adamw_config()
    zeros = np.zeros(2, np.float32)
    write_adam(tmp_path / "big", schema_of([p]), config, {0: AdamEntry(2**24 + 1, zeros, zeros)})
    snap = snapshot_optimizer(opt)
    with pytest.raises(EntryError, match="not exactly representable"):
        load_optimizer(opt, [p], tmp_path / "big")
    assert optimizer_unchanged(opt, snap)
    write_adam(tmp_path / "ok", schema_of([p]), config, {0: AdamEntry(2**24, zeros, zeros)})
    load_optimizer(opt, [p], tmp_path / "ok")
    assert opt.state[p]["step"].item() == 2**24


def test_non_integral_live_step(tmp_path: Path):
    p = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.AdamW([p], lr=0.01)
    step_once(opt, [p])
    for bad in (1.5, 0.0, math.nan):
        opt.state[p]["step"] = torch.tensor(bad)
        with pytest.raises(EntryError, match="step"):
            save_optimizer(opt, [p], tmp_path / "o")


def test_frozen_parameters_in_the_optimizer_are_fine(tmp_path: Path):
    """Passing model.parameters() (frozen ones included) is the common way to build Adam."""
    torch.manual_seed(0)
    model = TiedNet()
    opt = make_adam("adam", model.parameters())
    assert any(p is model.frozen.weight for g in opt.param_groups for p in g["params"])
    train(model, opt, 0, 1)
    assert save_optimizer(opt, model, tmp_path / "o") == 3
