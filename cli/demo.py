"""``tlckpt demo``: checkpoint a training run, resume it in fresh objects, compare bit for bit.

:func:`training_demo` (the default command) trains a small model — an embedding tied to the
output projection, a frozen layer, BatchNorm and counter-driven dropout — with AdamW on
synthetic data; checkpoints the model (``TLSF32B`` and exact-bits JSON) and the optimizer
(``TLADAMF`` v4, holding the run's random counter) at step ``STEPS_BEFORE``, and saves the
same state as a checkpoint set in the background (``CheckpointManager.save(...,
blocking=False)``), and keeps training; then builds *fresh* objects with a different
initialisation, loads the files (or restores the set in one call), trains the same number of
steps and compares everything with ``torch.equal``.

The run's randomness is counter-based: step ``k`` draws its batch and dropout mask from a
generator seeded with ``(SEED, k)``, so the counter alone (a u64 the optimizer checkpoint
stores) restores the random stream exactly.

:func:`codec_demo` (``tlckpt demo --codec``) writes and reads every format with numpy only.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from .. import codec
from ..codec import AdamConfig, AdamEntry, AdamKind, MomentDtype, ParameterSchema, inspect
from .describe import describe, summarize, table

__all__ = ["training_demo", "codec_demo", "SEED", "STEPS_BEFORE", "STEPS_AFTER"]

SEED = 1234
INIT_SEED = 7
#: Steps before the checkpoint, and after it (in both runs).
STEPS_BEFORE = 5
STEPS_AFTER = 5
VOCAB, DIM, BATCH = 32, 16, 24
LR, BETAS, EPS, WEIGHT_DECAY = 1e-2, (0.9, 0.999), 1e-8, 0.01
DROPOUT = 0.1


def _model_class() -> Any:
    import torch
    from torch import nn

    class TinyTiedModel(nn.Module):
        """Embedding tied to the output projection, a frozen mixing layer, BatchNorm."""

        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(VOCAB, DIM)
            self.mix = nn.Linear(DIM, DIM)
            self.mix.requires_grad_(False)  # frozen: in the state, never in the optimizer
            self.norm = nn.BatchNorm1d(DIM)
            self.hidden = nn.Linear(DIM, DIM)
            self.head = nn.Linear(DIM, VOCAB, bias=False)
            self.head.weight = self.embed.weight  # tied weights: one tensor, two slots

        def forward(self, tokens: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
            x = self.norm(self.mix(self.embed(tokens)))
            return self.head(torch.tanh(self.hidden(x)) * keep)

    return TinyTiedModel


def _build(init_seed: int) -> tuple[Any, Any]:
    """A model initialised from ``init_seed`` and its AdamW optimizer (global RNG untouched)."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(init_seed)
        model = _model_class()()
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY)
    return model, optimizer


def _batch(counter: int) -> tuple[Any, Any, Any]:
    """Step ``counter``'s tokens, targets and dropout mask: a function of the counter alone."""
    import torch

    g = torch.Generator().manual_seed(SEED * 1_000_003 + counter)
    tokens = torch.randint(0, VOCAB, (BATCH,), generator=g)
    targets = (tokens * 7 + 3) % VOCAB
    keep = (torch.rand(BATCH, DIM, generator=g) >= DROPOUT).float() / (1 - DROPOUT)
    return tokens, targets, keep


def _train(model: Any, optimizer: Any, counter: int, steps: int) -> tuple[int, list[Any]]:
    """``steps`` AdamW steps from random counter ``counter``; returns the new counter, losses."""
    import torch.nn.functional as F

    model.train()
    losses = []
    for _ in range(steps):
        tokens, targets, keep = _batch(counter)
        counter += 1
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(tokens, keep), targets)
        loss.backward()
        optimizer.step()
        losses.append(loss.detach().clone())
    return counter, losses


