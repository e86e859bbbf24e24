"""Helpers shared by the runtime tests: parameters laid out as a manifest says, optimizers
for a file's header, and the resume check (model, training and comparisons come from
:mod:`tlckpt.testing.models` and :mod:`tlckpt.testing.bitwise`)."""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from tlckpt import runtime
from tlckpt.codec.errors import CheckpointError
from tlckpt.testing.bitwise import modules_equal, optimizer_states_equal
from tlckpt.testing.models import TiedNet, make_adam, train


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
        runtime.save_module_state(model, model_file)
    else:
        runtime.save_state_bits(model, model_file)
    version = runtime.save_optimizer(
        opt, model, folder / "opt.tladam", random_counter=random_counter if counter else None
    )
    del model, opt

    torch.manual_seed(1234)  # a different initialisation: the load must overwrite all of it
    fresh = TiedNet(dtype, tied=tied, dropout=counter).to(device)
    fresh_opt = make_adam(kind, fresh.parameters(), impl)
    assert modules_equal(reference, fresh), "the fresh model should start out different"
    if dtype == torch.float32:
        runtime.load_module_state(fresh, model_file)
    else:
        runtime.load_state_bits(fresh, model_file)
    restored = runtime.load_optimizer(
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
