"""Crash safety: SIGKILL a process in the middle of saving large checkpoints, many times.

Run from the repository root::

    python -m fuzz.crash_kill --trials 120 --size-mb 64

Each trial forks a child that builds a model (an embedding tied to its output projection, a
frozen layer, hidden layers: about ``--size-mb`` MiB of float32 parameters) with values of
its own, takes one AdamW step, announces digests of what it is about to write (computed from
its live tensors, independently of the library's writer), and then saves the model
(``save_module_state``, ``TLSF32B``), the optimizer (``save_optimizer``, ``TLADAMF`` v4 with a
random counter) and a small exact-bits JSON file (``save_state_bits``) over the files the
previous trial left. The parent kills it with SIGKILL after a random delay drawn over the
whole save (calibrated by a first, uninterrupted trial).

After every kill each destination must be either absent (only if it never existed or the
trial started fresh), the previous complete file, or the new complete file: the parent reads
it fully with the library's readers and compares a digest of the decoded content with the
previous file's and the child's announced one. Any other outcome is a *damaged* destination.
Every other file left in the folder must be a recognisable temporary
(``tlckpt.codec.fileio.atomic.is_temporary``: hidden, ``.tlckpt-`` in the name, ``.tmp``
suffix), must
not carry a checkpoint extension, and is left in place so later saves run next to stale
temporaries — until a later trial completes a save to the same destination, which must
remove it (a killed writer's lock is gone, so it is stale). Every tenth trial starts with no
destination files.

Exit status: 0 if no destination was ever damaged, no stray file appeared and every completed
save removed its destination's stale temporaries, else 1.
"""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
import random
import time
from collections import Counter
from pathlib import Path
from typing import Any

from tlckpt.formats.primitives import float_bits, pack_u64

from .command import add_folder_options, campaign_parser, exit_with, run_in_folder
from .kill_trial import Child

DESTS = ("model.tlsf32", "opt.tladam", "small.json")
CHECKPOINT_SUFFIXES = (".tlsf32", ".tladam", ".json", ".safetensors", ".pt", ".pth")


# ------------------------------------------------------------------------------ digests


def _digest_arrays(arrays: list[Any]) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(repr(tuple(a.shape)).encode())
        h.update(memoryview(a.reshape(-1)).cast("B") if a.size else b"")
    return h.hexdigest()


def _digest_adam(config: tuple, counter: int | None, entries: list[tuple]) -> str:
    h = hashlib.sha256()
    kind, b1, b2, eps, wd = config
    h.update(repr(kind).encode() + pack_u64(*map(float_bits, (b1, b2, eps, wd))))
    h.update(repr(counter).encode())
    for slot, step, m, v in entries:
        h.update(pack_u64(slot, step))
        h.update(memoryview(m.reshape(-1)).cast("B") if m.size else b"")
        h.update(memoryview(v.reshape(-1)).cast("B") if v.size else b"")
    return h.hexdigest()


# ------------------------------------------------------------------------------ child