def _same_state(a: Any, b: Any) -> tuple[bool, int]:
    """Whether two models' parameters and buffers are equal (``torch.equal``); the count."""
    import torch

    sa, sb = a.state_dict(), b.state_dict()
    same = list(sa) == list(sb) and all(torch.equal(sa[k], sb[k]) for k in sa)
    return same, len(sa)


def _same_optimizer(a: Any, b: Any) -> tuple[bool, int]:
    """Whether two optimizers hold equal ``step``/``exp_avg``/``exp_avg_sq`` for every param."""
    import torch

    pa = [p for g in a.param_groups for p in g["params"]]
    pb = [p for g in b.param_groups for p in g["params"]]
    if len(pa) != len(pb):
        return False, 0
    for p, q in zip(pa, pb):
        sp, sq = a.state.get(p, {}), b.state.get(q, {})
        if sorted(sp) != sorted(sq):
            return False, len(pa)
        for key in sp:
            x, y = sp[key], sq[key]
            if isinstance(x, torch.Tensor) and not torch.equal(x, y):
                return False, len(pa)
    return True, len(pa)


def _verdict(same: bool) -> str:
    return "identical" if same else "DIFFERENT"


def training_demo(out: TextIO, folder: str | os.PathLike | None = None) -> bool:
    """Run the checkpoint-and-resume demo, printing to ``out``; True if bit-identical.

    Args:
        out: where the report goes.
        folder: keep the checkpoint files there (default: a temporary folder, removed).

    Returns:
        Whether every resumed run matched the uninterrupted run bit for bit.
    """
    import torch

    from .. import runtime  # torch: imported by the training demo only

    def say(text: str = "") -> None:
        print(text, file=out)

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(folder or tmp)
        root.mkdir(parents=True, exist_ok=True)
        files = {
            "model": root / "model.tlsf32",
            "bits": root / "model.json",
            "optimizer": root / "optimizer.tladam",
        }

        say("tlckpt demo: checkpoint a training run, resume it in fresh objects, and check")
        say("that the resumed run is bit-identical to the uninterrupted one.")
        say()
        model, optimizer = _build(INIT_SEED)
        schema = runtime.schema_of(model)
        say("model      embedding tied to the output projection, a frozen layer, BatchNorm")
        say(
            f"           {len(model.state_dict())} state tensors, {len(schema)} parameter slots"
            f" ({len(schema.representative_slots)} with optimizer state)"
        )
        say(
            f"optimizer  AdamW(lr={LR}, betas={BETAS}, eps={EPS}, weight_decay={WEIGHT_DECAY})"
            f", float32 moments"
        )
        say(f"data       synthetic, counter-based random stream (seed {SEED}); dropout {DROPOUT}")
        say()

        # The uninterrupted run: train, checkpoint (which must not disturb it), train on.
        counter, _ = _train(model, optimizer, 0, STEPS_BEFORE)
        runtime.save_module_state(model, files["model"])
        runtime.save_state_bits(model, files["bits"])
        version = runtime.save_optimizer(
            optimizer, model, files["optimizer"], random_counter=counter
        )
        manager = runtime.CheckpointManager(root / "sets")
        handle = manager.save(
            STEPS_BEFORE, model=model, optimizer=optimizer, random_counter=counter, blocking=False
        )
        checkpointed = {k: v.detach().clone() for k, v in model.state_dict().items()}
        say(f"trained {STEPS_BEFORE} steps; checkpoint written at random counter {counter}:")
        say(f"  {files['model'].name:<18} model state, TLSF32B")
        say(f"  {files['bits'].name:<18} model state, exact-bits JSON")
        say(f"  {files['optimizer'].name:<18} optimizer state, TLADAMF v{version}")
        end_counter, losses_after = _train(model, optimizer, counter, STEPS_AFTER)
        set_folder = handle.wait()  # written in the background while the run went on
        say(f"  sets/{set_folder.name}/  the whole training state as one checkpoint set,")
        say("           saved in the background while training went on (manifest of digests)")
        say(f"the uninterrupted run trained {STEPS_AFTER} more steps (counter {end_counter}).")
        say()

        for path in files.values():
            say(f"$ tlckpt inspect {path.name}")
            say(describe(inspect(path), path.name))
            say()

        # The resumed runs: fresh objects, initialised differently, so every value that
        # matches later came from the files.
        def from_files(loader: Any, path: Path) -> Any:
            def load(fresh: Any, fresh_optimizer: Any) -> int:
                loader(fresh, path)
                return runtime.load_optimizer(
                    fresh_optimizer, fresh, files["optimizer"], restore_random_counter=True
                )

            return load

        def from_set(fresh: Any, fresh_optimizer: Any) -> int:
            return manager.restore(model=fresh, optimizer=fresh_optimizer).random_counter

        runs = []
        for name, load, init in (
            ("TLSF32B", from_files(runtime.load_module_state, files["model"]), INIT_SEED + 1),
            ("JSON", from_files(runtime.load_state_bits, files["bits"]), INIT_SEED + 2),
            ("set", from_set, INIT_SEED + 4),
        ):
            fresh, fresh_optimizer = _build(init)
            differed = not all(
                torch.equal(t, checkpointed[k]) for k, t in fresh.state_dict().items()
            )
            restored = load(fresh, fresh_optimizer)
            final, losses = _train(fresh, fresh_optimizer, restored, STEPS_AFTER)
            runs.append(_Resumed(name, differed, restored, fresh, fresh_optimizer, final, losses))

        # A control: the same resume with the random stream restarted at 0 instead of the
        # restored counter must diverge, or the comparison above would prove nothing.
        control, control_optimizer = _build(INIT_SEED + 3)
        runtime.load_module_state(control, files["model"])
        runtime.load_optimizer(
            control_optimizer, control, files["optimizer"], restore_random_counter=True
        )
        _, control_losses = _train(control, control_optimizer, 0, STEPS_AFTER)
        control_diverged = not all(torch.equal(a, b) for a, b in zip(losses_after, control_losses))

        differed = "each differed" if all(r.differed for r in runs) else "NOT ALL DIFFERED"
        say(f"resumed: fresh models and optimizers, initialised differently ({differed} from")
        say(
            f"the trained model before loading); loaded from the files, random counter"
            f" {runs[0].counter} restored; {STEPS_AFTER} steps:"
        )
        rows = []
        for k, loss in enumerate(losses_after):
            row: list[Any] = [STEPS_BEFORE + k + 1, f"{loss.item():.9f}"]
            for run in runs:
                other = run.losses[k]
                same = "same bits" if torch.equal(loss, other) else "DIFFERENT"
                row.append(f"{other.item():.9f} ({same})")
            rows.append(row)
        headers = ("step", "uninterrupted loss", *(f"resumed via {r.label}" for r in runs))
        say(table(headers, rows))
        say()

        checks = [
            (
                f"parameters and buffers ({len(model.state_dict())} tensors)",
                [_same_state(model, r.model)[0] for r in runs],
            ),
            (
                f"optimizer step, exp_avg, exp_avg_sq ({len(optimizer.state)} params)",
                [_same_optimizer(optimizer, r.optimizer)[0] for r in runs],
            ),
            (
                f"losses of the {STEPS_AFTER} resumed steps",
                [all(torch.equal(a, b) for a, b in zip(losses_after, r.losses)) for r in runs],
            ),
            (
                f"random counter at the end ({end_counter})",
                [r.final_counter == end_counter for r in runs],
            ),
        ]
        say("comparison with the uninterrupted run (torch.equal):")
        say(
            table(
                ("", *(f"via {r.label}" for r in runs)),
                [(what, *map(_verdict, results)) for what, results in checks],
            )
        )
        say(
            "control: restarting the random stream at 0 instead of restoring the counter"
            f" {'diverges.' if control_diverged else 'DOES NOT DIVERGE!'}"
        )
        say()
        identical = all(all(results) for _, results in checks) and all(r.differed for r in runs)
        identical = identical and control_diverged
        if identical:
            say("verdict: BIT-IDENTICAL. The resumed runs match the uninterrupted run exactly.")
        else:
            say("verdict: NOT IDENTICAL. The resumed run differs from the uninterrupted run.")
        return identical


