"""Hostile files into live objects: a rejected load must leave everything bit for bit as it was.

Run from the repository root::

    python -m fuzz.runtime_hostile                  # systematic mutations of every file
    python -m fuzz.runtime_hostile --per-file 200   # a sample of each file's mutations
    python -m fuzz.runtime_hostile --device cuda    # the same on a GPU (capturable too)

A small model with tied embedding/output weights, a frozen layer and BatchNorm buffers is
trained a few steps with each optimizer variant (Adam/AdamW; default, ``foreach=False``,
``fused=True``; float32 and float64; with a random counter; ``capturable=True`` on CUDA; and
states only tlckpt's own ``TLCKOPT`` family holds: two param groups with amsgrad, bfloat16
parameters with a trainable one that has no state).
Its optimizer file (``save_optimizer``), its model file (``save_module_state``, float32
only; loaded both staged and with ``staged=False``) and its exact-bits JSON file
(``save_state_bits``) and its safetensors file (``save_module_state`` to ``.safetensors``,
any dtype; loaded strict and with ``strict=False``) are mutated with
:mod:`fuzz.mutators` (every truncation, byte flip, u64 edge value, record duplication/
deletion/swap, JSON edit...) and loaded into the live model and optimizer.

For every load that raises, the check is: the exception is a ``CheckpointError``; every
parameter and buffer has the same identity, dtype, shape, device, bytes and autograd
version counter (nothing was written, not even equal values); the optimizer has the same
state dict (same tensor objects, same bytes, ``step`` tensors included) and param groups
(hyperparameters bit for bit, the same parameter objects). A load that succeeds is undone
by loading the original file again, which must restore the original values exactly.

Exit status: 0 if nothing escaped and nothing changed, else 1.
"""

from __future__ import annotations

import dataclasses
import random
import struct
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from tlckpt.testing.bitwise import same
from tlckpt.testing.models import TiedNet, train

from .command import campaign_parser, exit_with
from .mutators import apply, describe, systematic


@dataclass(frozen=True)
class Variant:
    name: str
    kind: str = "adamw"  # "adam" | "adamw" | another torch.optim class name (optimizer tree)
    dtype: torch.dtype = torch.float32
    options: tuple = ()
    counter: int | None = None
    device: str = "cpu"
    groups: bool = False  # weight decay for matrices only: two param groups
    idle: bool = False  # the frozen layer made trainable after training: no state for it


def variants(device: str = "cpu") -> list[Variant]:
    out = [
        Variant("adam-default", "adam"),
        Variant("adamw-foreach-false", options=(("foreach", False),)),
        Variant("adamw-fused", options=(("fused", True),)),
        Variant("adamw-f64", dtype=torch.float64),
        Variant("adam-counter", "adam", counter=2**64 - 1),
        Variant("adamw-groups-amsgrad", options=(("amsgrad", True),), groups=True, counter=7),
        Variant("adamw-bf16-idle", dtype=torch.bfloat16, options=(("fused", True),), idle=True),
        Variant("sgd-momentum-groups", "SGD", options=(("momentum", 0.9),), groups=True, counter=9),
        Variant("adafactor-bf16", "Adafactor", dtype=torch.bfloat16),
    ]
    if device != "cpu":
        out = [dataclasses.replace(v, device=device) for v in out]
        out.append(Variant("adamw-capturable", options=(("capturable", True),), device=device))
        out.append(
            Variant(
                "adam-capturable-f64", "adam", torch.float64, (("capturable", True),), device=device
            )
        )
    return out


def build(variant: Variant, seed: int = 0) -> tuple[TiedNet, torch.optim.Optimizer]:
    """A model and optimizer of ``variant`` after three training steps."""
    torch.manual_seed(seed)
    model = TiedNet(variant.dtype).to(variant.device)
    kinds = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW}
    cls = kinds.get(variant.kind) or getattr(torch.optim, variant.kind)
    params: Any = list(model.parameters())
    if variant.groups:
        params = [
            {"params": [p for p in params if p.ndim > 1], "weight_decay": 0.05},
            {"params": [p for p in params if p.ndim <= 1], "weight_decay": 0.0},
        ]
    opt = cls(params, lr=1e-2, **dict(variant.options))
    train(model, opt, 0, 3, variant.device)
    if variant.idle:
        model.frozen.requires_grad_(True)
    return model, opt


# ------------------------------------------------------------------------------ snapshots


def _tensor_image(t: torch.Tensor) -> tuple:
    d = t.detach()
    raw = d.cpu().clone().contiguous().reshape(-1).view(torch.uint8)
    return (t.dtype, tuple(t.shape), t.stride(), str(t.device), raw, t.requires_grad, d._version)


