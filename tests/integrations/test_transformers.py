"""``TlckptTrainer``: the real Hugging Face ``Trainer`` (CPU, no network) on a tiny GPT-2 built
from its config, checkpointing into tlckpt sets.

Run A trains 8 steps straight (a set every 4); run B is stopped after step 4 and a fresh
Trainer resumes it to 8: weights and AdamW moments bit-identical to A's (dropout on, so the
random states must come back too; a linear warm-up schedule and weight decay). A flipped byte
in the newest set makes the resume take the one before, with a warning; ``save_total_limit``
rotates (by step); the sets verify, and nothing is pickled on the way (tripwires on every pickle and
``torch.save``/``torch.load`` entry point, and an audit hook for unpickling).
"""

from __future__ import annotations

import contextlib
import pickle
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("accelerate")  # the Trainer's own requirement
transformers = pytest.importorskip("transformers")

from tlckpt import (  # noqa: E402
    IntegrityError,
    SkippedCheckpointWarning,
    load_checkpoint,
    verify_checkpoint,
)
from tlckpt.integrations.transformers import (  # noqa: E402
    TlckptTrainer,
    latest_verified_checkpoint,
)

STEPS, EVERY = 8, 4


class TinyData(torch.utils.data.Dataset):
    """16 sequences of 16 tokens, the same every time."""

    def __init__(self) -> None:
        self.tokens = torch.randint(0, 100, (16, 16), generator=torch.Generator().manual_seed(1))

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.tokens[i], "labels": self.tokens[i]}