@dataclass
class _Resumed:
    """One resumed run: how it was loaded and where it ended."""

    label: str
    differed: bool  # the fresh model differed from the checkpointed one before loading
    counter: int
    model: Any
    optimizer: Any
    final_counter: int
    losses: list[Any]


def codec_demo(out: TextIO, folder: str | os.PathLike | None = None) -> None:
    """Write and read every format and version, printing what ``inspect`` says of each."""
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(folder or tmp)
        root.mkdir(parents=True, exist_ok=True)
        # Slots [embedding, output projection tied to it, frozen bias, scalar gain].
        schema = ParameterSchema(
            [(4, 3), (4, 3), (3,), ()], [True, True, False, True], [0, 0, None, 3]
        )
        untied = ParameterSchema([(4, 3), (3,), ()], [True, False, True])
        cases = [
            ("adam_v2.tladam", untied, MomentDtype.FLOAT32, None),
            ("adam_v3.tladam", schema, MomentDtype.FLOAT32, None),
            ("adam_v4.tladam", schema, MomentDtype.FLOAT32, 2**64 - 1),
            ("adam_v5.tladam", schema, MomentDtype.FLOAT64, 12345),
        ]
        for name, s, dtype, counter in cases:
            config = AdamConfig(AdamKind.ADAMW, 0.9, 0.999, 1e-8, 0.01, dtype)
            entries = {
                i: AdamEntry(
                    step=7,
                    m=rng.standard_normal(s.element_count(i)).astype(dtype.numpy),
                    v=rng.random(s.element_count(i)).astype(dtype.numpy),
                )
                for i in s.representative_slots
            }
            version = codec.write_adam(root / name, s, config, entries, counter)
            back = codec.read_adam(root / name, s, dtype=dtype, expected_config=config)
            same = all(
                back.entries[i].m.tobytes() == e.m.tobytes()
                and back.entries[i].v.tobytes() == e.v.tobytes()
                for i, e in entries.items()
            )
            print(f"{name}: wrote v{version}, read back bit-exact: {same}", file=out)
            print(f"  inspect: {summarize(inspect(root / name))}", file=out)

        arrays = [rng.standard_normal(shape).astype(np.float32) for shape in [(3, 4), (8,), ()]]
        arrays[1][0] = np.float32("nan")
        codec.write_float32_state(root / "model.tlsf32", arrays)
        back = codec.read_float32_state(root / "model.tlsf32", [a.shape for a in arrays])
        same = all(a.tobytes() == b.tobytes() for a, b in zip(arrays, back))
        print(f"model.tlsf32: read back bit-exact: {same}", file=out)
        print(f"  inspect: {summarize(inspect(root / 'model.tlsf32'))}", file=out)

        for encoding, dtype in [
            ("float64", "<f8"),
            ("float32", "<f4"),
            ("float16", "<f2"),
            ("bfloat16", "<u2"),
            ("float8_e4m3fn", "<u1"),
            ("complex64", "<c8"),
        ]:
            data = [np.frombuffer(rng.bytes(6 * np.dtype(dtype).itemsize), dtype).reshape(2, 3)]
            path = root / f"state_{encoding}.json"
            codec.write_state_bits(path, data, encoding, pretty=False)
            back = codec.read_state_bits(path, [(2, 3)], encoding)
            same = back[0].tobytes() == data[0].tobytes()
            print(f"{path.name}: read back bit-exact: {same}", file=out)
            print(f"  inspect: {summarize(inspect(path))}", file=out)
