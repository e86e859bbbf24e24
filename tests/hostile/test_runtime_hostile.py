"""Hostile files into live objects: when a load raises, nothing live has changed, bit for bit.

Short CI version of ``python -m fuzz.runtime_hostile`` (a sample of each file's systematic
mutations per optimizer variant), plus files that are well-formed but fail only the checks
made *after* the whole file has been read (a step the optimizer's step tensor cannot hold, a
random counter with nowhere to go, integer buffers and tied copies that do not fit): those
are the rejections that come last, when a half-done install would show.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from hostile_support import fuzz_module

import tlckpt
from tlckpt.codec import (
    AdamEntry,
    CheckpointError,
    OptimizerEntry,
    write_adam,
    write_float32_state,
    write_optimizer_state,
)
from tlckpt.runtime.binding.adam_binding import bind_adam, bind_optimizer
from tlckpt.runtime.binding.tensors import to_host
from tlckpt.testing.models import default_dtype

rh = fuzz_module("runtime_hostile")
VARIANTS = {v.name: v for v in rh.variants("cpu")}


@pytest.fixture(autouse=True)
def _float32_default_dtype() -> Iterator[None]:
    with default_dtype(torch.float32):
        yield


# ------------------------------------------------------------------------------ the checker


def _rewrite(t: torch.Tensor) -> None:
    with torch.no_grad():
        t.copy_(t.detach().clone())


def _changes(model: torch.nn.Module, opt: torch.optim.Optimizer) -> list:
    """Ways a half-done load could touch live objects, each undetectable by value alone or
    not: the checker must see every one."""
    p = model.mix.weight
    state = opt.state[p]
    return [
        ("parameter value", lambda: p.data.view(-1)[0].add_(1.0)),
        ("same value written (version counter)", lambda: _rewrite(p)),
        ("buffer", lambda: model.norm.running_mean.add_(1.0)),
        ("int64 buffer", lambda: model.norm.num_batches_tracked.add_(1)),
        ("step tensor", lambda: state["step"].add_(1.0)),
        (
            "exp_avg replaced by an equal clone",
            lambda: state.__setitem__("exp_avg", state["exp_avg"].clone()),
        ),
        ("exp_avg_sq value", lambda: state["exp_avg_sq"].view(-1)[0].mul_(2.0)),
        ("lr", lambda: opt.param_groups[0].__setitem__("lr", 0.5)),
        (
            "betas bit",
            lambda: opt.param_groups[0].__setitem__("betas", (np.nextafter(0.9, 1.0), 0.999)),
        ),
        ("state entry dropped", lambda: opt.state.pop(p)),
        ("param group parameter swapped", lambda: opt.param_groups[0]["params"].reverse()),
    ]


@pytest.mark.parametrize("index", range(11))
def test_snapshot_sees_every_kind_of_change(index: int) -> None:
    model, opt = rh.build(VARIANTS["adamw-foreach-false"])
    before = rh.snapshot(model, opt)
    assert not rh.differences(before, rh.snapshot(model, opt))
    name, change = _changes(model, opt)[index]
    change()
    assert rh.differences(before, rh.snapshot(model, opt)), name


# ------------------------------------------------------------------------------ mutations


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_mutated_files_never_change_live_objects(variant: str, tmp_path: Path) -> None:
    stats = rh.Stats()
    rh.run_variant(VARIANTS[variant], 70, random.Random(variant), stats, tmp_path)
    assert stats.escapes == 0, stats.findings
    assert stats.changed == 0, stats.findings
    assert stats.rejected > 50
    assert stats.cases == stats.accepted + stats.rejected


# ------------------------------------------------------------------------------ late rejections


def _trained(name: str = "adamw-foreach-false"):
    return rh.build(VARIANTS[name])


def _optimizer_file(opt, model, path: Path, *, step: int | None = None, counter=None) -> None:
    binding = bind_adam(opt, model)
    entries = {}
    for i in binding.slots.schema.representative_slots:
        s = opt.state[binding.slots.tensors[i]]
        entries[i] = AdamEntry(
            int(s["step"].item()) if step is None else step,
            s["exp_avg"].detach().reshape(-1).numpy().copy(),
            s["exp_avg_sq"].detach().reshape(-1).numpy().copy(),
        )
    write_adam(path, binding.slots.schema, binding.config, entries, counter)


def _own_file(opt, model, path: Path, *, step: int | None = None, groups=None) -> None:
    """The optimizer's state as a ``TLCKOPT`` file, with one step or the groups replaced."""
    binding = bind_optimizer(opt, model)
    entries = {}
    for i in binding.slots.schema.representative_slots:
        s = opt.state.get(binding.slots.tensors[i])
        if not s:
            continue
        moments = [
            to_host(s[key].detach().reshape(-1)).copy()
            for key in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")
            if key in s
        ]
        entries[i] = OptimizerEntry(
            int(s["step"].item()) if step is None else step, binding.dtypes[i], *moments
        )
    write_optimizer_state(
        path,
        binding.slots.schema,
        binding.group_configs if groups is None else groups,
        binding.group_index,
        entries,
        7,
    )


