"""The recipes people run resume bit for bit, in tlckpt's own optimizer family.

Matrix: each recipe of :mod:`recipes` (Hugging Face Trainer-style groups on GPT-2 with tied
embeddings, BERT with a pooler that never gets a gradient, timm's ``ndim <= 1`` split on a
conv net with BatchNorm, amsgrad, bfloat16 and float16 parameters, groups differing in betas
and eps, ``maximize``, Adam with L2 weight decay), with and without a random counter, in each
of the optimizer's flavours (per-tensor loop, foreach, fused). Each trains k steps, saves,
loads into a fresh model and optimizer initialised differently, trains n more and must equal
the uninterrupted run in every parameter, buffer, optimizer tensor (``step``,
``max_exp_avg_sq``, dtypes and devices included) and loss.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from recipes import RECIPES, resume_recipe

from tlckpt.codec import read_optimizer_state
from tlckpt.runtime import schema_of

FLAVOURS = ["foreach_false", "foreach_true", "fused"]


@pytest.mark.parametrize("impl", FLAVOURS)
@pytest.mark.parametrize("counter", [False, True], ids=["no_counter", "counter"])
@pytest.mark.parametrize("name", sorted(RECIPES))
def test_recipe_resumes_bit_exactly(name: str, counter: bool, impl: str, tmp_path: Path):
    recipe = RECIPES[name]
    result = resume_recipe(recipe, impl, counter, tmp_path)
    assert (result["family"], result["version"]) == ("tlckpt_optimizer", 1)
    model, opt = result["model"], result["optimizer"]
    names = dict(model.named_parameters())
    for missing in recipe.no_state:
        assert names[missing] not in opt.state  # as torch has it: never a gradient
    amsgrad = recipe.options.get("amsgrad", False)
    for state in opt.state.values():
        assert ("max_exp_avg_sq" in state) == amsgrad


def test_the_files_say_what_each_recipe_has(tmp_path: Path):
    """The file of a two-group recipe: the groups, each slot's group, the dtypes."""
    recipe = RECIPES["hf_bert_unused_pooler"]
    result = resume_recipe(recipe, "foreach_false", False, tmp_path)
    model = result["model"]
    ckpt = read_optimizer_state(result["path"], schema_of(model))
    assert [g.weight_decay for g in ckpt.groups] == [0.01, 0.0]
    names = [n for n, _ in model.named_parameters(remove_duplicate=False)]
    with_state = {names[i] for i in ckpt.entries}
    assert with_state == set(names) - set(recipe.no_state)
    assert {e.dtype for e in ckpt.entries.values()} == {"float32"}
    decay = {n for n, i in zip(names, ckpt.slot_groups) if i == 0}
    assert "encoder.layer.0.attention.self.query.weight" in decay
    assert "encoder.layer.0.attention.self.query.bias" not in decay


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_moments_keep_their_dtype(dtype: torch.dtype, tmp_path: Path):
    result = resume_recipe(RECIPES[str(dtype).removeprefix("torch.")], "fused", False, tmp_path)
    ckpt = read_optimizer_state(result["path"], schema_of(result["model"]))
    assert {e.dtype for e in ckpt.entries.values()} == {str(dtype).removeprefix("torch.")}
    for state in result["optimizer"].state.values():
        assert state["exp_avg"].dtype == dtype and state["step"].dtype == torch.float32
