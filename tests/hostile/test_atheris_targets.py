"""Short CI runs of the atheris targets (``python -m fuzz.atheris_run --runs N``).

Each target (Adam, TLSF32B, exact-bits JSON, ``inspect``) runs a fixed number of libFuzzer
executions from the seed corpus (the vectors and small generated files) in a fresh output
folder. A crash, timeout or out-of-memory artifact fails the test. The full campaign:
``python -m fuzz.atheris_run --minutes N``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hostile_support import fuzz_module, run_campaign

pytest.importorskip("atheris", reason="atheris is pinned in requirements-dev.txt")

RUNS = 2500


@pytest.mark.parametrize("target", ["adam", "tlsf32", "json", "inspect"])
def test_atheris_target_runs_clean(target: str, tmp_path: Path) -> None:
    proc = run_campaign(
        ["fuzz.atheris_run", "--target", target, "--runs", str(RUNS), "--out", str(tmp_path)],
        timeout=120,
    )
    log = (tmp_path / target / "last-run.log").read_text()
    artifacts = [
        p.name
        for p in (tmp_path / target).iterdir()
        if p.name.split("-")[0] in ("crash", "timeout", "oom", "leak")
    ]
    assert not artifacts, log[-4000:]
    assert proc.returncode == 0, proc.stdout + log[-4000:]
    assert f"stat::number_of_executed_units: {RUNS}" in log, log[-2000:]


def test_seed_corpus_covers_every_vector(vectors_path: Path) -> None:
    targets = fuzz_module("atheris_targets")
    names = {s.name for t in targets.TARGETS for s in targets.target_seeds(t)}
    vectors = {p.name for p in vectors_path.iterdir()} - {"manifest.json", "README.md"}
    assert vectors <= names
