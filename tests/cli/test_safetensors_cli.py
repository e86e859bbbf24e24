"""``tlckpt inspect``/``validate`` on safetensors files: recognised from their first bytes,
described by name and dtype, damaged headers refused in one line."""

from __future__ import annotations

import json

import pytest
from cli_support import one_line_rejection, run, run_ok

torch = pytest.importorskip("torch")
import tlckpt  # noqa: E402


def test_inspect_and_validate_a_safetensors_file(capsys, tmp_path) -> None:
    path = tmp_path / "m.safetensors"
    tlckpt.save_tensors(
        {"w": torch.zeros(2, 3, dtype=torch.bfloat16), "n": torch.tensor(4)},
        path,
        metadata={"a": "b"},
    )
    out = run_ok(capsys, "inspect", path)
    assert "family          the safetensors layout" in out
    assert "metadata        1 entries" in out
    assert any(line.split()[:3] == ["w", "BF16", "(2,"] for line in out.splitlines())
    info = json.loads(run_ok(capsys, "inspect", path, "--json"))
    assert info["family"] == "safetensors" and info["metadata"] == {"a": "b"}
    assert [t["name"] for t in info["tensors"]] == ["n", "w"]
    assert "ok (safetensors, 2 tensor(s)" in run_ok(capsys, "validate", path)


def test_a_damaged_header_is_one_line(capsys, tmp_path) -> None:
    path = tmp_path / "bad.safetensors"
    tlckpt.save_tensors({"w": torch.zeros(2)}, path)
    data = bytearray(path.read_bytes())
    data[data.index(b"F32")] = ord("Q")
    path.write_bytes(bytes(data))
    for command in ("inspect", "validate"):
        code, _, err = run(capsys, command, path)
        assert code != 0
        line = one_line_rejection(err, "ConfigError")
        assert "'Q32'" in line and str(path) in line
