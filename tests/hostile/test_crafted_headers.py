"""Hand-made hostile headers at the 1 MiB edge are rejected fast and small.

Regression test for a quadratic element-count check that these crafted seeds exposed (fixed
since in ``formats.primitives.product``, which now stops at 2^64): ``inspect`` of a file whose
one tensor/slot has 130,000 dims of 2^64-1 multiplied them all into an 8-million-bit integer
(5.4 s for 256 KiB, 12.9 s for 480 KB, minutes for 1 MiB). Also: counts of 2^64-1, payloads
claiming 2^63 bytes, slot counts of 2^64-1. Run through the campaign's machinery
(``python -m fuzz.mutate --seeds crafted``) in a child process, so that a regression shows as
a reported hang rather than a stuck test.
"""

from __future__ import annotations

import json
from pathlib import Path

from hostile_support import run_campaign, run_python


def test_crafted_hostile_headers_stay_in_bounds(tmp_path: Path) -> None:
    out = tmp_path / "crafted"
    proc = run_campaign(
        [
            "fuzz.mutate",
            "--seeds",
            "crafted",
            # The valid zero-dim ones have their own test below (a bound on inspect alone).
            "--exclude",
            "last_zero",
            "--systematic-only",
            "--quiet",
            "--hang-seconds",
            "20",
            "--out",
            str(out),
        ],
        timeout=300,
    )
    report = json.loads((out / "report.json").read_text())
    totals = report["totals"]
    assert totals["seeds"] >= 10, report
    assert totals["escapes"] == 0, proc.stdout[-4000:]
    assert totals["violations"] == 0, proc.stdout[-4000:]
    assert totals["accepted"] == 0  # every crafted file left here is invalid
    for fmt in report["formats"].values():
        assert fmt["worst_time"]["value"] < 1.0, fmt["worst_time"]
        assert fmt["worst_traced"]["value"] < 64 << 20, fmt["worst_traced"]


_DESCRIBE = r"""
import io, struct, sys, time
from tlckpt.codec import inspect
rank = (1 << 20) // 8 - 6
data = (b"TLSF32B" + struct.pack("<3Q", 1, 1, rank)
        + struct.pack(f"<{rank}Q", *([2**64 - 1] * (rank - 1) + [0])) + struct.pack("<Q", 0))
start = time.perf_counter()
info = inspect(io.BytesIO(data))
print("SECONDS", time.perf_counter() - start, "ELEMENTS", info["tensors"][0]["elements"])
"""


def test_inspect_describes_a_valid_file_with_130k_dims_fast() -> None:
    """A valid 1 MiB ``TLSF32B`` file: one tensor of 131,066 dims, 2^64-1 each but the last,
    which is 0 (so 0 elements). ``inspect`` must describe it within the 1 s bound; run in a
    child process killed after 8 s, so that a quadratic element count fails fast."""
    proc = _run_bounded(_DESCRIBE, 8.0)
    assert "ELEMENTS 0" in proc, proc
    seconds = float(proc.split("SECONDS")[1].split()[0])
    assert seconds < 1.0, proc


def _run_bounded(code: str, timeout: float) -> str:
    proc = run_python(["-c", code], timeout, what="inspect (bound: 1 s)")
    return proc.stdout + proc.stderr[-2000:]
