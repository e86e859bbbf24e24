"""One case in its own process: ``python -m bench.worker '<json spec>'``.

The spec names the case, the run mode (``full``/``quick``), the repetitions, the untimed
warm-up calls and a scratch folder. The worker times its imports first (numpy, torch, then
the case's library, each on top of the previous ones), builds the live state, runs every
operation ``warmup`` times untimed (first-call costs, reported apart) and then ``reps``
times, verifies one more load, and prints one line ``BENCH-RESULT <json>`` on stdout.

Around each repetition: the operation's untimed preparation, ``os.sync()``,
``gc.collect()``, RSS before, peak-RSS reset, the timed call, peak and RSS after.
Growth = peak - RSS before (what the operation needed on top of the live state);
retained = RSS after - RSS before.
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import sys
import time
from typing import TYPE_CHECKING

from bench.rss import PeakProbe, current_rss

if TYPE_CHECKING:
    from bench.cases import Op

__all__ = ["MARKER", "main"]

MARKER = "BENCH-RESULT "


def _timed_import(name: str) -> float:
    t0 = time.perf_counter()
    importlib.import_module(name)
    return time.perf_counter() - t0


def _measure(op: Op, probe: PeakProbe) -> dict:
    """One call of ``op``: untimed preparation, then time, peak and retained RSS."""
    info = op.prepare() if op.prepare is not None else None
    # A clean slate: no dirty page, ours or another process's, is written back while we time.
    os.sync()
    gc.collect()
    before = current_rss()
    probe.reset()
    t0 = time.perf_counter()
    splits = op.run()
    seconds = time.perf_counter() - t0
    peak = probe.peak()
    gc.collect()
    return {
        "seconds": seconds,
        "splits": splits or {},
        "rss_before": before,
        "peak_growth": peak - before,
        "retained": current_rss() - before,
        "prepare": info or {},
    }


def main(argv: list[str]) -> int:
    spec = json.loads(argv[0])
    imports = {name: _timed_import(name) for name in ("numpy", "torch")}

    from bench.cases import CASES
    from bench.workloads import SIZES

    cls = CASES[spec["case"]]
    for name in cls.imports:
        imports[name] = _timed_import(name)

    case = cls(SIZES[spec["mode"]], spec["folder"])
    t0 = time.perf_counter()
    case.setup()
    setup_s = time.perf_counter() - t0
    # Everything alive now (torch's modules, the live state) is never garbage: keep it out
    # of the collections that run before and during each repetition.
    gc.collect()
    gc.freeze()
    probe = PeakProbe()
    warmup = spec.get("warmup", 0)
    ops = []
    try:
        for op in case.ops():
            calls = [_measure(op, probe) for _ in range(warmup + spec["reps"])]
            ops.append({"op": op.name, "warmup": calls[:warmup], "runs": calls[warmup:]})
            print(
                f"  {spec['case']} {op.name}: {[round(r['seconds'], 4) for r in calls]}"
                f" (first {warmup} untimed)",
                file=sys.stderr,
                flush=True,
            )
        file_bytes = case.file_bytes()
        verified = bool(case.verify())
    finally:
        case.cleanup()
    result = {
        "case": spec["case"],
        "workload": case.workload,
        "library": case.library,
        "imports": imports,
        "setup_s": setup_s,
        "payload_bytes": case.payload_bytes,
        "tensor_count": case.tensor_count,
        "file_bytes": file_bytes,
        "peak_resettable": probe.resettable,
        "verified": verified,
        "ops": ops,
    }
    print(MARKER + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
