"""Training recipes people run, for the resume tests: the models and the param groups their
libraries build, and a driver that trains, saves, resumes and compares bit for bit.

* Hugging Face ``transformers`` models built from tiny configs (nothing is downloaded): GPT-2
  with its tied embedding/output weights, BERT with a pooler that one loss never reaches, with
  the Trainer's param groups; and timm's ``ndim <= 1`` split
  (:mod:`tlckpt.testing.recipes`, which the benchmarks build their larger models from).
* A small language model (:class:`~runtime_support.TiedNet`-like: tied embedding, BatchNorm)
  for the rest: amsgrad, bfloat16 and float16 parameters, groups differing in betas/eps,
  ``maximize``, Adam with L2 weight decay.

Every step seeds torch's global generator from the step index (the run's random counter), so
dropout is the same in the uninterrupted run and in the resumed one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import GPT2LMHeadModel

from tlckpt.runtime import load_optimizer, load_state_bits, save_optimizer, save_state_bits
from tlckpt.testing.bitwise import bits, modules_equal, optimizer_states_equal
from tlckpt.testing.models import CUDA_IMPLS
from tlckpt.testing.recipes import (
    ParamGroups,
    TransformerSize,
    bert,
    gpt2,
    hf_param_groups,
    timm_param_groups,
)

VOCAB, SEQ, BATCH = 24, 6, 3
#: The transformers' tiny size.
TINY = TransformerSize(VOCAB, SEQ, hidden_size=8, num_hidden_layers=1, num_attention_heads=2)

transformers.logging.set_verbosity_error()  # its notes on tiny configs are not the test's


# ------------------------------------------------------------------------------ models


class ConvNet(torch.nn.Module):
    """Conv, BatchNorm, conv, BatchNorm, linear head: the layer kinds of a ResNet stem."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 4, 3, padding=1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(4)
        self.conv2 = torch.nn.Conv2d(4, 4, 3, padding=1)
        self.bn2 = torch.nn.BatchNorm2d(4)
        self.head = torch.nn.Linear(4, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.bn1(self.conv1(x)))
        h = torch.relu(self.bn2(self.conv2(h)))
        return self.head(h.mean(dim=(2, 3)))


class TinyLM(torch.nn.Module):
    """Embedding and output tied, LayerNorm, BatchNorm buffers, dropout."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, 8)
        self.norm = torch.nn.LayerNorm(8)
        self.mix = torch.nn.Linear(8, 8)
        self.bn = torch.nn.BatchNorm1d(8)
        self.head = torch.nn.Linear(8, VOCAB)
        self.head.weight = self.emb.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.norm(self.emb(tokens))
        h = torch.nn.functional.dropout(torch.tanh(self.mix(h)), 0.2, self.training)
        return self.head(self.bn(h.transpose(1, 2)).transpose(1, 2))


# ------------------------------------------------------------------------------ groups


def betas_eps_groups(model: torch.nn.Module) -> ParamGroups:
    """Embedding with its own betas, the rest with another eps (and lr)."""
    first = [model.emb.weight]
    rest = [p for n, p in model.named_parameters() if not n.startswith("emb.")]
    return [
        {"params": first, "betas": (0.85, 0.98)},
        {"params": rest, "eps": 1e-6, "lr": 0.02},
    ]


def one_group(model: torch.nn.Module) -> ParamGroups:
    return [{"params": list(model.parameters())}]


# ------------------------------------------------------------------------------ losses


def _device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def _tokens(step: int, device: torch.device) -> torch.Tensor:
    g = torch.Generator().manual_seed(10_000 + step)  # on the host: the same on every device
    return torch.randint(1, VOCAB, (BATCH, SEQ), generator=g).to(device)


def lm_loss(model: torch.nn.Module, step: int) -> torch.Tensor:
    """Next-token loss of a language model (``transformers`` or :class:`TinyLM`)."""
    tokens = _tokens(step, _device(model))
    if isinstance(model, GPT2LMHeadModel):
        return model(input_ids=tokens, labels=tokens).loss
    logits = model(tokens).float()
    return torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, VOCAB), tokens[:, 1:].reshape(-1)
    )


def token_loss(model: torch.nn.Module, step: int) -> torch.Tensor:
    """A loss on BERT's token states only: the pooler never gets a gradient."""
    hidden = model(input_ids=_tokens(step, _device(model))).last_hidden_state
    return (hidden.float() - 0.5).pow(2).mean()


