"""Helpers of the tests of special files and stray entries in checkpoint-set folders: a call
bounded by a deadline (a regression fails rather than hangs the suite), a set saved to damage,
and a manifest edited and resealed (its own digest recomputed, as an editor of the folder can).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from tlckpt import CheckpointManager
from tlckpt.codec.sets.set_documents import self_digest

#: Seconds any of these calls may take: they read a few KiB.
DEADLINE = 15.0


def within(call: Callable[[], Any], seconds: float = DEADLINE) -> Any:
    """``call()``'s result (or its exception, raised here), or a failed test if it has not
    returned after ``seconds``.

    The call runs on a daemon thread: one that hangs is left behind (it ends with the test
    process), and the test fails instead of blocking the suite.
    """
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = call()
        except BaseException as exc:  # handed to the test thread, which raises it
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise AssertionError(f"still blocked after {seconds} s: the call hangs")
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


def release_fifo(path: Path) -> None:
    """Open the FIFO at ``path`` for writing and close it at once: a reader blocked on
    opening it (the bug under test) gets end of file and lets its thread end."""
    with contextlib.suppress(OSError):
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))


def small_run() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """A trained Linear(4, 3) and its AdamW."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    return model, opt


def saved_sets(directory: Path, steps: list[int]) -> list[Path]:
    """The folders of sets saved for ``steps`` in ``directory`` (every one kept)."""
    model, opt = small_run()
    manager = CheckpointManager(directory)
    return [manager.save(s, model=model, optimizer=opt).wait() for s in steps]


def reseal(folder: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    """Apply ``edit`` to the manifest of the set in ``folder`` and recompute its own digest
    (what anyone who can write the folder can do)."""
    path = folder / "manifest.json"
    document = json.loads(path.read_bytes())
    edit(document)
    document["self_digest"] = self_digest(document)
    path.write_bytes(json.dumps(document).encode())
