"""``tlckpt inspect``/``validate`` on optimizer trees: the class, groups and state keys
described; validated against another tree (class and groups), mismatches in one line."""

from __future__ import annotations

import json

import pytest
from cli_support import one_line_rejection, run, run_ok

torch = pytest.importorskip("torch")
import tlckpt  # noqa: E402


def _tree(path, order: str = "wb") -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    params = [model.weight, model.bias] if order == "wb" else [model.bias, model.weight]
    opt = torch.optim.RMSprop(params, lr=0.1, momentum=0.5)
    model(torch.randn(2, 3)).sum().backward()
    opt.step()
    tlckpt.save_optimizer(opt, model, path, random_counter=5)


def test_inspect_and_validate_an_optimizer_tree(capsys, tmp_path) -> None:
    path = tmp_path / "opt.safetensors"
    _tree(path)
    out = run_ok(capsys, "inspect", path)
    assert "optimizer       torch.optim.rmsprop.RMSprop" in out
    assert "random counter  5" in out
    assert "group 0  2 parameter(s): weight, bias" in out
    assert any(line.split()[:1] == ["state/weight/square_avg"] for line in out.splitlines())
    info = json.loads(run_ok(capsys, "inspect", path, "--json"))
    assert info["family"] == "optimizer_tree" and info["state"]["bias"] == [
        "momentum_buffer",
        "square_avg",
        "step",
    ]
    assert "ok (optimizer tree v1 1 param group(s), 6 tensor(s)" in run_ok(capsys, "validate", path)
    assert "fits" in run_ok(capsys, "validate", path, "--against", path)


def test_validate_against_other_groups_is_one_line(capsys, tmp_path) -> None:
    _tree(tmp_path / "a.safetensors")
    _tree(tmp_path / "b.safetensors", order="bw")
    code, _, err = run(
        capsys, "validate", tmp_path / "a.safetensors", "--against", tmp_path / "b.safetensors"
    )
    assert code != 0
    assert "param group 0" in one_line_rejection(err, "SchemaMismatchError")
