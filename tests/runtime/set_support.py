"""The run the checkpoint-set tests save and resume.

AdamW with two param groups (their own learning rates), a warmup scheduler, dropout drawing
from torch's global generator, numpy and ``random`` draws, and a random counter.
"""

from __future__ import annotations

import random

import numpy as np
import torch


class Net(torch.nn.Module):
    def __init__(self, order: str = "ab") -> None:
        super().__init__()
        layers = {"a": torch.nn.Linear(6, 6), "b": torch.nn.Linear(6, 6)}
        for name in order:  # the registration order decides the state's names' order
            setattr(self, name, layers[name])
        self.drop = torch.nn.Dropout(0.25)
        self.head = torch.nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.drop(torch.tanh(self.b(torch.tanh(self.a(x))))))


def build(seed: int, order: str = "ab", decay_split: bool = False):
    """Two groups differing in lr (a TorchLean file), or with ``decay_split`` also in weight
    decay, as Hugging Face's Trainer splits them (tlckpt's own optimizer family)."""
    torch.manual_seed(seed)
    model = Net(order)
    groups = [
        {"params": list(model.a.parameters()) + list(model.head.parameters()), "lr": 1e-2},
        {"params": list(model.b.parameters()), "lr": 3e-3},
    ]
    if decay_split:
        groups[1]["weight_decay"] = 0.0
    optimizer = torch.optim.AdamW(groups, weight_decay=0.01)
    warmup = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 4))
    return model, optimizer, warmup


def train(model, optimizer, scheduler, counter: int, steps: int) -> tuple[int, list]:
    """``steps`` steps; the data come from the counter, dropout from the global generator,
    a noise scale from numpy's and ``random``'s global states."""
    losses = []
    for _ in range(steps):
        g = torch.Generator().manual_seed(counter)
        x = torch.randn(5, 6, generator=g)
        scale = float(np.random.rand()) + random.random()
        counter += 1
        loss = (model(x) * scale).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        losses.append(loss.detach().clone())
    return counter, losses


def seed_all(seed: int) -> None:
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)


def assert_same(model_a, opt_a, sch_a, model_b, opt_b, sch_b) -> None:
    for (na, a), (nb, b) in zip(model_a.state_dict().items(), model_b.state_dict().items()):
        assert na == nb and torch.equal(a, b), na
    for ga, gb in zip(opt_a.param_groups, opt_b.param_groups):
        assert {k: v for k, v in ga.items() if k != "params"} == {
            k: v for k, v in gb.items() if k != "params"
        }
        for p, q in zip(ga["params"], gb["params"]):
            sa, sb = opt_a.state[p], opt_b.state[q]
            assert sorted(sa) == sorted(sb)
            for key in sa:
                assert torch.equal(sa[key], sb[key]), key
    assert sch_a.state_dict() == sch_b.state_dict()
