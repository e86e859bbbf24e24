"""The workloads' live state, at full and at ``--quick`` size.

* ``big1`` / ``big48`` — 512 MiB of float32 state in one tensor, and in 48 tensors;
* ``small`` — 20,000 float32 tensors of 64 elements (per-tensor overhead);
* ``gpt2`` — GPT-2 small (124M parameters, 148 tensors, the LM head tied to the token
  embedding) built from its configuration by ``transformers``, and an AdamW that took one
  step (moments of every parameter), for the optimizer workload;
* ``json`` — 4 Mi float32 values as exact-bits JSON words;
* ``inspect`` — files of 10^6 empty records, alike and of changing shapes;
* ``bf16`` — 32 bf16 ``Linear(2048, 2048)`` (134M parameters, 256 MiB; quick: 8 x 1024):
  the safetensors layout standalone and in a checkpoint set (:mod:`bench.bf16`);
* ``sharded`` — an FSDP2 model of ``Linear(1024, 1024)`` layers (64 MiB of float32
  parameters; quick: 8) and its AdamW, at worlds 2 and 3, against DCP (:mod:`bench.sharded`).

Every model-state workload is an ``nn.Module``, so each library is driven as users drive it:
``state_dict`` / ``load_state_dict`` for the baselines, the module itself for tlckpt.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

__all__ = ["SIZES", "Size", "state_model", "gpt2", "gpt2_optimizer", "json_values"]


@dataclass(frozen=True)
class Size:
    """Dimensions of every workload for one run mode."""

    big_bytes: int
    small_count: int
    small_shape: tuple[int, ...]
    gpt2: dict
    json_shape: tuple[int, ...]
    inspect_records: int
    #: The ``bf16`` group's model: (layers, width) of bf16 ``Linear(width, width)``.
    bf16: tuple[int, int] = (32, 2048)
    #: The ``sharded`` group's MiB of float32 parameters (``python -m bench --sharded-mib``).
    sharded_mib: int = 64

    def as_dict(self) -> dict:
        return asdict(self)


SIZES = {
    "full": Size(512 << 20, 20_000, (64,), {}, (4096, 1024), 1_000_000),
    "quick": Size(
        32 << 20,
        2_000,
        (64,),
        {"n_layer": 2, "n_embd": 128, "n_head": 2, "vocab_size": 1000, "n_positions": 128},
        (400, 1024),
        20_000,
        (8, 1024),
        8,
    ),
}


class StateModel(torch.nn.Module):
    """A module whose state is exactly the given float32 parameters, in order."""

    def __init__(self, tensors: list[torch.Tensor]):
        super().__init__()
        self.params = torch.nn.ParameterList(torch.nn.Parameter(t) for t in tensors)


def state_model(count: int, total_elements: int, seed: int = 0) -> StateModel:
    """``count`` random float32 parameters of ``total_elements // count`` elements each."""
    gen = torch.Generator().manual_seed(seed)
    per = total_elements // count
    return StateModel([torch.randn(per, generator=gen) for _ in range(count)])


def small_model(size: Size) -> StateModel:
    gen = torch.Generator().manual_seed(1)
    return StateModel(
        [torch.randn(size.small_shape, generator=gen) for _ in range(size.small_count)]
    )


def gpt2(size: Size) -> torch.nn.Module:
    """GPT-2 small (or the quick run's tiny GPT-2) from its configuration, random weights."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(2)
    return GPT2LMHeadModel(GPT2Config(**size.gpt2)).eval()


def gpt2_optimizer(model: torch.nn.Module) -> torch.optim.AdamW:
    """An AdamW over ``model`` that took one step: moments of every parameter exist.

    Gradients are random, then dropped after the step (the live state is parameters and
    moments).
    """
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    gen = torch.Generator().manual_seed(3)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=gen, dtype=p.dtype)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return opt


def json_values(size: Size) -> torch.Tensor:
    """One float32 tensor of random normal values (full words, every bit varies)."""
    return torch.randn(size.json_shape, generator=torch.Generator().manual_seed(4))
