"""Checkpoint sets on S3 (moto on 127.0.0.1): tlckpt's upload and restore against s3fs's
``put`` and ``get`` of the same bytes.

Run from the repository root (not part of ``python -m bench``: a 1 GiB set takes minutes
through moto)::

    nice -n 10 .venv/bin/python -m bench.remote [--size-mib 1024] [--reps 2]

A model (``Linear`` layers of 1024 x 1024 float32) and its AdamW after one step, sized so
that the set (model, two moments, training state) is ``--size-mib``. moto's S3 server runs
as a child process (its request handling does not share this process's GIL). Timed in turns,
``--reps`` times each:

* upload: ``CheckpointManager("s3://…").save(step)`` (members streamed through the digesting
  writers into multipart uploads, manifest created last) against ``s3fs.put`` of the very
  files of that set, written to a local folder beforehand (untimed);
* restore: ``CheckpointManager("s3://…").restore(...)`` (ranged reads hashed as they arrive
  into a staging folder, then the verified load) against ``s3fs.get`` of the set's objects to
  a local folder followed by ``load_checkpoint`` of it.

Every object is removed between repetitions (moto keeps them in memory). Prints a Markdown
table of the times, each repetition and the ratios (tlckpt / s3fs), and the goals: upload
at most 1.2x put, restore at most 1.2x get + load. moto's own request handling (parsing,
copying every part into its in-memory store, assembling the parts of a multipart upload)
dominates both sides: these are ratios on a slow server, not S3's throughput.
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

WIDTH = 1024
MIB = 1 << 20


def _state(size_mib: int) -> tuple[Any, Any]:
    import torch

    layers = max(1, size_mib * MIB // (3 * WIDTH * WIDTH * 4))  # model + two moments
    torch.manual_seed(0)
    model = torch.nn.Sequential(*(torch.nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(layers)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, WIDTH)).sum().backward()
    opt.step()
    return model, opt


def _timed(run: Any) -> float:
    gc.collect()
    started = time.perf_counter()
    run()
    return time.perf_counter() - started


def measure(size_mib: int, reps: int) -> dict[str, list[float]]:
    """The times of every way, ``reps`` each, in turns."""
    import fsspec
    import torch

    from tlckpt import CheckpointManager, load_checkpoint, save_checkpoint
    from tlckpt.testing.s3_server import local_s3

    model, opt = _state(size_mib)
    reference = [p.detach().clone() for p in model.parameters()]

    def zeroed() -> None:
        with torch.no_grad():
            for p in model.parameters():
                p.zero_()

    def landed() -> None:
        if not all(torch.equal(p, r) for p, r in zip(model.parameters(), reference)):
            raise AssertionError("a load did not land the saved values")

    scratch = Path(tempfile.mkdtemp(prefix="tlckpt-bench-remote-"))
    times: dict[str, list[float]] = {"save": [], "put": [], "restore": [], "get+load": []}
    try:
        local = scratch / "step-00000000000000000001"
        save_checkpoint(local, model=model, optimizer=opt, step=1)
        total = sum(f.stat().st_size for f in local.iterdir())
        print(f"set of {total / MIB:.0f} MiB: {sorted(f.name for f in local.iterdir())}")
        with local_s3("bench", child_process=True) as s3:
            fs = fsspec.filesystem("s3", skip_instance_cache=True, **s3.storage_options)
            for rep in range(reps):
                url = s3.root(f"rep{rep}")
                manager = CheckpointManager(url, storage_options=s3.storage_options)
                put_to = f"bench/put{rep}/step-00000000000000000001"
                got = scratch / f"got{rep}"

                def put(to: str = put_to) -> None:
                    fs.put(str(local), to, recursive=True)

                def save(into: Any = manager) -> None:
                    into.save(1, model=model, optimizer=opt)

                def get_and_load(source: str = put_to, to: Path = got) -> None:
                    fs.get(source, str(to), recursive=True)
                    load_checkpoint(to, model=model, optimizer=opt)

                def restore(source: Any = manager) -> None:
                    source.restore(model=model, optimizer=opt)

                times["put"].append(_timed(put))
                times["save"].append(_timed(save))

                zeroed()
                times["get+load"].append(_timed(get_and_load))
                landed()
                zeroed()
                times["restore"].append(_timed(restore))
                landed()
                shutil.rmtree(got)
                fs.rm(f"bench/put{rep}", recursive=True)
                fs.rm(f"bench/rep{rep}", recursive=True)
                print(f"rep {rep}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in times.items()))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return times


def report(times: dict[str, list[float]], size_mib: int) -> str:
    """The Markdown table and the goals."""
    med = {k: statistics.median(v) for k, v in times.items()}
    lines = [
        f"S3 (moto on 127.0.0.1, child process), a {size_mib} MiB set; load average"
        f" {os.getloadavg()[0]:.1f}",
        "",
        "| way | median s | each repetition |",
        "|---|---|---|",
    ]
    lines += [
        f"| {k} | {med[k]:.2f} | {', '.join(f'{t:.2f}' for t in v)} |" for k, v in times.items()
    ]
    upload, restore = med["save"] / med["put"], med["restore"] / med["get+load"]
    lines += [
        "",
        f"* upload: tlckpt save / s3fs put = {upload:.2f} (goal <= 1.2:"
        f" {'met' if upload <= 1.2 else 'NOT met'})",
        f"* restore: tlckpt restore / (s3fs get + load) = {restore:.2f} (goal <= 1.2:"
        f" {'met' if restore <= 1.2 else 'NOT met'})",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--reps", type=int, default=2)
    args = parser.parse_args(argv)
    print(report(measure(args.size_mib, args.reps), args.size_mib))
    return 0


if __name__ == "__main__":
    sys.exit(main())
