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

from hostile_support import run_campaign


def test_crafted_hostile_headers_stay_in_bounds(tmp_path: Path) -> None:
    out = tmp_path / "crafted"
    proc = run_campaign(
        [
            "fuzz.mutate",
            "--seeds",
            "crafted",
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
    assert totals["accepted"] == 0  # every crafted file is invalid
    for fmt in report["formats"].values():
        assert fmt["worst_time"]["value"] < 1.0, fmt["worst_time"]
        assert fmt["worst_traced"]["value"] < 64 << 20, fmt["worst_traced"]
