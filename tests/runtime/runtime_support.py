"""Helpers shared by the runtime tests: a small model, training loops, bit-exact snapshots."""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

# manifest.json error category → the exception class the library must raise (the codec's table)
from tlckpt.codec.errors import ERROR_OF_CATEGORY as ERROR_OF_CATEGORY
from tlckpt.codec.errors import CheckpointError

VOCAB, WIDTH, BATCH = 7, 4, 6


class TiedNet(torch.nn.Module):
    """Embedding ↔ output projection tied, a frozen layer, BatchNorm buffers, dropout.

    Dropout masks come from a generator seeded by the caller's random counter, so a run
    that restores the counter draws the same masks as one that was never interrupted.
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
    """The deterministic batch of a training step (the same in every run)."""
    g = torch.Generator().manual_seed(10_000 + step)
    x = torch.randint(0, VOCAB, (BATCH,), generator=g)
    y = torch.randint(0, VOCAB, (BATCH,), generator=g)
    return x.to(device), y.to(device)


def train(
    model: TiedNet, opt: torch.optim.Optimizer, first: int, count: int, device: Any = "cpu"
) -> int:
    """Train steps ``first .. first+count-1``; the step index is also the random counter.

    Returns the random counter after the last step.
    """
    model.train()
    for step in range(first, first + count):
        x, y = batch(step, device)
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(x, counter=step), y)
        loss.backward()
        opt.step()
    return first + count


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
    """Adam or AdamW with non-default betas/eps so config mismatches would show."""
    options: dict[str, Any] = {"lr": lr, "betas": (0.8, 0.95), "eps": 1e-7, **CUDA_IMPLS[impl]}
    if kind == "adamw":
        options["weight_decay"] = 0.03
        options.update(extra)
        return torch.optim.AdamW(params, **options)
    options.update(extra)
    return torch.optim.Adam(params, **options)


def bits(t: torch.Tensor) -> torch.Tensor:
    """The storage words of ``t`` (so NaN payloads and -0.0 compare exactly)."""
    t = t.detach()
    if t.is_complex():
        t = torch.view_as_real(t.contiguous())
    if t.dtype.is_floating_point:
        width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
        return t.contiguous().view(width)
    return t


def same(a: Any, b: Any) -> bool:
    """Bit-for-bit equality of tensors (dtype, shape, device, words) or plain values."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and a.device == b.device
            and torch.equal(bits(a).cpu(), bits(b).cpu())
        )
    return type(a) is type(b) and a == b


