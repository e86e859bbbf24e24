"""Describing files of very many small records: ``inspect`` and the ``scan_*`` readers.

Run from the repository root::

    .venv/bin/python -m bench.scan_records            # 10^6 tensors, 10^5 Adam slots
    .venv/bin/python -m bench.scan_records --records 100000 --slots 10000

Writes, in a scratch folder, a ``TLSF32B`` file of empty tensors, one of one-element tensors,
one of tensors whose shapes change from one record to the next (the case runs of alike records
do not help), and an Adam file of one-element slots; then prints the best of ``--reps`` times
of ``inspect`` and of ``scan_float32_state`` / ``scan_adam`` on each, and (one run each) the
same with the batched record scanning switched off: every record walked field by field, as
before it existed.
Prints figures only; nothing is asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from tlckpt.codec import (
    AdamConfig,
    AdamEntry,
    AdamKind,
    ParameterSchema,
    inspect,
    scan_adam,
    scan_float32_state,
    write_adam,
    write_float32_state,
)
from tlckpt.codec.model_state.float32_state_writer import write_float32_extents
from tlckpt.codec.spec import walker


@contextlib.contextmanager
def _batches(on: bool) -> Iterator[None]:
    saved = walker.MIN_BATCH
    if not on:
        walker.MIN_BATCH = 1 << 62  # no run is ever that long: every record is walked
    try:
        yield
    finally:
        walker.MIN_BATCH = saved


def _best(fn: Callable[[], object], reps: int) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def varied_shape(i: int) -> tuple[int, ...]:
    """Record ``i`` of a file whose every record differs in shape from the one before (and
    holds no element)."""
    k = i % 3
    return (0,) if k == 0 else (1 + i % 5, 0) if k == 1 else (0, 1 + i % 7, 2)


def write_many(folder: str | Path, records: int) -> dict[str, str]:
    """Files of ``records`` empty tensors: alike ``(0,)``, and of changing shapes (the
    benchmark's ``inspect`` workload). Written through the bulk writer: headers only."""
    out = {}
    for label, shapes in (
        ("alike", [(0,)] * records),
        ("varied", [varied_shape(i) for i in range(records)]),
    ):
        path = os.path.join(folder, f"many-{label}.tlsf32")
        write_float32_extents(path, shapes, [0] * records, [])
        out[label] = path
    return out


def _files(folder: Path, records: int, slots: int) -> dict[str, Path]:
    files = {
        f"TLSF32B, {records:,} empty tensors": (folder / "empty.tlsf32", [(0,)] * records),
        f"TLSF32B, {records:,} one-element tensors": (folder / "one.tlsf32", [(1,)] * records),
        f"TLSF32B, {records:,} tensors of changing shapes": (
            folder / "varied.tlsf32",
            [(i % 7,) if i % 2 else (1, i % 3) for i in range(records)],
        ),
    }
    out = {}
    for label, (path, shapes) in files.items():
        arrays = (np.zeros(s, np.float32) for s in shapes)
        write_float32_state(path, arrays, count=len(shapes))
        out[label] = path
    schema = ParameterSchema([(1,)] * slots, [True] * slots)
    one = np.zeros(1, np.float32)
    entries = {i: AdamEntry(i + 1, one, one) for i in range(slots)}
    adam = folder / "adam.tladam"
    write_adam(adam, schema, AdamConfig(AdamKind.ADAMW, 0.9, 0.999, 1e-8, 0.01), entries)
    out[f"TLADAMF, {slots:,} one-element slots"] = adam
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scan_records", description=__doc__)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--slots", type=int, default=100_000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--tmp", default=None, help="parent of the scratch folder")
    parser.add_argument("--skip-walked", action="store_true", help="batched timings only")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tlckpt-scan-", dir=args.tmp) as tmp:
        files = _files(Path(tmp), args.records, args.slots)
        head = f"{'file':48} {'size':>9}  {'inspect':>8} {'scan':>8}"
        print(head + ("" if args.skip_walked else f"  {'walked: inspect':>15} {'scan':>8}"))
        for label, path in files.items():
            scan = scan_adam if path.suffix == ".tladam" else scan_float32_state
            row = []
            for on in (True, False) if not args.skip_walked else (True,):
                reps = args.reps if on else 1  # walked record by record: slow, once is enough
                with _batches(on):
                    row.append(_best(lambda p=path: inspect(p), reps))
                    row.append(_best(lambda p=path, s=scan: s(p), reps))
            size = os.path.getsize(path) / 1e6
            figures = "  ".join(f"{a:7.2f}s {b:7.2f}s" for a, b in zip(row[::2], row[1::2]))
            print(f"{label:48} {size:7.1f}MB  {figures}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
