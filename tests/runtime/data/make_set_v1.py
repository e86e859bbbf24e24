"""Writes ``set_v1/``: a version-1 checkpoint set (float32 model, AdamW, StepLR), as the
library wrote sets before version 2 existed (it was run once with the tlckpt of commit
72ff420 on ``PYTHONPATH``). ``tests/runtime/test_multi_sets.py`` restores it, and checks that
today's writer writes the very same bytes for the same objects.

Usage: ``python tests/runtime/data/make_set_v1.py FOLDER``
"""

from __future__ import annotations

import random
import sys

import numpy as np
import torch


def build(seed: int):
    """The model, optimizer and scheduler the set was saved from (before training)."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1, 0.5)
    return model, opt, sched


def train(model, opt, sched, steps: int) -> None:
    """``steps`` steps on data drawn from fixed seeds."""
    for i in range(steps):
        g = torch.Generator().manual_seed(i)
        loss = model(torch.randn(5, 3, generator=g)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()


def seed_globals() -> None:
    """The global random states the set records."""
    torch.manual_seed(7)
    np.random.seed(7)
    random.seed(7)


if __name__ == "__main__":
    from tlckpt.runtime.sets.checkpoint_sets import save_checkpoint

    model, opt, sched = build(0)
    train(model, opt, sched, 2)
    seed_globals()
    save_checkpoint(
        sys.argv[1], model=model, optimizer=opt, scheduler=sched, step=2, extra={"note": "v1"}
    )