def snapshot_module(model: torch.nn.Module | Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Clones of every state tensor (state_dict order) or of the given tensors."""
    if isinstance(model, torch.nn.Module):
        return [t.detach().clone() for t in model.state_dict().values()]
    return [t.detach().clone() for t in model]


def module_unchanged(model: Any, snapshot: list[torch.Tensor]) -> bool:
    current = snapshot_module(model)
    return len(current) == len(snapshot) and all(same(a, b) for a, b in zip(current, snapshot))


def snapshot_optimizer(opt: torch.optim.Optimizer) -> dict[str, Any]:
    """Everything an optimizer holds: per parameter (in group order) its state, cloned."""
    order = [p for g in opt.param_groups for p in g["params"]]
    state = []
    for p in order:
        entry = opt.state.get(p)
        state.append(
            None
            if entry is None
            else {
                k: (v.detach().clone() if isinstance(v, torch.Tensor) else v)
                for k, v in entry.items()
            }
        )
    groups = [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]
    return {"state": state, "keys": len(opt.state), "groups": groups}


def optimizer_unchanged(opt: torch.optim.Optimizer, snap: dict[str, Any]) -> bool:
    now = snapshot_optimizer(opt)
    if now["keys"] != snap["keys"] or now["groups"] != snap["groups"]:
        return False
    for a, b in zip(now["state"], snap["state"]):
        if (a is None) != (b is None):
            return False
        if a is None:
            continue
        if list(a) != list(b) or not all(same(a[k], b[k]) for k in a):
            return False
    return True


def optimizer_states_equal(a: torch.optim.Optimizer, b: torch.optim.Optimizer) -> list[str]:
    """Differences between two optimizers' states, matched by parameter position."""
    out = []
    pa = [p for g in a.param_groups for p in g["params"]]
    pb = [p for g in b.param_groups for p in g["params"]]
    for i, (x, y) in enumerate(zip(pa, pb)):
        sa, sb = a.state.get(x, {}), b.state.get(y, {})
        if list(sa) != list(sb):
            out.append(f"param {i}: keys {list(sa)} vs {list(sb)}")
            continue
        for k in sa:
            if not same(sa[k], sb[k]):
                out.append(f"param {i}: {k} differs ({sa[k]!r} vs {sb[k]!r})")
    return out


def modules_equal(a: torch.nn.Module, b: torch.nn.Module) -> list[str]:
    out = []
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        if not same(x, y):
            out.append(name)
    return out


def tensors_from_schema(
    schema: dict[str, Any], dtype: torch.dtype, seed: int = 0
) -> list[torch.Tensor]:
    """Parameters laid out as a manifest schema says: tied slots repeat the same tensor."""
    g = torch.Generator().manual_seed(seed)
    reps = schema["representatives"]
    out: list[torch.Tensor] = []
    for i, (shape, grad) in enumerate(zip(schema["shapes"], schema["requires_grad"])):
        r = None if reps is None else reps[i]
        if reps is not None and r is not None and r != i:
            out.append(out[r])
            continue
        t = torch.randn(tuple(shape), generator=g, dtype=torch.float64).to(dtype)
        out.append(torch.nn.Parameter(t, requires_grad=bool(grad)))
    return out


def step_once(opt: torch.optim.Optimizer, params: Sequence[torch.Tensor], seed: int = 1) -> None:
    """One optimizer step with pseudo-random gradients on the trainable parameters."""
    g = torch.Generator().manual_seed(seed)
    for p in {id(p): p for p in params}.values():
        if p.requires_grad:
            p.grad = torch.randn(p.shape, generator=g, dtype=torch.float64).to(p.dtype)
    opt.step()


def header_config(data: bytes) -> dict[str, Any] | None:
    """The (kind, betas, eps, weight decay) in a TLADAMF header, if it can be read and torch
    would accept it; used to give a destination optimizer the file's own config, so that a
    defect later in the file is the first one found."""
    if len(data) < 15 or data[:7] != b"TLADAMF":
        return None
    (version,) = struct.unpack_from("<Q", data, 7)
    pos = 15 + (8 if version == 5 else 0)
    if version not in (2, 3, 4, 5) or len(data) < pos + 40:
        return None
    (kind,) = struct.unpack_from("<Q", data, pos)
    beta1, beta2, eps, wd = struct.unpack_from("<4d", data, pos + 8)
    if kind not in (0, 1) or not (0 <= beta1 < 1 and 0 <= beta2 < 1 and eps > 1e-30 and wd >= 0):
        return None
    if kind == 0 and wd != 0:
        return None
    return {"kind": "adam" if kind == 0 else "adamw", "betas": (beta1, beta2), "eps": eps, "wd": wd}


def optimizer_for(config: dict[str, Any] | None, params: Sequence[torch.Tensor]):
    """An optimizer over the unique parameters, with ``config`` (or a default AdamW)."""
    unique = list({id(p): p for p in params}.values())
    if config is None:
        return torch.optim.AdamW(unique, lr=0.01)
    cls = torch.optim.Adam if config["kind"] == "adam" else torch.optim.AdamW
    return cls(unique, lr=0.01, betas=config["betas"], eps=config["eps"], weight_decay=config["wd"])


def hex_bits(config: dict[str, Any], name: str) -> float:
    """A manifest's ``<name>_bits`` hex as the Python float."""
    return struct.unpack("<d", struct.pack("<Q", int(config[f"{name}_bits"], 16)))[0]


def expect_unchanged_on_error(
    action: Callable[[], Any], checks: Sequence[Callable[[], bool]]
) -> CheckpointError | None:
    """Run ``action``; if it raises a CheckpointError return it after asserting ``checks``."""
    try:
        action()
    except CheckpointError as exc:
        for check in checks:
            assert check(), f"state changed although the load failed: {exc}"
        return exc
    return None


RESUME_K, RESUME_N = 3, 4


def resume_run(
    kind: str,
    dtype: torch.dtype,
    impl: str,
    folder: Path,
    *,
    tied: bool,
    counter: bool,
    device: str = "cpu",
) -> int:
    """Train k steps, save model + optimizer, load into fresh objects with a different
    initialisation, train n more; assert everything equals the uninterrupted k + n run.

    Returns the optimizer file's version.
    """
    from tlckpt.runtime import (
        load_module_state,
        load_optimizer,
        load_state_bits,
        save_module_state,
        save_optimizer,
        save_state_bits,
    )

    k, n = RESUME_K, RESUME_N
    torch.manual_seed(0)
    reference = TiedNet(dtype, tied=tied, dropout=counter).to(device)
    reference_opt = make_adam(kind, reference.parameters(), impl)
    train(reference, reference_opt, 0, k + n, device)

    torch.manual_seed(0)
    model = TiedNet(dtype, tied=tied, dropout=counter).to(device)
    opt = make_adam(kind, model.parameters(), impl)
    random_counter = train(model, opt, 0, k, device)
    model_file = folder / ("model.tlsf32" if dtype == torch.float32 else "model.json")
    if dtype == torch.float32:
        save_module_state(model, model_file)
    else:
        save_state_bits(model, model_file)
    version = save_optimizer(
        opt, model, folder / "opt.tladam", random_counter=random_counter if counter else None
    )
    del model, opt

    torch.manual_seed(1234)  # a different initialisation: the load must overwrite all of it
    fresh = TiedNet(dtype, tied=tied, dropout=counter).to(device)
    fresh_opt = make_adam(kind, fresh.parameters(), impl)
    assert modules_equal(reference, fresh), "the fresh model should start out different"
    if dtype == torch.float32:
        load_module_state(fresh, model_file)
    else:
        load_state_bits(fresh, model_file)
    restored = load_optimizer(
        fresh_opt, fresh, folder / "opt.tladam", restore_random_counter=counter
    )
    assert restored == (k if counter else None)
    train(fresh, fresh_opt, k, n, device)

    assert modules_equal(reference, fresh) == []
    assert optimizer_states_equal(reference_opt, fresh_opt) == []
    assert len(fresh_opt.state) == len(reference_opt.state)
    for p in fresh_opt.state:
        assert fresh_opt.state[p]["exp_avg"].device == p.device
    if tied:
        assert fresh.head.weight is fresh.emb.weight
    return version
