"""Sharded-checkpoint tests: helpers importable, a ``distributed`` marker, and the groups.

The checks run in two process groups (world sizes 2 and 3, gloo on 127.0.0.1), started
once per session by the ``groups`` fixture: each group runs all of its checks in one go
(start-up is the expensive part) and reports per rank; the tests then assert on those
reports. The single-process side (world size 1) runs in the pytest process itself.
Deselect with ``-m "not distributed"``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from tlckpt.testing.models import default_dtype

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "distributed: starts gloo process groups on this machine (CPU)"
    )


def _single_process_run(folder: Path) -> None:
    """World size 1: the reference run and its files, in this process."""
    from sharded_support import K, N, snapshot

    from tlckpt.runtime import save_module_state, save_optimizer, save_state_bits
    from tlckpt.testing.models import TiedNet, make_adam, train

    with default_dtype(torch.float32):
        folder.mkdir()
        torch.manual_seed(0)
        model = TiedNet()
        opt = make_adam("adamw", model.parameters())
        counter = train(model, opt, 0, K)
        save_module_state(model, folder / "model.tlsf32")
        save_state_bits(model, folder / "state.json")
        save_optimizer(opt, model, folder / "opt.tladam", random_counter=counter)
        torch.save(snapshot(model, opt), folder / "saved.pt")
        train(model, opt, K, N)
        torch.save(snapshot(model, opt), folder / "continued.pt")


@pytest.fixture(scope="session")
def groups(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Run world size 1 here, then the 2- and 3-rank groups; their reports and timings."""
    from sharded_support import CHECKS_OF_WORLD, launch

    workdir = tmp_path_factory.mktemp("sharded")
    start = time.perf_counter()
    _single_process_run(workdir / "w1")
    out: dict[str, Any] = {"workdir": workdir, "seconds": {1: time.perf_counter() - start}}
    for world in (2, 3):
        results, elapsed, output = launch(world, workdir, CHECKS_OF_WORLD[world])
        if not any(results):  # nothing ran at all (say, the free port was taken): once more
            results, elapsed, output = launch(world, workdir, CHECKS_OF_WORLD[world])
        out[world] = results
        out["seconds"][world] = elapsed
        out[f"output{world}"] = output
    return out
