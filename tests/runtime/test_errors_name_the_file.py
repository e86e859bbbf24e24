"""Every ``CheckpointError`` a public function raises names the file it was given.

``exc.path`` is the path as given (``str``), and the message starts with it — for rejections
of the file and just as much for refusals of the caller's input raised before the file is
opened (``save_optimizer``'s refusals, with ``require_torchlean=True`` those of what
TorchLean's versions cannot hold, ``save_module_state``'s
dtype refusals, the codec writers' input checks) or after it was read (the random-counter
refusal of ``load_optimizer``, tie conflicts, binding refusals).
"""

from __future__ import annotations

import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import tlckpt
from tlckpt.codec import (
    AdamConfig,
    AdamEntry,
    AdamKind,
    CheckpointError,
    OptimizerEntry,
    ParameterSchema,
    ParamGroupConfig,
    inspect,
    read_adam,
    read_float32_state,
    read_optimizer_state,
    read_state_bits,
    scan_adam,
    scan_float32_state,
    scan_optimizer_state,
    sniff_family,
    validate_float32_state,
    write_adam,
    write_float32_state,
    write_optimizer_state,
    write_state_bits,
)
from tlckpt.testing.adam import adamw_config

SCHEMA = ParameterSchema([(2,), (3,)], [True, True])
CONFIG = adamw_config()
GROUP = ParamGroupConfig(AdamKind.ADAMW, 0.9, 0.999, 1e-8, 0.01, 1e-3)


def _entries(dtype: str = "<f4") -> dict[int, AdamEntry]:
    return {i: AdamEntry(1, np.ones(n, dtype), np.ones(n, dtype)) for i, n in ((0, 2), (1, 3))}


def _net(dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2)).to(dtype)


def _stepped(model: torch.nn.Module, **options: Any) -> torch.optim.Optimizer:
    opt = options.pop("cls", torch.optim.AdamW)(model.parameters(), **options)
    model(torch.ones(1, 3, dtype=next(model.parameters()).dtype)).sum().backward()
    opt.step()
    return opt


class _Tied(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(3, 3, bias=False)
        self.b = torch.nn.Linear(3, 3, bias=False)
        self.b.weight = self.a.weight


# ------------------------------------------------------------------------------ cases
# Each case gets the path (a file may exist there already) and must raise CheckpointError.


def _save_optimizer_groups(path: Path) -> None:
    model = _net()
    params = list(model.parameters())
    opt = _stepped(model)
    opt = torch.optim.AdamW([{"params": params[:2]}, {"params": params[2:], "eps": 1e-3}])
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    tlckpt.save_optimizer(opt, model, path, require_torchlean=True)


def _save_optimizer_partial(path: Path) -> None:
    model = _net()
    opt = _stepped(model)
    del opt.state[model[1].bias]
    tlckpt.save_optimizer(opt, model, path, require_torchlean=True)


def _load_optimizer_other_groups(path: Path) -> None:
    model = _net()
    params = list(model.parameters())
    opt = torch.optim.AdamW([{"params": params[:2]}, {"params": params[2:], "eps": 1e-3}])
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    tlckpt.save_optimizer(opt, model, path)  # TLCKOPT
    tlckpt.load_optimizer(_stepped(model), model, path)  # one group: refused


def _save_optimizer_foreign_param(path: Path) -> None:
    model = _net()
    opt = _stepped(model)
    tlckpt.save_optimizer(opt, list(model.parameters())[:3], path)


def _load_optimizer_counter(path: Path) -> None:
    model = _net()
    opt = _stepped(model)
    tlckpt.save_optimizer(opt, model, path, random_counter=5)
    tlckpt.load_optimizer(opt, model, path)  # no restore_random_counter: refused


def _load_optimizer_other_model(path: Path) -> None:
    model = _net()
    opt = _stepped(model)
    tlckpt.save_optimizer(opt, model, path)
    other = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.Linear(5, 2))
    tlckpt.load_optimizer(_stepped(other), other, path)


def _load_optimizer_amsgrad(path: Path) -> None:
    model = _net()
    tlckpt.save_optimizer(_stepped(model), model, path)
    tlckpt.load_optimizer(_stepped(model, amsgrad=True), model, path)


