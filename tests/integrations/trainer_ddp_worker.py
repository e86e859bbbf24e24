"""One rank of a 2-rank ``TlckptTrainer`` run (gloo, CPU), for
``test_transformers_distributed.py``: run A trains 8 steps straight, run B is stopped after
step 4 and resumed to 8 by a fresh Trainer, in one process (start-up is the expensive part).
Each rank's dropout draws from its own random stream (seeded by rank), so a resume that gave
a rank another rank's random states would not be bit-exact. Writes a JSON report.

    python trainer_ddp_worker.py OUTPUT_ROOT REPORT
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
import transformers

from tlckpt.integrations.transformers import TlckptTrainer

RANK = int(os.environ["RANK"])


class TinyData(torch.utils.data.Dataset):
    def __init__(self) -> None:
        self.tokens = torch.randint(0, 100, (32, 16), generator=torch.Generator().manual_seed(1))

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.tokens[i], "labels": self.tokens[i]}


class StopAt4(transformers.TrainerCallback):
    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if state.global_step == 4:
            control.should_training_stop = True
        return control


def run(output_dir: Path, stop: bool = False, resume: bool = False) -> str:
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=32)
    args = transformers.TrainingArguments(
        str(output_dir),
        max_steps=8,
        save_steps=4,
        weight_decay=0.01,
        warmup_steps=2,
        lr_scheduler_type="linear",
        per_device_train_batch_size=2,
        seed=0,
        report_to=[],
        use_cpu=True,
        ddp_backend="gloo",
        logging_steps=100,
        disable_tqdm=True,
    )
    model = transformers.GPT2LMHeadModel(config)
    trainer = TlckptTrainer(model=model, args=args, train_dataset=TinyData())
    if stop:
        trainer.add_callback(StopAt4())
    torch.manual_seed(100 + RANK)  # each rank's own dropout stream
    trainer.train(resume_from_checkpoint=True if resume else None)
    digest = hashlib.sha256()
    for _, value in sorted(trainer.model.state_dict().items()):
        digest.update(value.numpy().tobytes())
    for _, moments in sorted(trainer.optimizer.optimizer.state_dict()["state"].items()):
        for key in ("exp_avg", "exp_avg_sq"):
            digest.update(moments[key].numpy().tobytes())
    return f"{trainer.state.global_step}:{digest.hexdigest()}"


def main(root: Path, report: Path) -> None:
    try:
        straight = run(root / "a")
        run(root / "b", stop=True)
        resumed = run(root / "b", resume=True)
        report.write_text(json.dumps({"straight": straight, "resumed": resumed}))
    finally:
        # The Trainer's process group, destroyed as torch asks of every program: left to the
        # interpreter's finalization, a gloo worker thread taking the GIL there aborts the
        # process ("terminate called without an active exception").
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
