"""Every torch.optim optimizer through save_optimizer/load_optimizer and CheckpointManager:
bit-exact resume, and refusals that change nothing.

The optimizers are listed from ``torch.optim`` itself, so a new one fails
``test_every_torch_optimizer_has_a_spec`` until it is given constructor arguments here.
"""

from __future__ import annotations

import copy
import io
import math
import signal
import struct
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
import torch
from torch import nn

from tlckpt import inspect
from tlckpt.codec.errors import CheckpointError, ConfigError, SchemaMismatchError
from tlckpt.codec.safetensors import read_metadata
from tlckpt.formats.optimizer_tree import DOCUMENT_KEY
from tlckpt.runtime import (
    CheckpointManager,
    load_module_state,
    load_optimizer,
    open_checkpoint,
    save_optimizer,
)
from tlckpt.runtime.ops.tensor_files import load_tensors, save_tensors

STEPS = 3

TORCH_OPTIMIZERS = sorted(
    name
    for name in torch.optim.__all__
    if isinstance(getattr(torch.optim, name), type)
    and issubclass(getattr(torch.optim, name), torch.optim.Optimizer)
    and getattr(torch.optim, name) is not torch.optim.Optimizer
)


class Net(nn.Module):
    """Embedding (tied to the output layer), Linear, LayerNorm (bias frozen), Linear."""

    def __init__(self, sparse: bool = False):
        super().__init__()
        self.emb = nn.Embedding(10, 6, sparse=sparse)
        self.lin = nn.Linear(6, 4)
        self.norm = nn.LayerNorm(4)
        self.lin2 = nn.Linear(4, 6)
        self.out = nn.Linear(6, 10, bias=False)
        if not sparse:  # SparseAdam: the embedding's gradient must stay sparse
            self.out.weight = self.emb.weight  # tied: one parameter, named once
        self.norm.bias.requires_grad_(False)  # frozen: in no group

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        h = self.emb(idx)
        return self.out(h + self.lin2(self.norm(self.lin(h)).tanh()))


def _matrices(m: Net) -> list[nn.Parameter]:
    return [m.emb.weight, m.lin.weight, m.lin2.weight]


def _vectors(m: Net) -> list[nn.Parameter]:
    return [m.lin.bias, m.norm.weight, m.lin2.bias]


def _two_groups(lr: float) -> Callable[[Net], list[dict[str, Any]]]:
    return lambda m: [{"params": _matrices(m)}, {"params": _vectors(m), "lr": lr / 2}]


#: name → (groups of a model, constructor keyword arguments, sparse embedding)
SPECS: dict[str, tuple[Callable[[Net], Any], dict[str, Any], bool]] = {
    "Adafactor": (_two_groups(0.01), {"lr": 0.01}, False),
    "Adadelta": (_two_groups(1.0), {"weight_decay": 0.01}, False),
    "Adagrad": (_two_groups(0.1), {"lr": 0.1, "lr_decay": 0.01}, False),
    "Adam": (_two_groups(0.01), {"lr": 0.01, "amsgrad": True}, False),
    "AdamW": (_two_groups(0.01), {"lr": 0.01}, False),
    "Adamax": (_two_groups(0.01), {"lr": 0.01}, False),
    "ASGD": (_two_groups(0.05), {"lr": 0.05, "t0": 1.0}, False),
    "LBFGS": (
        lambda m: [*_matrices(m), *_vectors(m)],
        {"lr": 0.5, "max_iter": 3, "history_size": 2, "line_search_fn": "strong_wolfe"},
        False,
    ),
    "Muon": (
        lambda m: [{"params": _matrices(m)[:2]}, {"params": _matrices(m)[2:], "lr": 0.01}],
        {"lr": 0.02},
        False,
    ),
    "NAdam": (_two_groups(0.01), {"lr": 0.01, "decoupled_weight_decay": True}, False),
    "RAdam": (_two_groups(0.01), {"lr": 0.01, "weight_decay": 0.01}, False),
    "RMSprop": (_two_groups(0.01), {"lr": 0.01, "momentum": 0.5, "centered": True}, False),
    "Rprop": (_two_groups(0.01), {"lr": 0.01}, False),
    "SGD": (_two_groups(0.1), {"lr": 0.1, "momentum": 0.9, "nesterov": True}, False),
    "SparseAdam": (lambda m: [m.emb.weight], {"lr": 0.01}, True),
}

