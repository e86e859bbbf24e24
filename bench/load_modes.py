"""Time ``load_module_state`` staged vs in place on 512 MiB of float32 state (page cache warm).

    .venv/bin/python -m bench.load_modes [--mib 512] [--reps 7] [--tmp DIR] [--device cpu]

For one tensor and for 48 tensors, prints the median and best of ``--reps`` loads of each
way the library offers (a library without the ``staged`` keyword is timed as it is, under
the label ``before``), next to ``torch.load`` + ``load_state_dict`` of the same state (which
also reads into fresh memory and then copies), reading the file into an existing buffer (the
I/O floor) and one ``copy_`` of the state. The repetitions of the ways alternate, so that a
busy machine's drift spreads over all of them. A figure-printing script, not a test.
"""

from __future__ import annotations

import argparse
import inspect
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

import tlckpt


def _model(count: int, total: int, device: str) -> torch.nn.ParameterList:
    per = total // count
    torch.manual_seed(0)
    return torch.nn.ParameterList(
        torch.nn.Parameter(torch.randn(per, device=device)) for _ in range(count)
    )


def _ways(model: torch.nn.ParameterList, folder: Path, count: int) -> dict[str, Callable]:
    path = folder / f"m{count}.tlsf32"
    tlckpt.save_module_state(model, path)
    pt = folder / f"m{count}.pt"
    torch.save(model.state_dict(), pt)
    buffer = bytearray(path.stat().st_size)
    clone = [p.detach().clone() for p in model]

    def read_floor() -> None:
        with open(path, "rb", buffering=0) as f:
            f.readinto(buffer)

    def copy_once() -> None:
        with torch.no_grad():
            for p, c in zip(model, clone):
                p.copy_(c)

    ways: dict[str, Callable] = {"read floor": read_floor, "one copy_": copy_once}
    if "staged" in inspect.signature(tlckpt.load_module_state).parameters:
        ways["staged"] = lambda: tlckpt.load_module_state(model, path)
        ways["in place"] = lambda: tlckpt.load_module_state(model, path, staged=False)
    else:
        ways["before"] = lambda: tlckpt.load_module_state(model, path)
    ways["torch.load"] = lambda: model.load_state_dict(torch.load(pt, weights_only=True))
    return ways


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=512)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--tmp", default=None)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    total = args.mib * 2**20 // 4
    print(f"{args.mib} MiB float32, device {args.device}, {torch.get_num_threads()} threads")
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        for count in (1, 48):
            model = _model(count, total, args.device)
            ways = _ways(model, Path(tmp), count)
            times: dict[str, list[float]] = {label: [] for label in ways}
            for way in ways.values():
                way()  # warm: the page cache holds the files, allocator pools are primed
            for _ in range(args.reps):
                for label, way in ways.items():
                    start = time.perf_counter()
                    way()
                    if args.device != "cpu":
                        torch.cuda.synchronize()
                    times[label].append(time.perf_counter() - start)
            nbytes = total * 4
            for label, values in times.items():
                median = statistics.median(values)
                print(
                    f"  {count:2d} tensors  {label:<10} median {median * 1e3:8.1f} ms"
                    f"  best {min(values) * 1e3:8.1f} ms  ({nbytes / median / 1e9:5.2f} GB/s)"
                )


if __name__ == "__main__":
    main()
