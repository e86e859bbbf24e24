"""Rank 0's peak memory while saving a sharded model and its optimizer.

Run it alone to print the figures (it starts a 2-rank gloo group on this machine)::

    .venv/bin/python tests/distributed/measure_memory.py [WORLD]

The tests run :func:`measure` inside their own 2-rank group. The model is ``LAYERS``
square float32 ``Linear`` weights of ``WIDTH`` x ``WIDTH``, each its own FSDP2 group. The
peak is the resident set's high-water mark (``VmHWM``, reset by writing ``5`` to
``/proc/self/clear_refs``) during the save, minus the resident set just before it; workers
run with ``MALLOC_MMAP_THRESHOLD_`` set so that freed buffers leave the resident set.
Expected: about one full parameter (model) or two (the optimizer: ``m`` and ``v`` of one
parameter), never the model's size.
"""

from __future__ import annotations

import gc
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch.distributed as dist

from tlckpt.testing.processes import PeakProbe, current_rss

WIDTH, LAYERS = 2048, 8
MIB = 1 << 20


def measure(mesh: Any, folder: Path) -> dict[str, Any]:
    """Inside a group (every rank calls it): save a large sharded model and its AdamW;
    return this rank's figures in bytes (rank 0's are the ones that matter)."""

    from tlckpt.runtime import save_module_state, save_optimizer
    from tlckpt.runtime.binding.dtensors import local_tensor
    from tlckpt.testing.models import sharded_linears

    model, opt = sharded_linears(mesh, WIDTH, LAYERS)
    if dist.get_rank() == 0:
        folder.mkdir(parents=True, exist_ok=True)
    figures: dict[str, Any] = {}
    probe = PeakProbe()
    for what, save in [
        ("model", lambda: save_module_state(model, folder / "model.tlsf32")),
        ("optimizer", lambda: save_optimizer(opt, model, folder / "opt.tladam")),
    ]:
        gc.collect()
        dist.barrier()
        before = current_rss()
        probe.reset()
        save()
        figures[f"{what}_save_peak_growth"] = probe.peak() - before
        figures[f"{what}_rss_before"] = before
    params = list(model.parameters())
    figures["full_parameter"] = WIDTH * WIDTH * 4
    figures["model_size"] = LAYERS * WIDTH * WIDTH * 4
    figures["own_shards"] = sum(local_tensor(p).numel() * 4 for p in params)
    figures["own_moment_shards"] = 2 * figures["own_shards"]
    figures["file_bytes"] = (folder / "model.tlsf32").stat().st_size if dist.get_rank() == 0 else 0
    dist.barrier()
    return figures


def report(figures: dict[str, Any], world: int) -> str:
    """The figures as lines of MiB."""
    f = {k: v / MIB for k, v in figures.items() if isinstance(v, int)}
    return "\n".join(
        [
            f"rank 0 of {world}: model {f['model_size']:.0f} MiB in {LAYERS} parameters of"
            f" {f['full_parameter']:.0f} MiB; rank 0 holds {f['own_shards']:.0f} MiB of"
            f" parameter shards and {f['own_moment_shards']:.0f} MiB of moment shards",
            f"  save_module_state: resident set grew by {f['model_save_peak_growth']:.1f} MiB"
            f" at its peak (from {f['model_rss_before']:.0f} MiB)",
            f"  save_optimizer:    resident set grew by {f['optimizer_save_peak_growth']:.1f}"
            f" MiB at its peak (from {f['optimizer_rss_before']:.0f} MiB)",
        ]
    )


def main() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from sharded_support import launch

    world = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / f"w{world}").mkdir()
        results, elapsed, output = launch(world, Path(tmp), ["memory"])
        figures = results[0].get("memory", {})
        if not figures.get("ok"):
            print(output)
            raise SystemExit("the measurement failed")
        print(report(figures, world))
        print(f"({elapsed:.1f} s)")


if __name__ == "__main__":
    main()