#: Optimizers whose files are optimizer trees (the rest keep TLADAMF/TLCKOPT).
TREES = [n for n in TORCH_OPTIMIZERS if n not in ("Adam", "AdamW")]


def test_every_torch_optimizer_has_a_spec() -> None:
    assert set(TORCH_OPTIMIZERS) == set(SPECS), set(TORCH_OPTIMIZERS) ^ set(SPECS)
    assert {"SGD", "Muon", "Adafactor", "LBFGS"} <= set(TREES)


def build(name: str, seed: int = 0) -> tuple[Net, torch.optim.Optimizer]:
    groups, kwargs, sparse = SPECS[name]
    torch.manual_seed(seed)
    model = Net(sparse)
    return model, getattr(torch.optim, name)(groups(model), **kwargs)


def train(model: Net, opt: torch.optim.Optimizer, start: int, steps: int) -> list[float]:
    losses = []
    for step in range(start, start + steps):
        g = torch.Generator().manual_seed(step)
        idx = torch.randint(0, 10, (8,), generator=g)
        target = torch.randint(0, 10, (8,), generator=g)

        def closure(idx: torch.Tensor = idx, target: torch.Tensor = target) -> torch.Tensor:
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(idx), target)
            loss.backward()
            return loss

        losses.append(float(opt.step(closure).detach()))
    return losses