class StopAt(transformers.TrainerCallback):
    """Ends training after ``step`` (its checkpoint saved first): an interrupted run."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if state.global_step == self.step:
            control.should_training_stop = True
        return control


def make_trainer(
    output_dir: Path, stop_at: int | None = None, eval_dataset: Any = None, **arguments: Any
) -> Any:
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=32)
    model = transformers.GPT2LMHeadModel(config)  # dropout 0.1 (GPT-2's default)
    args = transformers.TrainingArguments(
        str(output_dir),
        max_steps=STEPS,
        save_steps=EVERY,
        weight_decay=0.01,
        warmup_steps=2,
        lr_scheduler_type="linear",
        per_device_train_batch_size=2,
        seed=0,
        report_to=[],
        use_cpu=True,
        logging_steps=100,
        disable_tqdm=True,
        **arguments,
    )
    trainer = TlckptTrainer(
        model=model, args=args, train_dataset=TinyData(), eval_dataset=eval_dataset
    )
    if stop_at is not None:
        trainer.add_callback(StopAt(stop_at))
    return trainer


def assert_same_training_state(a: Any, b: Any) -> None:
    """Weights, AdamW moments and step counts, and the scheduler: bit for bit."""
    wa, wb = a.model.state_dict(), b.model.state_dict()
    assert wa.keys() == wb.keys()
    for name in wa:
        assert torch.equal(wa[name], wb[name]), name
    oa, ob = a.optimizer.optimizer.state_dict(), b.optimizer.optimizer.state_dict()
    assert oa["state"].keys() == ob["state"].keys() and oa["state"]
    for index, moments in oa["state"].items():
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(moments[key], ob["state"][index][key]), (index, key)
    assert oa["param_groups"] == ob["param_groups"]
    assert a.lr_scheduler.state_dict() == b.lr_scheduler.state_dict()
    assert a.state.global_step == b.state.global_step == STEPS


# --------------------------------------------------------------------------- no pickle


@contextlib.contextmanager
def no_pickle() -> Iterator[list[str]]:
    """Every pickle entry point and ``torch.save``/``torch.load`` replaced by a tripwire that
    records the call and refuses it; unpickling a class also trips an audit hook."""
    tripped: list[str] = []
    patched = [(pickle, n) for n in ("dump", "dumps", "load", "loads", "Pickler", "Unpickler")]
    patched += [(torch, "save"), (torch, "load")]
    saved = [(owner, name, getattr(owner, name)) for owner, name in patched]

    def wire(label: str) -> Any:
        def tripwire(*args: Any, **kwargs: Any) -> Any:
            tripped.append(label)
            raise AssertionError(f"{label} called")

        return tripwire

    def audit(event: str, args: Any) -> None:
        if watching and event == "pickle.find_class":
            tripped.append(event)

    watching = True
    sys.addaudithook(audit)  # cannot be removed: it goes quiet below
    for owner, name, _ in saved:
        setattr(owner, name, wire(f"{owner.__name__}.{name}"))
    try:
        yield tripped
    finally:
        watching = False
        for owner, name, original in saved:
            setattr(owner, name, original)


# --------------------------------------------------------------------------- the runs


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("trainer")
    straight = make_trainer(root / "a")
    straight.train()
    with no_pickle() as tripped:
        interrupted = make_trainer(root / "b", stop_at=EVERY)
        interrupted.train()
        assert interrupted.state.global_step == EVERY
        folders_after_stop = sorted(p.name for p in (root / "b").iterdir())
        # save_total_limit=1: the resumed run's rotation leaves its newest set only.
        resumed = make_trainer(root / "b", save_total_limit=1)
        resumed.train(resume_from_checkpoint=True)
    return {
        "root": root,
        "straight": straight,
        "resumed": resumed,
        "folders_after_stop": folders_after_stop,
        "tripped": list(tripped),
    }


def test_a_run_stopped_at_4_and_resumed_to_8_is_bit_identical(runs: dict[str, Any]) -> None:
    assert runs["folders_after_stop"] == ["checkpoint-4"]
    assert_same_training_state(runs["straight"], runs["resumed"])


def test_nothing_is_pickled_and_every_checkpoint_is_a_set_that_verifies(
    runs: dict[str, Any],
) -> None:
    assert runs["tripped"] == []
    for run, names in (("a", ["checkpoint-4", "checkpoint-8"]), ("b", ["checkpoint-8"])):
        folders = sorted((runs["root"] / run).glob("checkpoint-*"))
        assert [f.name for f in folders] == names
        for folder in folders:
            manifest = verify_checkpoint(folder)
            assert manifest.step == int(folder.name.split("-")[1])
            assert sorted(p.name for p in folder.iterdir()) == [
                "manifest.json",
                "model.safetensors",
                "optimizer.tladam",
                "trainer_state.json",
                "training_state.json",
            ]
    assert latest_verified_checkpoint(runs["root"] / "a") == str(runs["root"] / "a/checkpoint-8")


def test_resume_from_a_set_path(runs: dict[str, Any], tmp_path: Path) -> None:
    trainer = make_trainer(tmp_path)
    trainer.train(resume_from_checkpoint=str(runs["root"] / "a" / "checkpoint-4"))
    assert_same_training_state(runs["straight"], trainer)


def test_a_damaged_newest_set_is_passed_over_with_a_warning(
    runs: dict[str, Any], tmp_path: Path
) -> None:
    output = tmp_path / "run"
    shutil.copytree(runs["root"] / "a", output)
    model_file = output / "checkpoint-8" / "model.safetensors"
    data = bytearray(model_file.read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit of one weight
    model_file.write_bytes(bytes(data))

    trainer = make_trainer(output)
    with pytest.warns(SkippedCheckpointWarning, match="checkpoint-8") as caught:
        trainer.train(resume_from_checkpoint=True)
    assert any("digest" in str(w.message) for w in caught)
    # Resumed from step 4 and trained to 8: the uninterrupted run's state, and a good set 8.
    assert_same_training_state(runs["straight"], trainer)
    verify_checkpoint(output / "checkpoint-8")


def test_renamed_sets_and_stock_checkpoints_are_passed_over(
    runs: dict[str, Any], tmp_path: Path
) -> None:
    output = tmp_path / "run"
    shutil.copytree(runs["root"] / "a", output)
    (output / "checkpoint-4").rename(output / "checkpoint-12")  # a set of step 4
    stock = output / "checkpoint-16"  # what the stock Trainer writes: no set
    stock.mkdir()
    (stock / "trainer_state.json").write_text('{"global_step": 16}')
    trainer = make_trainer(output)
    with pytest.warns(SkippedCheckpointWarning) as caught:
        trainer.train(resume_from_checkpoint=True)
    messages = [str(w.message) for w in caught]
    assert any("checkpoint-16" in m and "manifest" in m for m in messages), messages
    assert any("checkpoint-12" in m and "step 12" in m for m in messages), messages
    assert_same_training_state(runs["straight"], trainer)  # resumed from checkpoint-8


def test_an_explicit_damaged_set_is_refused(runs: dict[str, Any], tmp_path: Path) -> None:
    folder = tmp_path / "checkpoint-4"
    shutil.copytree(runs["root"] / "a" / "checkpoint-4", folder)
    (folder / "optimizer.tladam").write_bytes(b"")
    trainer = make_trainer(tmp_path / "out")
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    with pytest.raises(IntegrityError) as error:
        trainer.train(resume_from_checkpoint=str(folder))
    assert "optimizer" in str(error.value)
    assert all(torch.equal(before[k], v) for k, v in trainer.model.state_dict().items())


def test_save_total_limit_keeps_one_set(runs: dict[str, Any]) -> None:
    # The resumed run (save_total_limit=1) removed set 4 once set 8 was committed.
    assert sorted(p.name for p in (runs["root"] / "b").iterdir()) == ["checkpoint-8"]


def test_the_best_set_is_kept_and_loaded_at_the_end(tmp_path: Path) -> None:
    # The highest evaluation loss is "best" here: step 4's set, which save_total_limit=1 must
    # keep beside the newest at step 8, and which load_best_model_at_end loads (verified) at
    # the end; then the Trainer itself removes the newest (its rule for a limit of 1).
    trainer = make_trainer(
        tmp_path / "out",
        save_total_limit=1,
        eval_strategy="steps",
        eval_steps=EVERY,
        load_best_model_at_end=True,
        metric_for_best_model="loss",
        greater_is_better=True,
        eval_dataset=TinyData(),
    )
    trainer.train()
    best = tmp_path / "out" / "checkpoint-4"
    assert trainer.state.best_model_checkpoint == str(best)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["checkpoint-4"]
    expected = transformers.GPT2LMHeadModel(trainer.model.config)
    load_checkpoint(best, model=expected)
    for name, value in expected.state_dict().items():
        assert torch.equal(trainer.model.state_dict()[name], value), name


def test_the_module_imports_without_transformers() -> None:
    code = (
        "import sys; sys.modules['transformers'] = None\n"
        "import tlckpt.integrations.transformers as m\n"
        "from tlckpt.optional import MissingDependencyError\n"
        "try:\n"
        "    m.TlckptTrainer\n"
        "except MissingDependencyError as e:\n"
        "    print('refused:', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "refused:" in out.stdout and "transformers" in out.stdout
