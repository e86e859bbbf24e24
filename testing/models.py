"""A small model and its deterministic training, shared by the runtime, sharded and hostile
tests and the fuzz campaigns (needs torch).

:class:`TiedNet` has what makes checkpoints hard: an embedding tied to the output projection
(one tensor, two slots), a frozen layer (state without optimizer entries), BatchNorm buffers
(an int64 counter among them) and, optionally, dropout driven by the run's random counter.
Its dims (7 and 4 rows) shard unevenly over 2 and 3 ranks.

* :func:`batch` / :func:`train` — step ``k``'s batch is a function of ``k`` alone, and ``k``
  is the random counter, so an interrupted run can continue exactly;
* :func:`stepped_linear` / :func:`quadratic_steps` — a small linear model with an AdamW step
  taken (state to save), and steps on a quadratic loss of seeded random inputs;
* :func:`make_adam` — Adam/AdamW with non-default hyperparameters in any of torch's
  implementations (:data:`IMPLS`; :data:`CUDA_IMPLS` adds the capturable ones);
* :func:`default_dtype` — run a block with a given torch default dtype, restored after.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

__all__ = [
    "VOCAB",
    "WIDTH",
    "BATCH",
    "TiedNet",
    "batch",
    "train",
    "stepped_linear",
    "quadratic_steps",
    "IMPLS",
    "CUDA_IMPLS",
    "make_adam",
    "default_dtype",
    "sharded_linears",
]

VOCAB, WIDTH, BATCH = 7, 4, 6


class TiedNet(torch.nn.Module):
    """Embedding ↔ output projection tied, a frozen layer, BatchNorm buffers, dropout.

    Dropout masks come from a generator seeded by the caller's random counter, so a run
    that restores the counter draws the same masks as one that was never interrupted.

    Args:
        dtype: The floating dtype of every parameter and floating buffer.
        tied: Whether the output projection shares the embedding's weight.
        dropout: Whether training applies counter-seeded dropout.
    """

    def __init__(
        self, dtype: torch.dtype = torch.float32, tied: bool = True, dropout: bool = False
    ):
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, WIDTH)
        self.norm = torch.nn.BatchNorm1d(WIDTH)
        self.frozen = torch.nn.Linear(WIDTH, WIDTH)
        self.frozen.requires_grad_(False)
        self.mix = torch.nn.Linear(WIDTH, WIDTH)
        self.head = torch.nn.Linear(WIDTH, VOCAB)
        if tied:
            self.head.weight = self.emb.weight
        self.dropout = dropout
        self.to(dtype)

    def forward(self, tokens: torch.Tensor, counter: int = 0) -> torch.Tensor:
        h = self.norm(self.emb(tokens))
        h = torch.tanh(self.mix(self.frozen(h)))
        if self.dropout and self.training:
            g = torch.Generator().manual_seed(1_000_003 + counter)
            keep = torch.rand(h.shape, generator=g) >= 0.25  # drawn on the CPU: any device
            h = h * keep.to(device=h.device, dtype=h.dtype) / 0.75
        return self.head(h)


def batch(step: int, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """The deterministic batch of a training step (the same in every run).

    Args:
        step: The training step (and random counter).
        device: Where the batch goes.

    Returns:
        Tokens and targets, ``BATCH`` of each.
    """
    g = torch.Generator().manual_seed(10_000 + step)
    x = torch.randint(0, VOCAB, (BATCH,), generator=g)
    y = torch.randint(0, VOCAB, (BATCH,), generator=g)
    return x.to(device), y.to(device)


def train(
    model: TiedNet, opt: torch.optim.Optimizer, first: int, count: int, device: Any = "cpu"
) -> int:
    """Train steps ``first .. first+count-1``; the step index is also the random counter.

    Args:
        model: The model (put in training mode).
        opt: Its optimizer.
        first: The first step's index.
        count: How many steps.
        device: Where the batches go.

    Returns:
        The random counter after the last step.
    """
    model.train()
    for step in range(first, first + count):
        x, y = batch(step, device)
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(x, counter=step), y)
        loss.backward()
        opt.step()
    return first + count


def stepped_linear(
    in_features: int = 4, out_features: int = 3
) -> tuple[torch.nn.Linear, torch.optim.AdamW]:
    """A seeded ``Linear`` and its AdamW optimizer after one step: a model and an optimizer
    with state, for tests that save them.

    Returns:
        The model and the optimizer.
    """
    torch.manual_seed(0)
    model = torch.nn.Linear(in_features, out_features)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, in_features)).sum().backward()
    opt.step()
    return model, opt


def quadratic_steps(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    steps: int,
    *,
    scheduler: Any = None,
    rows: int = 5,
    seed: int = 0,
) -> list[torch.Tensor]:
    """Take ``steps`` optimizer (and scheduler) steps on the mean square of the model's
    output for seeded random inputs of 4 features, ``rows`` per step.

    Returns:
        Each step's loss, detached.
    """
    g = torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(steps):
        loss = model(torch.randn(rows, 4, generator=g)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        losses.append(loss.detach())
    return losses


#: torch's Adam implementations, by name: the options that select each.
IMPLS: dict[str, dict[str, Any]] = {
    "default": {},
    "foreach_false": {"foreach": False},
    "foreach_true": {"foreach": True},
    "fused": {"fused": True},
}
#: Settings that exist on CUDA only (capturable keeps ``step`` on the device).
CUDA_IMPLS: dict[str, dict[str, Any]] = {
    **IMPLS,
    "capturable": {"capturable": True},
    "capturable_foreach_false": {"capturable": True, "foreach": False},
}


def make_adam(
    kind: str, params: Any, impl: str = "default", lr: float = 0.05, **extra: Any
) -> torch.optim.Optimizer:
    """Adam or AdamW with non-default betas/eps so config mismatches would show.

    Args:
        kind: ``"adam"`` or ``"adamw"`` (which also gets a weight decay).
        params: What the optimizer optimizes.
        impl: A key of :data:`CUDA_IMPLS`.
        lr: The learning rate.
        **extra: Further options, overriding the defaults.

    Returns:
        The optimizer.
    """
    options: dict[str, Any] = {"lr": lr, "betas": (0.8, 0.95), "eps": 1e-7, **CUDA_IMPLS[impl]}
    if kind == "adamw":
        options["weight_decay"] = 0.03
        options.update(extra)
        return torch.optim.AdamW(params, **options)
    options.update(extra)
    return torch.optim.Adam(params, **options)


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Run the block with ``dtype`` as torch's default dtype; the previous one is restored
    after, also when the block raises.

    Args:
        dtype: The default dtype inside the block.
    """
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def sharded_linears(
    mesh: Any, width: int, layers: int
) -> tuple[torch.nn.Sequential, torch.optim.Optimizer]:
    """A large model for the sharded memory and speed figures: ``layers`` square float32
    ``Linear`` weights of ``width`` x ``width`` (seed 0), each its own FSDP2 group on
    ``mesh``, and an AdamW trained one step, so every parameter has its moments. Every rank
    of ``mesh``'s group calls it.

    Args:
        mesh: the device mesh to shard over.
        width: each weight's rows and columns.
        layers: how many weights.

    Returns:
        The model and its optimizer.
    """
    from torch.distributed.fsdp import fully_shard  # deferred: only sharded runs need it

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False) for _ in range(layers)])
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, width)).sum().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return model, opt
