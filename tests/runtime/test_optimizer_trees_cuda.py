"""Optimizer trees on CUDA: state on the device, ``step`` where each optimizer's settings
expect it (on the device for ``capturable``/``fused``, else on the CPU), a CPU file loaded
into a capturable CUDA run, and bit-exact resume there. Skipped without a GPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from test_optimizer_trees import Net, assert_same_value, words

from tlckpt.runtime import load_optimizer, save_optimizer

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

#: name → constructor keyword arguments exercising the execution flags on the device
CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    "sgd-fused": ("SGD", {"lr": 0.1, "momentum": 0.9, "fused": True}),
    "adagrad-fused": ("Adagrad", {"lr": 0.1, "fused": True}),
    "rmsprop-capturable": ("RMSprop", {"lr": 0.01, "capturable": True, "foreach": True}),
    "rprop-capturable": ("Rprop", {"lr": 0.01, "capturable": True}),
    "nadam-capturable": ("NAdam", {"lr": 0.01, "capturable": True}),
    "asgd-capturable": ("ASGD", {"lr": 0.01, "capturable": True, "t0": 1.0}),
    "adamax-foreach": ("Adamax", {"lr": 0.01, "foreach": True}),
    "adafactor": ("Adafactor", {"lr": 0.01}),
    "lbfgs": ("LBFGS", {"lr": 0.5, "max_iter": 3, "history_size": 2}),
}


def _build(config: str, **override: Any) -> tuple[Net, torch.optim.Optimizer]:
    name, kwargs = CONFIGS[config]
    torch.manual_seed(0)
    model = Net().cuda()
    params = [p for p in model.parameters() if p.requires_grad]
    return model, getattr(torch.optim, name)(params, **{**kwargs, **override})


def _train(model: Net, opt: torch.optim.Optimizer, start: int, steps: int) -> None:
    for step in range(start, start + steps):
        g = torch.Generator().manual_seed(step)
        idx = torch.randint(0, 10, (8,), generator=g).cuda()
        target = torch.randint(0, 10, (8,), generator=g).cuda()

        def closure(idx: torch.Tensor = idx, target: torch.Tensor = target) -> torch.Tensor:
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(idx), target)
            loss.backward()
            return loss

        opt.step(closure)


def _devices(opt: torch.optim.Optimizer) -> list:
    return [
        (key, value.device.type)
        for state in opt.state.values()
        for key, value in state.items()
        if isinstance(value, torch.Tensor)
    ]


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_resume_on_cuda_is_bit_exact(config: str, tmp_path: Path) -> None:
    model, opt = _build(config)
    _train(model, opt, 0, 3)
    save_optimizer(opt, model, tmp_path / "o.safetensors")
    fresh_model, fresh = _build(config)
    fresh_model.load_state_dict(model.state_dict())
    load_optimizer(fresh, fresh_model, tmp_path / "o.safetensors")
    assert _devices(fresh) == _devices(opt)  # step where the optimizer keeps it
    assert_same_value(opt.state_dict(), fresh.state_dict(), "loaded")
    _train(model, opt, 3, 3)
    _train(fresh_model, fresh, 3, 3)
    for (name, p), (_, q) in zip(model.named_parameters(), fresh_model.named_parameters()):
        assert torch.equal(words(p), words(q)), name
    assert_same_value(opt.state_dict(), fresh.state_dict(), "resumed")


def test_cpu_run_file_loads_into_a_capturable_cuda_run(tmp_path: Path) -> None:
    torch.manual_seed(0)
    cpu_model = Net()
    cpu = torch.optim.RMSprop([p for p in cpu_model.parameters() if p.requires_grad], lr=0.01)
    cpu_model(torch.arange(8) % 10).sum().backward()
    cpu.step()
    save_optimizer(cpu, cpu_model, tmp_path / "o.safetensors")
    model, opt = _build("rmsprop-capturable")
    load_optimizer(opt, model, tmp_path / "o.safetensors")
    assert {device for _, device in _devices(opt)} == {"cuda"}
    assert opt.param_groups[0]["capturable"] is True  # the live run's flag
    _train(model, opt, 0, 1)  # a capturable step accepts the installed state