def _load_module_tie_conflict(path: Path) -> None:
    write_float32_state(path, [np.zeros((3, 3), "<f4"), np.ones((3, 3), "<f4")])
    tlckpt.load_module_state(_Tied(), path)


def _load_bits_tie_conflict(path: Path) -> None:
    write_state_bits(path, [np.zeros((3, 3), "<f4"), np.ones((3, 3), "<f4")], "float32")
    tlckpt.load_state_bits(_Tied(), path)


def _load_module_float64(path: Path) -> None:
    write_float32_state(path, [np.zeros(2, "<f4")])
    tlckpt.load_module_state([torch.zeros(2, dtype=torch.float64)], path)


def _load_module_shape(path: Path) -> None:
    write_float32_state(path, [np.zeros(2, "<f4")])
    tlckpt.load_module_state([torch.zeros(3)], path)


def _load_bits_integer(path: Path) -> None:
    write_state_bits(path, [np.array([0.5], "<f4"), np.zeros(1, "<f4")], "float32")
    tlckpt.load_state_bits([torch.zeros(1), torch.zeros(1, dtype=torch.int64)], path)
    tlckpt.load_state_bits([torch.zeros(1, dtype=torch.int64), torch.zeros(1)], path)


CASES: dict[str, Callable[[Path], Any]] = {
    # --- save_optimizer refusals (checked before the first byte)
    "save_optimizer: SGD for TorchLean": lambda p: tlckpt.save_optimizer(
        _stepped(m := _net(), cls=torch.optim.SGD, lr=0.1), m, p, require_torchlean=True
    ),
    "save_optimizer: amsgrad": lambda p: tlckpt.save_optimizer(
        _stepped(m := _net(), amsgrad=True), m, p, require_torchlean=True
    ),
    "save_optimizer: groups differ": _save_optimizer_groups,
    "save_optimizer: Adam with weight decay": lambda p: tlckpt.save_optimizer(
        _stepped(m := _net(), cls=torch.optim.Adam, weight_decay=0.1), m, p, require_torchlean=True
    ),
    "save_optimizer: float16 moments": lambda p: tlckpt.save_optimizer(
        torch.optim.AdamW((m := _net(torch.float16)).parameters()), m, p, require_torchlean=True
    ),
    "save_optimizer: complex moments": lambda p: tlckpt.save_optimizer(
        torch.optim.AdamW(c := [torch.nn.Parameter(torch.ones(2, dtype=torch.complex64))]), c, p
    ),
    "save_optimizer: no step": lambda p: tlckpt.save_optimizer(
        torch.optim.AdamW((m := _net()).parameters()), m, p, require_torchlean=True
    ),
    "save_optimizer: a slot without state": _save_optimizer_partial,
    "save_optimizer: a parameter not given": _save_optimizer_foreign_param,
    "save_optimizer: bad counter": lambda p: tlckpt.save_optimizer(
        _stepped(m := _net()), m, p, random_counter=-1
    ),
    # --- load_optimizer refusals outside the codec
    "load_optimizer: random counter": _load_optimizer_counter,
    "load_optimizer: amsgrad": _load_optimizer_amsgrad,
    "load_optimizer: other model": _load_optimizer_other_model,
    "load_optimizer: other param groups": _load_optimizer_other_groups,
    # --- module state
    "save_module_state: float64": lambda p: tlckpt.save_module_state(_net(torch.float64), p),
    "save_module_state: int64 not exact": lambda p: tlckpt.save_module_state(
        [torch.zeros(2), torch.tensor([2**40 + 1])], p
    ),
    "save_module_state: not a tensor": lambda p: tlckpt.save_module_state(
        {"w": torch.zeros(1), "x": 3}, p
    ),
    "load_module_state: tie conflict": _load_module_tie_conflict,
    "load_module_state: float64": _load_module_float64,
    "load_module_state: shape": _load_module_shape,
    "save_state_bits: mixed dtypes": lambda p: tlckpt.save_state_bits(
        [torch.zeros(1), torch.zeros(1, dtype=torch.float64)], p
    ),
    "save_state_bits: int not exact": lambda p: tlckpt.save_state_bits(
        [torch.zeros(1, dtype=torch.float16), torch.tensor([4097])], p
    ),
    "load_state_bits: tie conflict": _load_bits_tie_conflict,
    "load_state_bits: integer value": _load_bits_integer,
    # --- codec writers: caller input
    "write_adam: schema": lambda p: write_adam(
        p, ParameterSchema([(2,)], [True], [None]), CONFIG, {}
    ),
    "write_adam: config type": lambda p: write_adam(p, SCHEMA, "adamw", _entries()),
    "write_adam: invalid config": lambda p: write_adam(
        p, SCHEMA, AdamConfig(AdamKind.ADAM, 1.0, 0.999, 1e-8, 0.0), _entries()
    ),
    "write_adam: counter": lambda p: write_adam(p, SCHEMA, CONFIG, _entries(), 2**64),
    "write_adam: missing entry": lambda p: write_adam(p, SCHEMA, CONFIG, {0: _entries()[0]}),
    "write_adam: entry dtype": lambda p: write_adam(p, SCHEMA, CONFIG, _entries("<f8")),
    "write_adam: lazy entry dtype": lambda p: write_adam(
        p, SCHEMA, CONFIG, types.MappingProxyType(_entries("<f8"))
    ),
    "write_adam: version": lambda p: write_adam(p, SCHEMA, CONFIG, _entries(), version=9),
    "write_optimizer_state: groups": lambda p: write_optimizer_state(
        p, SCHEMA, [GROUP, "adamw"], [0, 1], {}
    ),
    "write_optimizer_state: slot groups": lambda p: write_optimizer_state(
        p, SCHEMA, [GROUP], [0, 1], {}
    ),
    "write_optimizer_state: entry": lambda p: write_optimizer_state(
        p, SCHEMA, [GROUP], [0, 0], {1: OptimizerEntry(1, "bfloat16", np.ones(3, "<f4"), None)}
    ),
    "write_float32_state: dtype": lambda p: write_float32_state(p, [np.zeros(2, "<f8")]),
    "write_float32_state: count": lambda p: write_float32_state(
        p, iter([np.zeros(2, "<f4")]), count=2
    ),
    "write_state_bits: encoding": lambda p: write_state_bits(p, [np.zeros(2, "<f4")], "float7"),
    "write_state_bits: dtype": lambda p: write_state_bits(p, [np.zeros(2, "<f8")], "float32"),
    # --- codec readers: arguments refused before opening, and the file itself
    "read_adam: dtype argument": lambda p: read_adam(p, SCHEMA, dtype="float16"),
    "read_state_bits: encoding argument": lambda p: read_state_bits(p, [(2,)], "float7"),
    "read_adam: file": lambda p: (p.write_bytes(b"TLADAMF"), read_adam(p, SCHEMA)),
    "scan_adam: file": lambda p: (p.write_bytes(b"TLSF32B\1"), scan_adam(p)),
    "read_optimizer_state: file": lambda p: (
        p.write_bytes(b"TLCKOPT" + bytes(9)),
        read_optimizer_state(p, SCHEMA),
    ),
    "scan_optimizer_state: file": lambda p: (p.write_bytes(b"TLCKOPT"), scan_optimizer_state(p)),
    "read_float32_state: file": lambda p: (
        write_float32_state(p, [np.zeros(2, "<f4")]),
        read_float32_state(p, [(3,)]),
    ),
    "validate_float32_state: file": lambda p: (
        write_float32_state(p, [np.zeros(2, "<f4")]),
        validate_float32_state(p, [(3,)]),
    ),
    "scan_float32_state: file": lambda p: (p.write_bytes(b"TLSF32"), scan_float32_state(p)),
    "inspect: file": lambda p: (p.write_bytes(b"not a checkpoint"), inspect(p)),
    "sniff_family: file": lambda p: (p.write_bytes(b"PK\3\4"), sniff_family(p)),
}


class _Text(str):
    """A path given as text; cases that write the file first may still call write_bytes."""

    def write_bytes(self, data: bytes) -> int:
        return Path(self).write_bytes(data)


@pytest.mark.parametrize("as_text", [False, True], ids=["Path", "str"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_every_refusal_names_the_file(case: str, as_text: bool, tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.bin"
    with pytest.raises(CheckpointError) as info:
        CASES[case](_Text(path) if as_text else path)
    exc = info.value
    assert exc.path == str(path), (exc.path, str(exc))
    assert str(exc).startswith(str(path)), str(exc)