def _value_image(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return ("tensor", id(v), _tensor_image(v))
    if isinstance(v, float):
        return ("float", struct.pack("<d", v))
    if isinstance(v, (list, tuple)):
        return (type(v).__name__, tuple(_value_image(x) for x in v))
    if isinstance(v, dict):
        return ("dict", tuple((k, _value_image(x)) for k, x in v.items()))
    return ("value", type(v).__name__, repr(v))


def snapshot(model: torch.nn.Module, opt: torch.optim.Optimizer) -> dict:
    """Everything a load could change, with identities, bytes and version counters."""
    params = [(n, id(p)) for n, p in model.named_parameters(remove_duplicate=False)]
    state = [(n, id(t), _tensor_image(t)) for n, t in model.state_dict(keep_vars=True).items()]
    opt_state = []
    for p, s in opt.state.items():
        opt_state.append((id(p), id(s), tuple((k, _value_image(v)) for k, v in s.items())))
    groups = []
    for g in opt.param_groups:
        groups.append(
            (
                tuple(id(p) for p in g["params"]),
                tuple((k, _value_image(v)) for k, v in g.items() if k != "params"),
            )
        )
    return {
        "params": params,
        "state": state,
        "opt_state": opt_state,
        "groups": groups,
        "opt_state_obj": id(opt.state),
    }


def _equal(a: Any, b: Any) -> bool:
    """Snapshot parts equal: sequences item by item, tensors (raw bytes) bit for bit."""
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    return same(a, b)


def differences(before: dict, after: dict) -> list[str]:
    """What changed between two snapshots (empty: bit for bit the same)."""
    out = []
    for key in before:
        if not _equal(before[key], after[key]):
            out.append(key)
    return out


def values_only(snap: dict) -> dict:
    """A snapshot without identities and version counters (for restored state)."""

    def strip(x: Any) -> Any:
        if isinstance(x, tuple) and len(x) == 3 and x[0] == "tensor":
            img = x[2]
            return ("tensor", img[:6])
        if isinstance(x, tuple):
            return tuple(strip(y) for y in x)
        return x

    state = [(n, img[:6]) for n, _, img in snap["state"]]
    opt_state = [strip(s[2]) for s in snap["opt_state"]]
    groups = [strip(g[1]) for g in snap["groups"]]
    return {"state": state, "opt_state": opt_state, "groups": groups}


# ------------------------------------------------------------------------------ campaign


@dataclass
class Stats:
    cases: int = 0
    accepted: int = 0
    rejected: int = 0
    escapes: int = 0
    changed: int = 0
    errors: dict = field(default_factory=lambda: defaultdict(int))
    findings: list = field(default_factory=list)


def _loaders(variant: Variant) -> dict[str, Any]:
    import tlckpt

    restore = variant.counter is not None
    loaders = {
        "optimizer": lambda m, o, p: tlckpt.load_optimizer(o, m, p, restore_random_counter=restore),
        "state_bits": lambda m, o, p: tlckpt.load_state_bits(m, p),
        "safetensors": lambda m, o, p: tlckpt.load_module_state(m, p),
        "safetensors_partial": lambda m, o, p: tlckpt.load_module_state(m, p, strict=False),
    }
    if variant.dtype == torch.float32:
        loaders["module_state"] = lambda m, o, p: tlckpt.load_module_state(m, p)
        loaders["module_state_in_place"] = lambda m, o, p: tlckpt.load_module_state(
            m, p, staged=False
        )
    return loaders


def _save(variant: Variant, model: Any, opt: Any, folder: Path) -> dict[str, Path]:
    import tlckpt

    paths = {"optimizer": folder / "opt.tladam", "state_bits": folder / "model.json"}
    tlckpt.save_optimizer(opt, model, paths["optimizer"], random_counter=variant.counter)
    tlckpt.save_state_bits(model, paths["state_bits"], pretty=False)
    paths["safetensors"] = folder / "model.safetensors"
    tlckpt.save_module_state(model, paths["safetensors"])
    paths["safetensors_partial"] = paths["safetensors"]  # the same file, strict and not
    if variant.dtype == torch.float32:
        paths["module_state"] = folder / "model.tlsf32"
        tlckpt.save_module_state(model, paths["module_state"])
        paths["module_state_in_place"] = paths["module_state"]  # the same file, both modes
    return paths


def run_variant(
    variant: Variant,
    per_file: int | None,
    rng: random.Random,
    stats: Stats,
    folder: Path,
    deadline: float | None = None,
) -> None:
    """Mutate each of the variant's files and load every mutant into the live objects."""
    import warnings

    from tlckpt.codec import CheckpointError

    model, opt = build(variant)
    originals = {k: p.read_bytes() for k, p in _save(variant, model, opt, folder).items()}
    loaders = _loaders(variant)
    target = folder / "mutant"
    base = snapshot(model, opt)
    current = base
    for what, data in originals.items():
        specs = list(systematic(data, what != "state_bits", seed=rng.randrange(2**30)))
        if per_file is not None and len(specs) > per_file:
            specs = specs[:1] + rng.sample(specs[1:], per_file - 1)
        load = loaders[what]
        for spec in specs:
            if deadline is not None and time.monotonic() > deadline:
                return
            mutant = apply(data, spec, {})
            target.write_bytes(mutant)
            stats.cases += 1
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    load(model, opt, target)
            except CheckpointError as exc:
                stats.rejected += 1
                stats.errors[type(exc).__name__] += 1
                after = snapshot(model, opt)
                changed = differences(current, after)
                if changed:
                    stats.changed += 1
                    _finding(
                        stats,
                        variant,
                        what,
                        spec,
                        f"changed after raising {type(exc).__name__}: {', '.join(changed)}",
                        str(exc),
                    )
                    _restore(model, opt, loaders[what], folder, originals[what])
                    current = snapshot(model, opt)
                continue
            except Exception as exc:
                stats.escapes += 1
                after = snapshot(model, opt)
                changed = differences(current, after)
                _finding(
                    stats,
                    variant,
                    what,
                    spec,
                    f"escape {type(exc).__name__}: {exc}"
                    + (f"; changed {changed}" if changed else ""),
                    repr(exc),
                )
                if changed:
                    _restore(model, opt, load, folder, originals[what])
                    current = snapshot(model, opt)
                continue
            stats.accepted += 1
            # Accepted: put the original back and check that it is exactly the original.
            _restore(model, opt, load, folder, originals[what])
            current = snapshot(model, opt)
            if not _same_values(current, base):
                stats.changed += 1
                _finding(stats, variant, what, spec, "original did not restore exactly", "")


def _same_values(a: dict, b: dict) -> bool:
    return not differences(values_only(a), values_only(b))


def _restore(model: Any, opt: Any, load: Any, folder: Path, data: bytes) -> None:
    import warnings

    path = folder / "original"
    path.write_bytes(data)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        load(model, opt, path)


def _finding(
    stats: Stats, variant: Variant, what: str, spec: tuple, message: str, detail: str
) -> None:
    if len(stats.findings) < 100:
        stats.findings.append(f"{variant.name} {what} {describe(spec)}: {message} | {detail}")


def main(argv: list[str] | None = None) -> int:
    parser = campaign_parser("runtime_hostile", __doc__, seed=3)
    parser.add_argument("--per-file", type=int, help="mutations sampled per file (default: all)")
    parser.add_argument("--minutes", type=float, default=None, help="stop after this long")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rng = random.Random(args.seed)
    deadline = None if args.minutes is None else time.monotonic() + 60 * args.minutes
    start = time.monotonic()
    print(
        f"{'variant':<22}{'cases':>8}{'accepted':>10}{'rejected':>10}{'escapes':>9}{'changed':>9}"
    )
    total = Stats()
    with tempfile.TemporaryDirectory(prefix="tlckpt-runtime-hostile-") as tmp:
        for variant in variants(args.device):
            stats = Stats()
            run_variant(variant, args.per_file, rng, stats, Path(tmp), deadline)
            print(
                f"{variant.name:<22}{stats.cases:>8}{stats.accepted:>10}{stats.rejected:>10}"
                f"{stats.escapes:>9}{stats.changed:>9}",
                flush=True,
            )
            for k in ("cases", "accepted", "rejected", "escapes", "changed"):
                setattr(total, k, getattr(total, k) + getattr(stats, k))
            total.findings += stats.findings
            for k, v in stats.errors.items():
                total.errors[k] += v
    print(
        f"{'total':<22}{total.cases:>8}{total.accepted:>10}{total.rejected:>10}"
        f"{total.escapes:>9}{total.changed:>9}"
    )
    print(f"errors: {dict(total.errors)}")
    print(f"{time.monotonic() - start:.1f} s on {args.device}")
    for line in total.findings[:30]:
        print("FINDING", line[:400])
    return 1 if total.escapes or total.changed else 0


if __name__ == "__main__":
    exit_with(main)
