"""The four workloads of issue 5, at full and at ``--quick`` size, and their live state.

* W1 — 64 float32 tensors of 4 Mi elements each (1 GiB of model state);
* W2 — 20,000 float32 tensors of 64 elements (per-tensor overhead);
* W3 — AdamW moments for W1's parameters (2 GiB of optimizer state), made by one step;
* W4 — 4 Mi float32 values as exact-bits JSON words.

The live state is a real ``nn.Module`` (parameters in a ``ParameterList``) so that every
library is driven the way users drive it: ``state_dict``/``load_state_dict`` for the
baselines, the module itself for tlckpt.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

__all__ = ["SIZES", "Size", "adam_state", "bits_values", "state_model"]


@dataclass(frozen=True)
class Size:
    """Dimensions of every workload for one run mode."""

    w1_count: int
    w1_shape: tuple[int, ...]
    w2_count: int
    w2_shape: tuple[int, ...]
    w4_shape: tuple[int, ...]

    def as_dict(self) -> dict:
        return asdict(self)


SIZES = {
    # W1: 64 x 4 Mi x 4 B = 1 GiB; W3 = 2 x W1 = 2 GiB; W4: 4 Mi words.
    "full": Size(64, (2048, 2048), 20_000, (64,), (4096, 1024)),
    # W1: 64 x 256 Ki x 4 B = 64 MiB; W3 = 128 MiB; W4: 400 Ki words.
    "quick": Size(64, (512, 512), 2_000, (64,), (400, 1024)),
}


class StateModel(torch.nn.Module):
    """A module whose state is exactly the given float32 parameters, in order."""

    def __init__(self, tensors: list[torch.Tensor]):
        super().__init__()
        self.params = torch.nn.ParameterList(torch.nn.Parameter(t) for t in tensors)


def _random(count: int, shape: tuple[int, ...], seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=gen, dtype=torch.float32) for _ in range(count)]


def state_model(count: int, shape: tuple[int, ...], seed: int = 0) -> StateModel:
    """W1 / W2: a module of ``count`` random float32 parameters of ``shape``."""
    return StateModel(_random(count, shape, seed))


def adam_state(size: Size) -> tuple[StateModel, torch.optim.AdamW]:
    """W3: W1's parameters and an AdamW that took one step (moments of every parameter).

    Gradients are dropped after the step, so the live state is parameters + moments.
    """
    model = state_model(size.w1_count, size.w1_shape)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    gen = torch.Generator().manual_seed(1)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=gen, dtype=p.dtype)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return model, opt


def bits_values(size: Size) -> torch.Tensor:
    """W4: one float32 tensor of random normal values (full words, every bit varies)."""
    return _random(1, size.w4_shape, seed=2)[0]