def image_loss(model: torch.nn.Module, step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(20_000 + step)
    images = torch.randn(BATCH, 3, 6, 6, generator=g)
    labels = torch.randint(0, 5, (BATCH,), generator=g)
    device = _device(model)
    return torch.nn.functional.cross_entropy(model(images.to(device)), labels.to(device))


# ------------------------------------------------------------------------------ recipes


@dataclass(frozen=True)
class Recipe:
    """A model, its optimizer's param groups and options, and its loss.

    Attributes:
        name: the test id.
        model: builds the model (under a seeded generator).
        groups: the param groups of a model.
        loss: the loss of a training step.
        options: optimizer options besides the groups.
        cls: the optimizer class.
        no_state: names of trainable parameters that never get state.
        dtype: the parameters' dtype.
    """

    name: str
    model: Callable[[], torch.nn.Module]
    groups: Callable[[torch.nn.Module], ParamGroups]
    loss: Callable[[torch.nn.Module, int], torch.Tensor]
    options: dict[str, Any] = field(default_factory=dict)
    cls: type = torch.optim.AdamW
    no_state: tuple[str, ...] = ()

    def optimizer(self, model: torch.nn.Module, impl: str) -> torch.optim.Optimizer:
        return self.cls(self.groups(model), lr=1e-2, **self.options, **CUDA_IMPLS[impl])


def _tiny(dtype: torch.dtype) -> Callable[[], torch.nn.Module]:
    return lambda: TinyLM().to(dtype)


RECIPES = {
    r.name: r
    for r in (
        Recipe("hf_gpt2_two_groups", lambda: gpt2(TINY), hf_param_groups, lm_loss),
        Recipe(
            "hf_bert_unused_pooler",
            lambda: bert(TINY, intermediate_size=16),
            hf_param_groups,
            token_loss,
            no_state=("pooler.dense.weight", "pooler.dense.bias"),
        ),
        Recipe("timm_convnet_ndim_split", ConvNet, timm_param_groups, image_loss),
        Recipe("amsgrad", ConvNet, timm_param_groups, image_loss, {"amsgrad": True}),
        Recipe("bfloat16", _tiny(torch.bfloat16), hf_param_groups, lm_loss),
        Recipe("float16", _tiny(torch.float16), hf_param_groups, lm_loss, {"eps": 1e-4}),
        Recipe("betas_eps_groups", _tiny(torch.float32), betas_eps_groups, lm_loss),
        Recipe("maximize", _tiny(torch.float32), one_group, lm_loss, {"maximize": True}),
        Recipe(
            "adam_l2_decay",
            _tiny(torch.float64),
            one_group,
            lm_loss,
            {"weight_decay": 0.01},
            torch.optim.Adam,
        ),
    )
}

RESUME_K, RESUME_N = 2, 2


def _run(recipe: Recipe, model: torch.nn.Module, opt: Any, first: int, count: int) -> list:
    """Train steps ``first .. first + count - 1``, each seeded by its index; the losses."""
    model.train()
    losses = []
    for step in range(first, first + count):
        torch.manual_seed(1_000_003 + step)  # dropout: the same masks in every run
        opt.zero_grad(set_to_none=True)
        loss = recipe.loss(model, step)
        loss.backward()
        opt.step()
        losses.append(loss.detach().clone())
    return losses


def resume_recipe(
    recipe: Recipe, impl: str, counter: bool, folder: Path, device: str = "cpu"
) -> dict[str, Any]:
    """Train k steps, save model and optimizer, load into fresh objects initialised
    differently, train n more: assert everything (parameters, buffers, every optimizer
    tensor, losses) equals the uninterrupted k + n run, bit for bit.

    Args:
        recipe: what to train.
        impl: the optimizer's flavour, a key of ``CUDA_IMPLS`` (those of ``IMPLS`` on CPU).
        counter: whether the files carry the run's random counter.
        folder: where the files go.
        device: where the models (and so the optimizer's state) live.

    Returns:
        The optimizer file's version and family, and the live state for further checks.
    """
    import tlckpt

    k, n = RESUME_K, RESUME_N
    torch.manual_seed(0)
    reference = recipe.model().to(device)
    reference_opt = recipe.optimizer(reference, impl)
    reference_losses = _run(recipe, reference, reference_opt, 0, k + n)

    torch.manual_seed(0)
    model = recipe.model().to(device)
    opt = recipe.optimizer(model, impl)
    _run(recipe, model, opt, 0, k)
    save_state_bits(model, folder / "model.json")
    path = folder / "optimizer.tlckpt"
    version = save_optimizer(opt, model, path, random_counter=k if counter else None)
    del model, opt

    torch.manual_seed(1234)  # a different initialisation: the loads must overwrite all of it
    fresh = recipe.model().to(device)
    fresh_opt = recipe.optimizer(fresh, impl)
    assert modules_equal(reference, fresh), "the fresh model should start out different"
    load_state_bits(fresh, folder / "model.json")
    restored = load_optimizer(fresh_opt, fresh, path, restore_random_counter=counter)
    assert restored == (k if counter else None)
    first = restored if counter else k
    losses = _run(recipe, fresh, fresh_opt, first, n)

    assert modules_equal(reference, fresh) == []
    assert optimizer_states_equal(reference_opt, fresh_opt) == []
    assert len(fresh_opt.state) == len(reference_opt.state)
    assert all(torch.equal(bits(a), bits(b)) for a, b in zip(reference_losses[k:], losses))
    return {
        "version": version,
        "family": tlckpt.inspect(path)["family"],
        "model": fresh,
        "optimizer": fresh_opt,
        "path": path,
    }
