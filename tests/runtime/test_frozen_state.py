"""Frozen parameters keep their optimizer state (issue #20, item 12).

Gradual unfreezing freezes a layer while ``optimizer.state`` still holds its moments: torch
keeps them and uses them again once the layer is unfrozen. A save must keep them too — in
tlckpt's own family (``TLCKOPT`` version 2), since TorchLean's ``TLADAMF`` forbids a frozen slot
owning state — so that a resume through freeze and unfreeze is bit for bit the uninterrupted
run. The file's ``requires_grad`` flags must equal the live model's, as for every optimizer file.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tlckpt import CheckpointManager
from tlckpt.codec import ConfigError, SchemaMismatchError
from tlckpt.codec import inspect as tlckpt_inspect
from tlckpt.runtime import load_optimizer, save_optimizer
from tlckpt.testing.models import CUDA_IMPLS, IMPLS

#: (device, optimizer implementation): every setting, on the CPU and on CUDA where present.
SETTINGS = [
    *(pytest.param("cpu", impl, id=impl) for impl in IMPLS),
    *(
        pytest.param(
            "cuda",
            impl,
            id=f"cuda-{impl}",
            marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
        )
        for impl in CUDA_IMPLS
    ),
]


def _build(seed: int = 0, amsgrad: bool = False, device: str = "cpu", impl: str = "default"):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2)).to(device)
    opt = torch.optim.AdamW(
        model.parameters(), lr=1e-2, weight_decay=0.01, amsgrad=amsgrad, **CUDA_IMPLS[impl]
    )
    return model, opt


def _train(model, opt, first: int, steps: int) -> None:
    device = next(model.parameters()).device
    for k in range(first, first + steps):
        x = torch.randn(5, 3, generator=torch.Generator().manual_seed(k)).to(device)
        opt.zero_grad()
        model(x).pow(2).sum().backward()
        opt.step()


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(-1), b.view(-1))


def _assert_same_run(model_a, opt_a, model_b, opt_b) -> None:
    pa, pb = list(model_a.parameters()), list(model_b.parameters())
    for x, y in zip(pa, pb):
        assert _same_bits(x.detach(), y.detach())
    assert len(opt_a.state) == len(opt_b.state)
    for x, y in zip(pa, pb):
        sa, sb = opt_a.state.get(x, {}), opt_b.state.get(y, {})
        assert sorted(sa) == sorted(sb)
        for key in sa:
            assert _same_bits(sa[key], sb[key]), key


@pytest.mark.parametrize("amsgrad", [False, True])
def test_frozen_state_survives_save_and_load(tmp_path: Path, amsgrad: bool) -> None:
    model, opt = _build(amsgrad=amsgrad)
    _train(model, opt, 0, 2)
    model[0].requires_grad_(False)  # its moments stay in opt.state, as torch keeps them
    assert save_optimizer(opt, model, tmp_path / "o") == 2
    info = tlckpt_inspect(tmp_path / "o")
    assert (info["family"], info["version"]) == ("tlckpt_optimizer", 2)
    assert [e["id"] for e in info["entries"]] == [0, 1, 2, 3]
    assert [s["group"] for s in info["slots"]] == [0, 0, 0, 0]
    fresh_model, fresh = _build(seed=1, amsgrad=amsgrad)
    fresh_model.load_state_dict(model.state_dict())
    fresh_model[0].requires_grad_(False)
    load_optimizer(fresh, fresh_model, tmp_path / "o")
    _assert_same_run(model, opt, fresh_model, fresh)


def _resume_through_freeze(
    tmp_path: Path, save, load, device: str = "cpu", impl: str = "default"
) -> None:
    """N steps, freeze, train, save; a fresh run built and frozen the same way loads, both
    unfreeze and train: every parameter and state tensor equal bit for bit."""
    model, opt = _build(device=device, impl=impl)
    _train(model, opt, 0, 3)
    model[0].requires_grad_(False)
    _train(model, opt, 3, 2)
    save(model, opt)
    fresh_model, fresh = _build(seed=7, device=device, impl=impl)
    fresh_model[0].requires_grad_(False)
    load(fresh_model, fresh)
    _assert_same_run(model, opt, fresh_model, fresh)
    for m in (model, fresh_model):
        m[0].requires_grad_(True)
    _train(model, opt, 5, 3)
    _train(fresh_model, fresh, 5, 3)
    _assert_same_run(model, opt, fresh_model, fresh)


@pytest.mark.parametrize("device, impl", SETTINGS)
def test_resume_through_freeze_and_unfreeze(tmp_path: Path, device: str, impl: str) -> None:
    def save(model, opt):
        assert save_optimizer(opt, model, tmp_path / "o") == 2
        torch.save(model.state_dict(), tmp_path / "m")

    def load(model, opt):
        model.load_state_dict(torch.load(tmp_path / "m"))
        load_optimizer(opt, model, tmp_path / "o")

    _resume_through_freeze(tmp_path, save, load, device, impl)


def test_resume_through_freeze_in_a_checkpoint_set(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path / "sets")
    _resume_through_freeze(
        tmp_path,
        lambda model, opt: manager.save(5, model=model, optimizer=opt),
        lambda model, opt: manager.restore(model=model, optimizer=opt),
    )


def test_require_torchlean_says_why(tmp_path: Path) -> None:
    model, opt = _build()
    _train(model, opt, 0, 2)
    model[0].requires_grad_(False)
    with pytest.raises(ConfigError, match=r"frozen slot 0 \(0\.weight\).*TLADAMF") as info:
        save_optimizer(opt, model, tmp_path / "o", require_torchlean=True)
    assert "slot 1 (0.bias)" in str(info.value)
    assert not (tmp_path / "o").exists()


def test_files_without_frozen_state_stay_as_they_were(tmp_path: Path) -> None:
    """Frozen from the start (no state): TorchLean's version, as before; a frozen parameter
    the optimizer does not manage has nowhere to keep state either."""
    model, opt = _build()
    model[0].requires_grad_(False)
    _train(model, opt, 0, 2)
    assert save_optimizer(opt, model, tmp_path / "o") == 2
    assert tlckpt_inspect(tmp_path / "o")["family"] == "adam"
    model, opt = _build(amsgrad=True)
    model[0].requires_grad_(False)
    _train(model, opt, 0, 2)
    assert save_optimizer(opt, model, tmp_path / "o") == 1  # TLCKOPT v1, as before


def _frozen_file(tmp_path: Path):
    model, opt = _build()
    _train(model, opt, 0, 2)
    model[0].requires_grad_(False)
    save_optimizer(opt, model, tmp_path / "o")
    return model, opt


def _unchanged(opt, before: dict) -> None:
    assert {id(p) for p in opt.state} == before.keys()
    for p, s in opt.state.items():
        assert sorted(s) == sorted(before[id(p)])
        for key, value in s.items():
            assert _same_bits(value, before[id(p)][key])


def _snapshot(opt) -> dict:
    return {id(p): {k: v.clone() for k, v in s.items()} for p, s in opt.state.items()}


def test_frozen_state_into_a_trainable_slot_is_refused(tmp_path: Path) -> None:
    """The file's requires_grad flags must be the live model's: a frozen slot with state
    does not load where that parameter is trainable (nor the other way round)."""
    _frozen_file(tmp_path)
    live_model, live = _build()
    _train(live_model, live, 0, 1)
    before = _snapshot(live)
    with pytest.raises(SchemaMismatchError, match="slot 0: requires_grad False in the file"):
        load_optimizer(live, live_model, tmp_path / "o")
    _unchanged(live, before)


def test_torchlean_file_into_a_frozen_slot_is_refused(tmp_path: Path) -> None:
    model, opt = _build()
    _train(model, opt, 0, 2)
    assert save_optimizer(opt, model, tmp_path / "t") == 2  # TLADAMF, all trainable
    model[0].requires_grad_(False)
    before = _snapshot(opt)
    with pytest.raises(SchemaMismatchError, match="slot 0: requires_grad True in the file"):
        load_optimizer(opt, model, tmp_path / "t")
    _unchanged(opt, before)


def test_frozen_state_needs_the_optimizer_to_manage_the_slot(tmp_path: Path) -> None:
    """A fresh optimizer built over the trainable parameters only has nowhere to put the
    frozen layer's state: refused, naming the slot."""
    model, _ = _frozen_file(tmp_path)
    only_trainable = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad], lr=1e-2, weight_decay=0.01
    )
    with pytest.raises(SchemaMismatchError, match="slot 0 is frozen and has state") as info:
        load_optimizer(only_trainable, model, tmp_path / "o")
    assert "does not manage" in str(info.value)
    assert not only_trainable.state


class _Tied(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(6, 3)
        self.mix = torch.nn.Linear(3, 3)
        self.head = torch.nn.Linear(3, 6, bias=False)
        self.head.weight = self.embed.weight  # one tensor, two slots

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.mix(self.embed(tokens))))


def test_a_frozen_tied_tensor_keeps_one_state(tmp_path: Path) -> None:
    """Frozen tied slots have no representative; the tensor's one state is its first slot's."""
    torch.manual_seed(0)
    model = _Tied()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for k in range(2):
        opt.zero_grad()
        model(torch.tensor([k, 1, 2])).sum().backward()
        opt.step()
    model.embed.requires_grad_(False)
    assert save_optimizer(opt, model, tmp_path / "o") == 2
    info = tlckpt_inspect(tmp_path / "o")
    assert [s["group"] for s in info["slots"]] == [0, 0, 0, None]  # slot 3: the same tensor
    assert [e["id"] for e in info["entries"]] == [0, 1, 2]
    fresh = torch.optim.Adam(model.parameters(), lr=1e-2)
    load_optimizer(fresh, model, tmp_path / "o")
    _assert_same_run(model, opt, model, fresh)
