"""Models and param groups of the training recipes people run, for tests and benchmarks.

* Hugging Face ``transformers`` models built from a config of a given size (nothing is
  downloaded): GPT-2 with its tied embedding/output weights, BERT with its pooler. Their param
  groups are the Trainer's own: ``Trainer.get_decay_parameter_names`` (weight decay for
  weights, 0.0 for biases and LayerNorm), as ``Trainer.create_optimizer`` builds them.
* timm's split: :func:`timm_param_groups` mirrors ``timm.optim._param_groups
  .param_groups_weight_decay`` (what ``create_optimizer_v2(weight_decay=...)`` uses): no decay
  for ``ndim <= 1`` and ``.bias``, the no-decay group first. timm needs torchvision, which does
  not install beside this torch, so the rule is written out here.

Needs ``torch`` and ``transformers`` (pinned in ``requirements-dev.txt``), which are imported
when a model or the Trainer's groups are asked for.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["ParamGroups", "TransformerSize", "gpt2", "bert", "hf_param_groups", "timm_param_groups"]

ParamGroups = list[dict[str, Any]]


@dataclass(frozen=True)
class TransformerSize:
    """A transformer's size, in the config names ``transformers`` models share (GPT-2's config
    takes them for its own ``n_embd``, ``n_layer``, ... through its ``attribute_map``)."""

    vocab_size: int
    max_position_embeddings: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int


def gpt2(size: TransformerSize, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """GPT-2 of ``size``: tied ``wte``/``lm_head``, dropout on."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(**dataclasses.asdict(size), bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(config).to(dtype)


def bert(
    size: TransformerSize, intermediate_size: int, dtype: torch.dtype = torch.float32
) -> torch.nn.Module:
    """BERT of ``size`` and feed-forward width ``intermediate_size``, with its pooler (which a
    loss on the tokens never reaches)."""
    from transformers import BertConfig, BertModel

    config = BertConfig(
        **dataclasses.asdict(size), intermediate_size=intermediate_size, pad_token_id=0
    )
    return BertModel(config, add_pooling_layer=True).to(dtype)


def hf_param_groups(model: torch.nn.Module, weight_decay: float = 0.01) -> ParamGroups:
    """``transformers.Trainer.create_optimizer``'s two groups, from the Trainer's own rule."""
    from transformers.trainer import Trainer

    decay = set(Trainer.get_decay_parameter_names(None, model))
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    return [
        {"params": [p for n, p in named if n in decay], "weight_decay": weight_decay},
        {"params": [p for n, p in named if n not in decay], "weight_decay": 0.0},
    ]


def timm_param_groups(model: torch.nn.Module, weight_decay: float = 0.05) -> ParamGroups:
    """``timm.optim._param_groups.param_groups_weight_decay``: no decay for ``ndim <= 1``
    and biases (the no-decay group first, as timm builds it)."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.ndim <= 1 or name.endswith(".bias") else decay).append(p)
    return [
        {"params": no_decay, "weight_decay": 0.0},
        {"params": decay, "weight_decay": weight_decay},
    ]
