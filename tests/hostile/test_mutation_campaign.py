"""Short CI version of the mutation campaign (``python -m fuzz.mutate --quick``).

A sample of the systematic mutations of every conformance vector and generated file (every
format and version): each read ends in success or a ``CheckpointError`` within 1 s and
64 MiB of peak growth. The full campaign: ``python -m fuzz.mutate --minutes N``.
"""

from __future__ import annotations

import json
from pathlib import Path

from hostile_support import fuzz_module, run_campaign


def test_quick_mutation_campaign_has_no_escape_and_stays_in_bounds(tmp_path: Path) -> None:
    out = tmp_path / "mutate"
    proc = run_campaign(["fuzz.mutate", "--quick", "--quiet", "--out", str(out)], timeout=150)
    report = json.loads((out / "report.json").read_text())
    totals = report["totals"]
    summary = proc.stdout[-6000:]
    assert report["systematic_set_completed"], summary
    assert totals["inputs"] > 1500, summary
    # Every format took part, both accepted and rejected inputs occurred.
    for key in (
        "TLADAMF v2",
        "TLADAMF v3",
        "TLADAMF v4",
        "TLADAMF v5",
        "TLSF32B v1",
        "exact-bits JSON",
        "safetensors",
        "optimizer tree",
    ):
        assert report["formats"][key]["inputs"] > 0, key
        assert report["formats"][key]["accepted"] > 0, key
        assert report["formats"][key]["rejected"] > 0, key
        # framed binary files have records
        if key not in ("exact-bits JSON", "safetensors", "optimizer tree"):
            assert report["formats"][key]["record_mutations"] > 0, key
    # Every kind of record-level mutation ran.
    assert set(report["record_kinds"]) == set(fuzz_module("mutators").RECORD_KINDS), report
    assert totals["escapes"] == 0, summary
    assert totals["violations"] == 0, summary
    assert proc.returncode == 0, summary
