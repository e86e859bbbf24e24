"""A local ``TLADAMF`` load reads its moments in bulk (``runtime/ops/optimizer_bulk.py``): the
same state as the streaming read, the same refusals, and a file changed between the check and
the reads refused with the optimizer untouched."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

from tlckpt.codec import FileChangedError
from tlckpt.codec.fileio import leases
from tlckpt.runtime import load_optimizer, save_optimizer
from tlckpt.runtime.ops import optimizer_bulk
from tlckpt.testing.models import TiedNet, make_adam, train


def _trained(dtype: torch.dtype, seed: int, steps: int) -> tuple[torch.nn.Module, Any]:
    torch.manual_seed(seed)
    model = TiedNet(dtype, tied=True)
    opt = make_adam("adamw", model.parameters(), "default")
    train(model, opt, 0, steps)
    return model, opt


def _state_bits(opt: Any) -> list[tuple[str, bytes]]:
    out = []
    for group in opt.param_groups:
        for p in group["params"]:
            for key, value in sorted(opt.state[p].items()):
                out.append((key, value.contiguous().view(-1).view(torch.uint8).numpy().tobytes()))
    return out


class _Taken:
    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self.results: list[bool] = []
        real = optimizer_bulk.read_adam_in_bulk

        def spy(*args: Any) -> Any:
            out = real(*args)
            self.results.append(out is not None)
            return out

        monkeypatch.setattr(optimizer_bulk, "read_adam_in_bulk", spy)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_path_is_read_in_bulk_into_the_same_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype
) -> None:
    model, opt = _trained(dtype, 0, 3)
    path = tmp_path / "o.tladam"
    save_optimizer(opt, model, path)
    taken = _Taken(monkeypatch)
    bulk_model, bulk_opt = _trained(dtype, 1, 1)
    load_optimizer(bulk_opt, bulk_model, path)
    streamed_model, streamed_opt = _trained(dtype, 1, 1)
    with open(path, "rb") as f:  # a file object: the streaming read
        load_optimizer(streamed_opt, streamed_model, f)
    assert taken.results == [True, False]
    assert _state_bits(bulk_opt) == _state_bits(opt) == _state_bits(streamed_opt)


def test_a_file_changed_after_its_check_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No lease granted (the writer's open would otherwise wait): the file is rewritten in
    place between the checking pass and the reads; the stamps see it, nothing changes."""
    model, opt = _trained(torch.float32, 0, 3)
    path = tmp_path / "o.tladam"
    save_optimizer(opt, model, path)
    monkeypatch.setattr(leases, "_break_seconds", lambda: 1.0)
    real = optimizer_bulk.read_extents

    def rewrite_then_read(*args: Any) -> None:
        data = path.read_bytes()
        with open(path, "r+b") as f:
            f.write(data[::-1][: len(data)])  # same size, other bytes
            f.flush()
            os.fsync(f.fileno())
        real(*args)

    monkeypatch.setattr(optimizer_bulk, "read_extents", rewrite_then_read)
    live_model, live_opt = _trained(torch.float32, 1, 1)
    before = _state_bits(live_opt)
    with pytest.raises(FileChangedError):
        load_optimizer(live_opt, live_model, path)
    assert _state_bits(live_opt) == before
