"""``tlckpt convert`` into positional files (TLSF32B, exact-bits JSON) needs the tensors' order:
tlckpt's own ``.safetensors`` files carry it; a foreign one takes it from ``--names-from`` (a
text file, a ``.pt`` or an ordered ``.safetensors``), which must name exactly its tensors."""

from __future__ import annotations

import collections
from pathlib import Path

import pytest
import torch
from cli_support import (
    refused,
    run,
)
from safetensors import safe_open
from safetensors.torch import save_file

import tlckpt
from tlckpt.cli.convert import ORDER_KEY

# A safetensors file from another tool: no order metadata, and names whose sorted order is not
# the model's (layers.10 sorts before layers.2), all of one shape.
LAYERS = [f"layers.{i}" for i in range(12)]


def _foreign_safetensors(folder: Path) -> Path:
    path = folder / "foreign.safetensors"
    save_file({name: torch.full((2, 2), float(i)) for i, name in enumerate(LAYERS)}, path)
    with safe_open(path, framework="pt") as f:
        assert ORDER_KEY not in (f.metadata() or {})
    return path


def _layer_values(path: Path) -> list[float]:
    if path.suffix == ".tlsf32":
        arrays = tlckpt.read_float32_state(path, [(2, 2)] * len(LAYERS))
    else:
        arrays = tlckpt.read_state_bits(path, [(2, 2)] * len(LAYERS), "float32")
    return [float(a[0, 0]) for a in arrays]


@pytest.mark.parametrize("target", ["x.tlsf32", "x.json"])
def test_convert_foreign_safetensors_into_a_positional_file_needs_an_order(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, target: str
) -> None:
    src = _foreign_safetensors(tmp_path)
    err = refused(capsys, "CheckpointError", "convert", src, tmp_path / target)
    assert str(src) in err and "tlckpt.order" in err and "--names-from" in err
    assert not (tmp_path / target).exists()
    # Named targets need no order: names travel with the tensors.
    assert run(capsys, "convert", src, tmp_path / "named.pt")[0] == 0
    assert set(torch.load(tmp_path / "named.pt", weights_only=True)) == set(LAYERS)


@pytest.mark.parametrize("source", ["text", "pt", "ordered safetensors"])
@pytest.mark.parametrize("target", ["x.tlsf32", "x.json"])
def test_convert_foreign_safetensors_with_names_from(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, source: str, target: str
) -> None:
    src = _foreign_safetensors(tmp_path)
    if source == "text":
        names = tmp_path / "order.txt"
        names.write_text("\n".join(LAYERS) + "\n\n")  # blank lines are ignored
    else:
        names = tmp_path / "model.pt"
        torch.save(collections.OrderedDict((n, torch.zeros(2, 2)) for n in LAYERS), names)
        if source == "ordered safetensors":  # tlckpt writes the order it was given
            assert run(capsys, "convert", names, tmp_path / "ordered.safetensors")[0] == 0
            names = tmp_path / "ordered.safetensors"
    code, out, _ = run(capsys, "convert", src, tmp_path / target, "--names-from", names)
    assert code == 0
    assert f"in the order of {names}" in out
    assert _layer_values(tmp_path / target) == [float(i) for i in range(12)]


@pytest.mark.parametrize(
    ("names", "error", "message"),
    [
        (LAYERS[:-1], "SchemaMismatchError", "1 of the file's not listed ('layers.11')"),
        ([*LAYERS, "layers.12"], "SchemaMismatchError", "1 not in the file ('layers.12')"),
        ([*LAYERS, "layers.0"], "CheckpointError", "'layers.0' appears twice"),
    ],
)
def test_convert_names_from_must_name_exactly_the_files_tensors(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, names: list[str], error: str, message: str
) -> None:
    src = _foreign_safetensors(tmp_path)
    (tmp_path / "order.txt").write_text("\n".join(names))
    argv = ("convert", src, tmp_path / "x.tlsf32", "--names-from", tmp_path / "order.txt")
    err = refused(capsys, error, *argv)
    assert message in err, err
    assert not (tmp_path / "x.tlsf32").exists()


def test_convert_names_from_a_foreign_safetensors_is_no_order_either(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    src = _foreign_safetensors(tmp_path)
    err = refused(
        capsys, "CheckpointError", "convert", src, tmp_path / "x.tlsf32", "--names-from", src
    )
    assert "order is not known" in err


def test_convert_our_own_safetensors_keeps_its_order(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Files tlckpt wrote carry their order: no --names-from needed, as before."""
    state = collections.OrderedDict((n, torch.full((2, 2), float(i))) for i, n in enumerate(LAYERS))
    torch.save(state, tmp_path / "model.pt")
    assert run(capsys, "convert", tmp_path / "model.pt", tmp_path / "ours.safetensors")[0] == 0
    assert run(capsys, "convert", tmp_path / "ours.safetensors", tmp_path / "x.tlsf32")[0] == 0
    assert _layer_values(tmp_path / "x.tlsf32") == [float(i) for i in range(12)]


@pytest.mark.parametrize("kind", ["list", "state_dict", "module"])
def test_convert_api_takes_an_order(tmp_path: Path, kind: str) -> None:
    from tlckpt.cli.convert import convert

    src = _foreign_safetensors(tmp_path)
    dst = tmp_path / "x.tlsf32"
    with pytest.raises(tlckpt.CheckpointError) as info:
        convert(src, dst, src_format="safetensors", dst_format="tlsf32")
    assert info.value.path == str(src) and "names_from=" in str(info.value)
    model = torch.nn.Module()
    model.layers = torch.nn.ParameterList(torch.zeros(2, 2) for _ in LAYERS)
    assert list(model.state_dict()) == LAYERS
    order = {"list": LAYERS, "state_dict": model.state_dict(), "module": model}[kind]
    result = convert(src, dst, src_format="safetensors", dst_format="tlsf32", names_from=order)
    assert result["tensors"] == 12
    assert _layer_values(dst) == [float(i) for i in range(12)]