def _model(size_mb: float, seed: int):
    import torch

    torch.manual_seed(seed)
    vocab, width = 1000, 256
    hidden = max(1, int(size_mb * (1 << 20) / 4 - 2 * vocab * width) // (width * width + width))
    layers: list[Any] = [torch.nn.Embedding(vocab, width)]
    frozen = torch.nn.Linear(width, width)
    frozen.requires_grad_(False)
    layers.append(frozen)
    layers += [torch.nn.Linear(width, width) for _ in range(hidden)]
    head = torch.nn.Linear(width, vocab)
    head.weight = layers[0].weight  # tied
    layers.append(head)
    return torch.nn.Sequential(*layers)


def _child(conn: Any, folder: str, size_mb: float, seed: int, counter: int) -> None:
    import torch

    import tlckpt
    from tlckpt.codec import AdamKind

    torch.set_num_threads(1)
    model = _model(size_mb, seed)
    small = torch.nn.Linear(8, 3).double()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    x = torch.randint(0, 1000, (4,))
    model(x).sum().backward()
    opt.step()
    with torch.no_grad():
        for p in model.parameters():  # values of this trial's own
            p.add_(seed)
    state = [t.detach().numpy() for t in model.state_dict().values()]
    schema = tlckpt.schema_of(model)
    params = [p for _, p in model.named_parameters(remove_duplicate=False)]
    g = opt.param_groups[0]
    config = (int(AdamKind.ADAMW), g["betas"][0], g["betas"][1], g["eps"], g["weight_decay"])
    entries = []
    for i in schema.representative_slots:
        s = opt.state[params[i]]
        entries.append((i, int(s["step"].item()), s["exp_avg"].numpy(), s["exp_avg_sq"].numpy()))
    digests = {
        "model.tlsf32": _digest_arrays(state),
        "opt.tladam": _digest_adam(config, counter, entries),
        "small.json": _digest_arrays([t.detach().numpy() for t in small.state_dict().values()]),
    }
    shapes = {
        "model.tlsf32": [tuple(a.shape) for a in state],
        "small.json": [tuple(t.shape) for t in small.state_dict().values()],
        "schema": (schema.shapes, schema.requires_grad, schema.representatives),
    }
    conn.send(("ready", digests, shapes, time.monotonic()))
    conn.recv()  # "go": the parent's clock for the kill delay starts now
    conn.send(("started", time.monotonic()))
    folder_path = Path(folder)
    tlckpt.save_module_state(model, folder_path / "model.tlsf32")
    conn.send(("saved", "model.tlsf32", time.monotonic()))
    tlckpt.save_optimizer(opt, model, folder_path / "opt.tladam", random_counter=counter)
    conn.send(("saved", "opt.tladam", time.monotonic()))
    tlckpt.save_state_bits(small, folder_path / "small.json")
    conn.send(("saved", "small.json", time.monotonic()))
    conn.send(("done", time.monotonic()))
    conn.close()


# ------------------------------------------------------------------------------ parent


def read_digest(path: Path, name: str, shapes: dict) -> str:
    """Read a destination fully with the library and digest its decoded content."""
    from tlckpt.codec import (
        AdamConfig,
        AdamKind,
        MomentDtype,
        ParameterSchema,
        read_adam,
        read_float32_state,
        read_state_bits,
    )

    if name == "model.tlsf32":
        return _digest_arrays(read_float32_state(path, shapes[name]))
    if name == "small.json":
        return _digest_arrays(read_state_bits(path, shapes[name], "float64"))
    schema = ParameterSchema(*shapes["schema"])
    ckpt = read_adam(path, schema, dtype=MomentDtype.FLOAT32)
    c: AdamConfig = ckpt.config
    config = (int(c.kind), c.beta1, c.beta2, c.epsilon, c.weight_decay)
    if c.kind is not AdamKind.ADAMW:
        raise ValueError(f"{path}: kind {c.kind!r}, the child saves AdamW")
    entries = [(i, e.step, e.m, e.v) for i, e in sorted(ckpt.entries.items())]
    return _digest_adam(config, ckpt.random_counter, entries)


def run(
    trials: int,
    size_mb: float,
    folder: Path,
    rng: random.Random,
    quiet: bool = False,
    fresh_every: int = 10,
) -> dict:
    """Run the trials in ``folder``; return the figures (see the module docstring)."""
    from tlckpt.codec.fileio.atomic import is_temporary, temporary_prefix

    ctx = mp.get_context("fork")
    previous: dict[str, str | None] = dict.fromkeys(DESTS)
    outcomes: Counter = Counter()
    phases: Counter = Counter()
    damaged: list[str] = []
    strays: list[str] = []
    uncleaned: list[str] = []
    removed = 0
    temporaries_seen: set[str] = set()
    durations: list[float] = []  # go → done of the trials that finished
    shapes: dict = {}
    for trial in range(trials + 1):  # trial 0: calibration, never killed
        if trial and fresh_every and trial % fresh_every == 0:
            for name in DESTS:
                (folder / name).unlink(missing_ok=True)
                previous[name] = None
        stale_before = {e for e in os.listdir(folder) if is_temporary(e)}
        child = Child(ctx, _child, (str(folder), size_mb, trial + 1, trial * 7919 + 1))
        _, new_digests, shapes, _ = child.ready
        delay = None
        if trial and durations:
            estimate = sorted(durations)[len(durations) // 2]
            delay = rng.uniform(0.0, estimate * 1.1)
        go, messages = child.release(delay)
        saved = [m[1] for m in messages if m[0] == "saved"]
        done = any(m[0] == "done" for m in messages)
        if done:
            durations.append(time.monotonic() - go)
        elif trial == 0:
            raise RuntimeError("calibration trial did not finish")
        phase = (
            "after all saves"
            if done
            else (f"after {saved[-1]}" if saved else "before the first save completed")
        )
        phases[phase] += 1
        # Check every destination.
        for name in DESTS:
            path = folder / name
            if not path.exists():
                state = "absent"
                ok = previous[name] is None
            else:
                try:
                    digest = read_digest(path, name, shapes)
                except Exception as exc:
                    digest = None
                    state = f"unreadable: {type(exc).__name__}: {exc}"
                if digest is not None and digest == new_digests[name]:
                    state = "new"
                elif digest is not None and digest == previous[name]:
                    state = "previous"
                elif digest is not None:
                    state = "neither previous nor new"
                ok = state in ("new", "previous")
            outcomes[(name, state if ok else "DAMAGED")] += 1
            if not ok:
                damaged.append(f"trial {trial} {name}: {state} (killed {phase})")
            if state == "new":
                previous[name] = new_digests[name]
        left_now = set(os.listdir(folder))
        removed += len(stale_before - left_now)
        for name in saved:  # a completed save removes its destination's stale temporaries
            prefix = temporary_prefix(folder / name)
            for entry in sorted(stale_before & left_now):
                if entry.startswith(prefix):
                    uncleaned.append(f"trial {trial}: {entry} survived a save of {name}")
        for entry in os.listdir(folder):
            if entry in DESTS:
                continue
            if is_temporary(entry) and not entry.endswith(CHECKPOINT_SUFFIXES):
                temporaries_seen.add(entry)
            else:
                strays.append(f"trial {trial}: {entry}")
        if not quiet and trial % 10 == 0:
            print(
                f"  trial {trial}: delay {delay}, {phase}, temporaries so far "
                f"{len(temporaries_seen)}",
                flush=True,
            )
    left = [e for e in os.listdir(folder) if e not in DESTS]
    return {
        "trials_killed": trials,
        "size_mb": size_mb,
        "save_seconds_median": sorted(durations)[len(durations) // 2],
        "outcomes": {f"{k[0]}: {k[1]}": v for k, v in sorted(outcomes.items())},
        "phases": dict(phases),
        "damaged": damaged,
        "strays": strays,
        "temporaries_left": len(left),
        "temporaries_removed_by_saves": removed,
        "uncleaned": uncleaned,
        "temporaries_recognised": all(is_temporary(e) for e in left),
    }


def main(argv: list[str] | None = None) -> int:
    parser = campaign_parser("crash_kill", __doc__, seed=9)
    parser.add_argument("--trials", type=int, default=120)
    parser.add_argument("--size-mb", type=float, default=64.0)
    add_folder_options(parser)
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    report = run_in_folder(
        "tlckpt-crash-",
        args.dir,
        lambda folder: run(args.trials, args.size_mb, folder, rng, quiet=args.quiet),
    )
    print(
        f"SIGKILL trials: {report['trials_killed']}, damaged destinations: "
        f"{len(report['damaged'])}, stray files: {len(report['strays'])}, temporaries left: "
        f"{report['temporaries_left']} (all recognised: {report['temporaries_recognised']}),"
        f" stale temporaries removed by later saves: {report['temporaries_removed_by_saves']},"
        f" not removed: {len(report['uncleaned'])}"
    )
    return 1 if report["damaged"] or report["strays"] or report["uncleaned"] else 0


if __name__ == "__main__":
    exit_with(main)
