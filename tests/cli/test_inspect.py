"""``tlckpt inspect`` on every conformance vector: what it reports (as text and as JSON) on
the valid ones, a one-line rejection naming the file on the invalid ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_support import (
    MANIFEST,
    VALID_SECTIONS,
    VECTORS_DIR,
    invalid_vector_outcome,
    run,
    run_ok,
)

import tlckpt

VALID = [(section, e) for section in VALID_SECTIONS for e in MANIFEST[section]]


@pytest.mark.parametrize(("section", "vector"), VALID, ids=[e["file"] for _, e in VALID])
def test_inspect_valid_vector(
    capsys: pytest.CaptureFixture[str], section: str, vector: dict
) -> None:
    path = VECTORS_DIR / vector["file"]
    out = run_ok(capsys, "inspect", path)
    assert out.startswith(f"file            {path}\n")
    if section == "adam":
        assert f"version {vector['version']}" in out
        for name in ("beta1", "beta2", "epsilon", "weight_decay"):
            assert vector["config"][f"{name}_bits"] in out  # exact bits, as hex
        assert f"moment dtype    {vector['config']['dtype']}" in out
        counter = vector["random_counter"]
        assert f"random counter  {'absent' if counter is None else counter}" in out
        for entry in vector["entries"]:
            assert any(
                line.split()[:2] == [str(entry["id"]), str(entry["step"])]
                for line in out.splitlines()
            )
    elif section == "float32_state":
        assert "TLSF32B" in out and f"tensors         {len(vector['shapes'])} " in out
    else:
        assert vector["format"] in out and f"tensors         {len(vector['shapes'])} " in out

    code, out, _ = run(capsys, "inspect", "--json", path)
    assert code == 0
    assert json.loads(out) == json.loads(json.dumps(tlckpt.inspect(path)))


def test_inspect_json_reports_schema_and_entries(capsys: pytest.CaptureFixture[str]) -> None:
    vector = next(e for e in MANIFEST["adam"] if e["schema"]["representatives"])
    code, out, _ = run(capsys, "inspect", VECTORS_DIR / vector["file"], "--json")
    info = json.loads(out)
    assert code == 0
    assert [s["shape"] for s in info["slots"]] == vector["schema"]["shapes"]
    assert [s["trainable"] for s in info["slots"]] == vector["schema"]["requires_grad"]
    assert [s["representative"] for s in info["slots"]] == vector["schema"]["representatives"]
    assert [(e["id"], e["step"]) for e in info["entries"]] == [
        (e["id"], e["step"]) for e in vector["entries"]
    ]
    assert info["config"]["beta1"]["bits"] == vector["config"]["beta1_bits"]


@pytest.mark.vectors("invalid")
def test_inspect_invalid_vector(
    capsys: pytest.CaptureFixture[str], vector: dict, vector_path: Path
) -> None:
    err = invalid_vector_outcome(capsys, "inspect", vector, vector_path)
    if err is not None:
        assert vector["file"] in err  # the message names the file
