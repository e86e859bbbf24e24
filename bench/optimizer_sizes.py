"""Optimizer files of real recipes: tlckpt's size and time against ``torch.save``.

Run from the repository root::

    .venv/bin/python -m bench.optimizer_sizes

For each recipe (Hugging Face Trainer-style two-group AdamW on GPT-2, the same with amsgrad
and in bfloat16, BERT whose pooler never gets a gradient, timm's ``ndim <= 1`` split on a
ResNet-like conv net with BatchNorm, and one single-group AdamW that TorchLean's ``TLADAMF``
holds), a model is trained two steps, and its optimizer saved with ``tlckpt.save_optimizer``
and with ``torch.save(optimizer.state_dict())``. Printed: the family and version written, both
file sizes, tlckpt's bytes over ``torch.save``'s, and the median save and load times of five
repetitions. Needs ``transformers`` (pinned in ``requirements-dev.txt``); writes nothing but
scratch files in a temporary folder.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import tlckpt
from tlckpt.testing.recipes import TransformerSize, bert, gpt2, hf_param_groups, timm_param_groups

REPS = 5
#: The transformers' size: small, but with payloads that dominate their metadata.
SMALL = TransformerSize(8192, 128, hidden_size=256, num_hidden_layers=4, num_attention_heads=4)


def _gpt2(dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    return gpt2(SMALL, dtype)


def _bert() -> torch.nn.Module:
    return bert(SMALL, intermediate_size=1024)


def _convnet() -> torch.nn.Module:
    layers: list[torch.nn.Module] = []
    width = 3
    for out in (32, 64, 64, 128, 128, 256):
        layers += [
            torch.nn.Conv2d(width, out, 3, padding=1, bias=False),
            torch.nn.BatchNorm2d(out),
            torch.nn.ReLU(),
        ]
        width = out
    return torch.nn.Sequential(
        *layers, torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(width, 100)
    )


def _tokens() -> torch.Tensor:
    return torch.randint(0, 8192, (2, 64), generator=torch.Generator().manual_seed(0))


def _lm_loss(model: torch.nn.Module) -> torch.Tensor:
    tokens = _tokens()
    return model(input_ids=tokens, labels=tokens).loss


def _bert_loss(model: torch.nn.Module) -> torch.Tensor:
    return model(input_ids=_tokens()).last_hidden_state.float().pow(2).mean()


def _image_loss(model: torch.nn.Module) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return model(torch.randn(4, 3, 32, 32, generator=g)).logsumexp(1).mean()


Recipe = tuple[str, Callable[[], torch.nn.Module], Callable[[torch.nn.Module], Any], dict, Callable]
RECIPES: list[Recipe] = [
    ("GPT-2, HF two groups", _gpt2, hf_param_groups, {}, _lm_loss),
    ("GPT-2, HF two groups, amsgrad", _gpt2, hf_param_groups, {"amsgrad": True}, _lm_loss),
    ("GPT-2 bfloat16, HF two groups", lambda: _gpt2(torch.bfloat16), hf_param_groups, {}, _lm_loss),
    ("BERT, unused pooler", _bert, hf_param_groups, {}, _bert_loss),
    ("conv net, timm ndim<=1 split", _convnet, timm_param_groups, {}, _image_loss),
    (
        "GPT-2, one group (TLADAMF)",
        _gpt2,
        lambda m: m.parameters(),
        {"weight_decay": 0.01},
        _lm_loss,
    ),
]


def _median_time(action: Callable[[], Any]) -> float:
    times = []
    for _ in range(REPS):
        start = time.perf_counter()
        action()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _row(recipe: Recipe, folder: Path) -> str:
    """One recipe trained two steps, saved both ways; its line of the table."""
    name, build, groups, options, loss = recipe
    torch.manual_seed(0)
    model = build()
    opt = torch.optim.AdamW(groups(model), lr=1e-3, **options)
    for _ in range(2):
        opt.zero_grad()
        loss(model).backward()
        opt.step()
    ours, theirs = folder / "opt.tlckpt", folder / "opt.pt"
    version = tlckpt.save_optimizer(opt, model, ours)
    family = tlckpt.inspect(ours)["magic"]
    torch.save(opt.state_dict(), theirs)
    times = [
        _median_time(lambda: tlckpt.save_optimizer(opt, model, ours)),
        _median_time(lambda: torch.save(opt.state_dict(), theirs)),
        _median_time(lambda: tlckpt.load_optimizer(opt, model, ours)),
        _median_time(lambda: opt.load_state_dict(torch.load(theirs, weights_only=True))),
    ]
    a, b = ours.stat().st_size, theirs.stat().st_size
    ms = "".join(f"{t * 1e3:>{w}.1f}" for t, w in zip(times, (9, 10, 9, 10)))
    return f"{name:<32}{f'{family} v{version}':>11}{a:>12,}{b:>12,}{a / b:>8.3f}{ms}"


def main() -> None:
    from transformers import logging

    logging.set_verbosity_error()
    torch.set_num_threads(2)
    header = f"{'recipe':<32}{'file':>11}{'tlckpt':>12}{'torch.save':>12}{'ratio':>8}"
    print(header + f"{'save ms':>9}{'t.save ms':>10}{'load ms':>9}{'t.load ms':>10}")
    with tempfile.TemporaryDirectory(prefix="tlckpt-optimizer-sizes-") as tmp:
        for recipe in RECIPES:
            print(_row(recipe, Path(tmp)), flush=True)


if __name__ == "__main__":
    main()