def _assert_untouched(model, opt, load) -> None:
    before = rh.snapshot(model, opt)
    with pytest.raises(CheckpointError):
        load()
    assert not rh.differences(before, rh.snapshot(model, opt))


def test_step_the_step_tensor_cannot_hold_changes_nothing(tmp_path: Path) -> None:
    model, opt = _trained()
    path = tmp_path / "o.tladam"
    _optimizer_file(opt, model, path, step=2**60 + 1)  # not exact in a float32 step
    _assert_untouched(model, opt, lambda: tlckpt.load_optimizer(opt, model, path))


def test_random_counter_with_nowhere_to_go_changes_nothing(tmp_path: Path) -> None:
    model, opt = _trained()
    path = tmp_path / "o.tladam"
    _optimizer_file(opt, model, path, counter=5)
    # Moments that differ from the live ones, so a premature install would show.
    with torch.no_grad():
        for s in opt.state.values():
            s["exp_avg"].add_(1.0)
    _assert_untouched(model, opt, lambda: tlckpt.load_optimizer(opt, model, path))


def _state_arrays(model, shift: float = 1.0) -> list[np.ndarray]:
    """The model's state as float32 arrays, each shifted so that any install would show."""
    return [
        np.asarray(t.detach().to(torch.float32).numpy() + shift, dtype=np.float32)
        for t in model.state_dict().values()
    ]


@pytest.mark.parametrize("staged", [True, False])
def test_integer_buffer_that_does_not_fit_changes_nothing(tmp_path: Path, staged: bool) -> None:
    model, opt = _trained()
    arrays = _state_arrays(model)  # every tensor differs from the live one
    arrays[-1] = np.array(0.5, dtype=np.float32)  # num_batches_tracked (int64) gets 0.5
    path = tmp_path / "m.tlsf32"
    write_float32_state(path, arrays)
    _assert_untouched(model, opt, lambda: tlckpt.load_module_state(model, path, staged=staged))


@pytest.mark.parametrize("staged", [True, False])
def test_tied_copies_that_disagree_change_nothing(tmp_path: Path, staged: bool) -> None:
    model, opt = _trained()
    names = list(model.state_dict(keep_vars=True))
    arrays = _state_arrays(model)
    head = names.index("head.weight")
    arrays[head] = arrays[head] + 1  # the head's copy of the tied weight disagrees
    path = tmp_path / "m.tlsf32"
    write_float32_state(path, arrays)
    _assert_untouched(model, opt, lambda: tlckpt.load_module_state(model, path, staged=staged))


def test_state_bits_whose_last_tensor_does_not_fit_change_nothing(tmp_path: Path) -> None:
    model, opt = _trained()
    arrays = _state_arrays(model)
    arrays[-1] = np.array(-3.25, dtype=np.float32)  # not an int64 value
    path = tmp_path / "m.json"
    tlckpt.write_state_bits(path, arrays, "float32")
    _assert_untouched(model, opt, lambda: tlckpt.load_state_bits(model, path))


def test_own_family_step_the_step_tensor_cannot_hold_changes_nothing(tmp_path: Path) -> None:
    model, opt = _trained("adamw-groups-amsgrad")
    path = tmp_path / "o.tlckopt"
    _own_file(opt, model, path, step=2**60 + 1)
    load = lambda: tlckpt.load_optimizer(opt, model, path, restore_random_counter=True)  # noqa: E731
    _assert_untouched(model, opt, load)


def test_own_family_groups_that_differ_change_nothing(tmp_path: Path) -> None:
    """One bit of one group's weight decay: refused; only the learning rate: loaded."""
    import dataclasses

    model, opt = _trained("adamw-bf16-idle")
    groups = bind_optimizer(opt, model).group_configs
    path = tmp_path / "o.tlckopt"
    wd = float(np.nextafter(groups[0].weight_decay, 1.0))
    _own_file(opt, model, path, groups=[dataclasses.replace(groups[0], weight_decay=wd)])
    load = lambda: tlckpt.load_optimizer(opt, model, path, restore_random_counter=True)  # noqa: E731
    _assert_untouched(model, opt, load)
    _own_file(opt, model, path, groups=[dataclasses.replace(groups[0], lr=0.5)])
    before = rh.snapshot(model, opt)
    load()
    assert opt.param_groups[0]["lr"] == 1e-2  # the live learning rate stays
    assert not rh.differences(rh.values_only(before), rh.values_only(rh.snapshot(model, opt)))