def words(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes: equality of these is equality of every bit (NaN payloads, -0.0)."""
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8)


def assert_same_value(a: Any, b: Any, where: str) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), where
        assert (a.dtype, a.shape, a.device) == (b.dtype, b.shape, b.device), where
        assert torch.equal(words(a), words(b)), where
    elif isinstance(a, float):
        assert type(b) is float and struct.pack("<d", a) == struct.pack("<d", b), where
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same_value(x, y, f"{where}[{i}]")
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        for k in a:
            assert_same_value(a[k], b[k], f"{where}.{k}")
    else:
        assert type(a) is type(b) and a == b, where


def assert_same_run(m_a: Net, o_a: Any, m_b: Net, o_b: Any) -> None:
    for (name, p), (_, q) in zip(m_a.named_parameters(), m_b.named_parameters()):
        assert torch.equal(words(p), words(q)), name
    assert_same_value(o_a.state_dict(), o_b.state_dict(), "optimizer")


def snapshot(opt: torch.optim.Optimizer) -> dict[str, Any]:
    return copy.deepcopy(opt.state_dict())


@pytest.mark.parametrize("name", TORCH_OPTIMIZERS)
def test_resume_is_bit_exact(name: str, tmp_path: Path) -> None:
    model, opt = build(name)
    losses = train(model, opt, 0, STEPS)
    path = tmp_path / "opt.safetensors"
    save_optimizer(opt, model, path)
    family = inspect(path)["family"]
    assert family == "optimizer_tree" if name in TREES else family in ("adam", "tlckpt_optimizer")

    fresh_model, fresh_opt = build(name, seed=1)
    fresh_model.load_state_dict(model.state_dict())
    load_optimizer(fresh_opt, fresh_model, path)
    assert_same_run(model, opt, fresh_model, fresh_opt)

    tail = train(fresh_model, fresh_opt, STEPS, STEPS)
    ref_model, ref_opt = build(name)
    ref_losses = train(ref_model, ref_opt, 0, 2 * STEPS)
    assert [struct.pack("<d", x) for x in losses + tail] == [
        struct.pack("<d", x) for x in ref_losses
    ]
    assert_same_run(ref_model, ref_opt, fresh_model, fresh_opt)


@pytest.mark.parametrize("name", TORCH_OPTIMIZERS)
def test_resume_through_checkpoint_manager(name: str, tmp_path: Path) -> None:
    model, opt = build(name)
    train(model, opt, 0, STEPS)
    manager = CheckpointManager(tmp_path / "run")
    folder = manager.save(STEPS, model=model, optimizer=opt).wait()
    manifest = orjson.loads((Path(folder) / "manifest.json").read_bytes())
    family = manifest["members"]["optimizer"]["family"]
    assert family == "optimizer_tree" if name in TREES else family in ("adam", "tlckpt_optimizer")

    fresh_model, fresh_opt = build(name, seed=1)
    restored = manager.restore(model=fresh_model, optimizer=fresh_opt)
    assert restored.step == STEPS
    assert_same_run(model, opt, fresh_model, fresh_opt)
    train(fresh_model, fresh_opt, STEPS, STEPS)
    ref_model, ref_opt = build(name)
    train(ref_model, ref_opt, 0, 2 * STEPS)
    assert_same_run(ref_model, ref_opt, fresh_model, fresh_opt)


def test_tied_parameter_is_named_once_and_frozen_is_absent(tmp_path: Path) -> None:
    model, opt = build("SGD")
    train(model, opt, 0, 1)
    save_optimizer(opt, model, tmp_path / "o.safetensors")
    info = inspect(tmp_path / "o.safetensors")
    names = [n for g in info["groups"] for n in g["params"]]
    assert "emb.weight" in names and "out.weight" not in names and "norm.bias" not in names
    assert info["class"] == "torch.optim.sgd.SGD"
    tensors = load_tensors(tmp_path / "o.safetensors")
    assert set(tensors) == {f"state/{n}/momentum_buffer" for n in names}


def test_empty_state_entries_are_kept(tmp_path: Path) -> None:
    model, opt = build("RMSprop")
    train(model, opt, 0, 1)
    opt.state[model.norm.weight].clear()  # looked up, never stepped: torch lists it
    save_optimizer(opt, model, tmp_path / "o.safetensors")
    fresh = _rebuilt("RMSprop", model)
    load_optimizer(fresh, model, tmp_path / "o.safetensors")
    assert_same_value(opt.state_dict(), fresh.state_dict(), "loaded")


def test_lbfgs_lists_of_tensors_are_held(tmp_path: Path) -> None:
    model, opt = build("LBFGS")
    train(model, opt, 0, 2)
    save_optimizer(opt, model, tmp_path / "o.safetensors")
    names = set(load_tensors(tmp_path / "o.safetensors"))
    assert "state/emb.weight/old_dirs/0" in names and "state/emb.weight/d" in names


def test_random_counter_round_trips(tmp_path: Path) -> None:
    model, opt = build("RMSprop")
    train(model, opt, 0, 1)
    save_optimizer(opt, model, tmp_path / "o.safetensors", random_counter=2**40 + 3)
    _refused(_rebuilt("RMSprop", model), model, tmp_path / "o.safetensors", ConfigError)
    fresh = _rebuilt("RMSprop", model)
    got = load_optimizer(fresh, model, tmp_path / "o.safetensors", restore_random_counter=True)
    assert got == 2**40 + 3


def test_execution_flags_stay_the_live_runs(tmp_path: Path) -> None:
    model, opt = build("SGD")
    train(model, opt, 0, 1)
    opt.param_groups[0]["lr"] = 0.125
    save_optimizer(opt, model, tmp_path / "o.safetensors")
    groups, kwargs, _ = SPECS["SGD"]
    live = torch.optim.SGD(groups(model), **{**kwargs, "foreach": True})
    load_optimizer(live, model, tmp_path / "o.safetensors")
    assert live.param_groups[0]["foreach"] is True  # the live run's
    assert live.param_groups[0]["lr"] == 0.125  # the file's, as torch's load_state_dict


def test_require_torchlean_refuses_other_optimizers(tmp_path: Path) -> None:
    model, opt = build("SGD")
    with pytest.raises(ConfigError, match="TorchLean"):
        save_optimizer(opt, model, tmp_path / "o.safetensors", require_torchlean=True)
    assert not (tmp_path / "o.safetensors").exists()


# --- refusals: a CheckpointError, and the optimizer exactly as it was ----------------------


def _saved(tmp_path: Path, name: str = "SGD") -> tuple[Net, torch.optim.Optimizer, Path]:
    model, opt = build(name)
    train(model, opt, 0, 2)
    path = tmp_path / "o.safetensors"
    save_optimizer(opt, model, path)
    return model, opt, path


def _rebuilt(name: str, model: Net) -> torch.optim.Optimizer:
    """A fresh optimizer of ``name`` over ``model``'s parameters."""
    groups, kwargs, _ = SPECS[name]
    return getattr(torch.optim, name)(groups(model), **kwargs)


def _refused(opt: torch.optim.Optimizer, params: Any, path: Any, error: type) -> None:
    before = snapshot(opt)
    with pytest.raises(error):
        load_optimizer(opt, params, path)
    assert_same_value(before, opt.state_dict(), "unchanged")


@pytest.mark.parametrize("live_state", [False, True])
def test_renamed_parameter_is_refused(tmp_path: Path, live_state: bool) -> None:
    _, _, path = _saved(tmp_path)
    live_model, live_opt = build("SGD")
    if live_state:
        train(live_model, live_opt, 0, 1)
    renamed = {
        ("lin.bias_renamed" if n == "lin.bias" else n): p for n, p in live_model.named_parameters()
    }
    _refused(live_opt, renamed, path, SchemaMismatchError)


def test_other_optimizer_class_is_refused(tmp_path: Path) -> None:
    model, _, path = _saved(tmp_path)
    groups, _, _ = SPECS["RMSprop"]
    rms = torch.optim.RMSprop(groups(model), lr=0.1)
    train(model, rms, 0, 1)
    _refused(rms, model, path, ConfigError)
    adam = torch.optim.Adam(groups(model), lr=0.1)
    train(model, adam, 0, 1)
    _refused(adam, model, path, CheckpointError)  # an Adam load: not its family


def test_adam_file_into_sgd_is_refused(tmp_path: Path) -> None:
    model, _, path = _saved(tmp_path, "AdamW")
    _refused(_rebuilt("SGD", model), model, path, ConfigError)


def test_other_group_structure_is_refused(tmp_path: Path) -> None:
    model, _, path = _saved(tmp_path)
    one_group = torch.optim.SGD([*_matrices(model), *_vectors(model)], lr=0.1, momentum=0.9)
    _refused(one_group, model, path, SchemaMismatchError)
    reordered = torch.optim.SGD(
        [{"params": _matrices(model)[::-1]}, {"params": _vectors(model)}], lr=0.1, momentum=0.9
    )
    _refused(reordered, model, path, SchemaMismatchError)


def test_other_dtype_is_refused(tmp_path: Path) -> None:
    _, _, path = _saved(tmp_path)
    model, opt = build("SGD")
    model.to(torch.float64)
    _refused(opt, model, path, SchemaMismatchError)


def _rewritten(path: Path, edit: Callable[[dict], None], out: Path) -> Path:
    """The file with its document edited (the tensors kept)."""
    document = orjson.loads(read_metadata(path)[DOCUMENT_KEY])
    edit(document)
    save_tensors(load_tensors(path), out, metadata={DOCUMENT_KEY: orjson.dumps(document).decode()})
    return out


def test_missing_state_key_is_refused(tmp_path: Path) -> None:
    model, opt = build("Adadelta")
    train(model, opt, 0, 2)
    del opt.state[model.lin.weight]["acc_delta"]  # one matrix of the group lacks a key
    save_optimizer(opt, model, tmp_path / "one.safetensors")
    fresh = _rebuilt("Adadelta", model)
    _refused(fresh, model, tmp_path / "one.safetensors", SchemaMismatchError)

    for p in opt.state.values():  # every entry lacks it: the live state's keys tell
        p.pop("acc_delta", None)
    save_optimizer(opt, model, tmp_path / "all.safetensors")
    train(model, fresh, 0, 1)
    _refused(fresh, model, tmp_path / "all.safetensors", SchemaMismatchError)


@pytest.mark.parametrize(
    "edit",
    [
        lambda d: d.update(version=2),
        lambda d: d.update({"class": 7}),
        lambda d: d.pop("groups"),
        lambda d: d["tensors"].pop(),
        lambda d: d["tensors"].reverse(),
        lambda d: d["state"].update({"nowhere": {}}),
        lambda d: d["groups"][0]["params"][0].__setitem__(1, "F16"),
        lambda d: d["groups"][0]["params"].pop(),
        lambda d: d["state"]["lin.weight"].update(momentum_buffer={"$tensor": ["file_tensor", 0]}),
        lambda d: d["state"]["lin.weight"].update(momentum_buffer={"$tensor": ["float32", 1.0]}),
        lambda d: d.update(random_counter=-1),
        lambda d: d["groups"][0]["options"].update(lr="fast"),
        lambda d: d["groups"][1]["options"].update(nesterov=1),
        lambda d: d["groups"][0]["options"].update(momentum=[0.9]),
    ],
)
def test_edited_documents_are_refused(tmp_path: Path, edit: Callable[[dict], None]) -> None:
    model, _, path = _saved(tmp_path)
    edited = _rewritten(path, edit, tmp_path / "e.safetensors")
    live = _rebuilt("SGD", model)
    train(model, live, 0, 1)
    _refused(live, model, edited, CheckpointError)


def test_state_keys_differing_from_the_live_state_are_refused(tmp_path: Path) -> None:
    model, _, path = _saved(tmp_path)  # SGD with momentum: momentum_buffer
    groups, _, _ = SPECS["SGD"]
    live = torch.optim.SGD(groups(model), lr=0.1, momentum=0.9)
    train(model, live, 0, 1)
    live.state[model.lin.weight]["extra"] = torch.zeros(1)
    _refused(live, model, path, SchemaMismatchError)


def test_truncated_files_are_refused(tmp_path: Path) -> None:
    model, _, path = _saved(tmp_path, "LBFGS")
    data = path.read_bytes()
    live = _rebuilt("LBFGS", model)
    for cut in sorted({0, 1, 7, 8, 9, 40, len(data) // 2, len(data) - 1}):
        _refused(live, model, io.BytesIO(data[:cut]), CheckpointError)


def test_mutated_files_load_or_are_refused_whole(tmp_path: Path) -> None:
    model, _, path = _saved(tmp_path, "ASGD")
    data = path.read_bytes()
    live = _rebuilt("ASGD", model)
    train(model, live, 0, 1)
    before = snapshot(live)
    gen = torch.Generator().manual_seed(5)
    header_end = 8 + int.from_bytes(data[:8], "little")
    refused = 0
    for _ in range(150):
        at = int(torch.randint(0, header_end, (1,), generator=gen))
        mutated = bytearray(data)
        mutated[at] = int(torch.randint(0, 256, (1,), generator=gen))
        try:
            load_optimizer(live, model, io.BytesIO(bytes(mutated)))
        except CheckpointError:
            refused += 1
            assert_same_value(before, live.state_dict(), "unchanged")
        else:
            before = snapshot(live)
    assert refused > 50


class _SignalAfterClear(defaultdict):
    """An optimizer state that receives SIGINT right after the commit clears it."""

    def clear(self) -> None:
        super().clear()
        signal.raise_signal(signal.SIGINT)


def test_interrupt_inside_the_commit_is_raised_after_it(tmp_path: Path) -> None:
    model, opt, path = _saved(tmp_path)
    saved = snapshot(opt)
    live = _rebuilt("SGD", model)
    train(model, live, 0, 1)
    live.param_groups[0]["lr"] = 7.0  # the file's 0.1 must land with the state
    live.state = _SignalAfterClear(dict, live.state)
    handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            load_optimizer(live, model, path)
    finally:
        signal.signal(signal.SIGINT, handler)
    assert_same_value(saved, live.state_dict(), "all of the file's, groups included")


def test_interrupt_before_the_commit_changes_nothing(tmp_path: Path, monkeypatch) -> None:
    from tlckpt.runtime.ops import optimizer_trees

    model, _, path = _saved(tmp_path)
    live = _rebuilt("SGD", model)
    train(model, live, 0, 1)
    before = snapshot(live)

    def interrupted(*args: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(optimizer_trees, "check_against", interrupted)
    with pytest.raises(KeyboardInterrupt):
        load_optimizer(live, model, path)
    assert_same_value(before, live.state_dict(), "unchanged")


def test_non_finite_hyperparameters_are_exact(tmp_path: Path) -> None:
    model, opt = build("SGD")
    train(model, opt, 0, 1)
    opt.param_groups[1]["lr"] = math.inf
    opt.param_groups[0]["custom"] = (float("nan"), -0.0, 2**80)
    save_optimizer(opt, model, tmp_path / "o.safetensors")
    groups, kwargs, _ = SPECS["SGD"]
    live = torch.optim.SGD(groups(model), **kwargs)
    live.param_groups[0]["custom"] = None
    load_optimizer(live, model, tmp_path / "o.safetensors")
    assert live.param_groups[1]["lr"] == math.inf
    nan, zero, big = live.param_groups[0]["custom"]
    assert math.isnan(nan) and struct.pack("<d", zero) == struct.pack("<d", -0.0)
    assert big == 2**80


class Averaging(torch.optim.Optimizer):
    """A custom optimizer: a running average, a count, a tuple history, a tensor option."""

    def __init__(self, params: Any, lr: float = 0.1):
        super().__init__(params, {"lr": lr, "scale": torch.tensor(0.5, dtype=torch.float64)})

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["avg"] = torch.zeros_like(p)
                    state["count"] = 0
                    state["history"] = ()
                state["count"] += 1
                state["avg"].lerp_(p.grad, float(group["scale"]))
                state["history"] = (*state["history"][-1:], {"n": state["count"], "g": p.grad[0]})
                p.add_(state["avg"], alpha=-group["lr"])
        return loss


def test_a_custom_optimizer_resumes_exactly(tmp_path: Path) -> None:
    def make(model: Net) -> Averaging:
        return Averaging(_two_groups(0.1)(model))

    torch.manual_seed(0)
    model = Net()
    opt = make(model)
    train(model, opt, 0, 3)
    save_optimizer(opt, model, tmp_path / "o.safetensors")
    assert inspect(tmp_path / "o.safetensors")["class"].endswith(".Averaging")
    fresh = make(model)
    load_optimizer(fresh, model, tmp_path / "o.safetensors")
    assert_same_value(opt.state_dict(), fresh.state_dict(), "loaded")
    assert fresh.state[model.lin.weight]["history"][-1]["n"] == 3
    _refused(_rebuilt("SGD", model), model, tmp_path / "o.safetensors", ConfigError)


def test_open_checkpoint_and_load_tensors_read_a_tree(tmp_path: Path) -> None:
    model, opt, path = _saved(tmp_path)
    with open_checkpoint(path) as f:
        assert f.family == "optimizer_tree"
        buffer = f.tensor("state/lin.weight/momentum_buffer")
    live = opt.state[model.lin.weight]["momentum_buffer"]
    assert torch.equal(words(buffer), words(live))
    assert set(load_tensors(path)) == set(f.names())
    with pytest.raises(CheckpointError):  # not model state
        load_module_state(model, path)


def test_a_frozen_parameter_keeps_its_state_in_its_group(tmp_path: Path) -> None:
    model, opt = build("RMSprop")
    train(model, opt, 0, 2)
    model.lin.weight.requires_grad_(False)  # gradual unfreezing: torch keeps its state
    train(model, opt, 2, 1)
    save_optimizer(opt, model, tmp_path / "o.safetensors")
    fresh_model, fresh = build("RMSprop", seed=1)
    fresh_model.load_state_dict(model.state_dict())
    fresh_model.lin.weight.requires_grad_(False)
    load_optimizer(fresh, fresh_model, tmp_path / "o.safetensors")
    assert_same_run(model, opt, fresh_model, fresh)
    for m in (model, fresh_model):
        m.lin.weight.requires_grad_(True)
    train(model, opt, 3, 2)
    train(fresh_model, fresh, 3, 2)
    assert_same_run(model, opt, fresh_model, fresh)
