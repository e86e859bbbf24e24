"""The command line: ``inspect`` / ``validate`` on every conformance vector, ``convert`` round
trips bit for bit, ``ls`` / ``verify`` of checkpoint sets, usage errors, progress bars, and
the demo.

The CLI runs in-process through ``tlckpt.cli.main`` (fast); one test runs ``python -m tlckpt``
as a subprocess.
"""

from __future__ import annotations

import collections
import itertools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

import tlckpt
from tlckpt import cli
from tlckpt.cli import progress
from tlckpt.cli.convert import ORDER_KEY
from tlckpt.testing.vectors import vectors_dir

VECTORS_DIR = vectors_dir()
MANIFEST = json.loads((VECTORS_DIR / "manifest.json").read_text())

#: Error class the CLI names for each manifest category (tests/vectors/README.md).
CLASS_OF_CATEGORY = {
    "family": "UnsupportedFormatError",
    "version": "UnsupportedVersionError",
    "truncated": "TruncatedError",
    "trailing": "TrailingDataError",
    "schema": "SchemaMismatchError",
    "config": "ConfigError",
    "dtype": "ConfigError",
    "counter": "ConfigError",
    "entry": "EntryError",
    "json": "MalformedError",
    "value": "MalformedError",
}

#: Invalid vectors that are well-formed files in themselves: they break a rule only against
#: the destination the manifest gives (schema, dtype, config or shape of the reader). Alone,
#: ``validate`` accepts them; ``validate --against`` rejects them.
DESTINATION_ONLY = {
    "bad_adam_v2_into_tied.tladam",  # v2 is fine; the destination has tied weights
    "bad_adam_requires_grad_mismatch.tladam",  # slot 1 is trainable in the destination
    "bad_adam_alias_mismatch.tladam",  # the destination's alias map differs
    "bad_adam_config_mismatch.tladam",  # the destination's config differs by one ulp
    "bad_adam_v5_read_as_f32.tladam",  # float64 file, float32 destination
    "bad_state_count.tlsf32",
    "bad_state_shape.tlsf32",
    "bad_state_rank.tlsf32",
    "bad_bits_wrong_format.json",  # a valid float64 file read as float32
    "bad_bits_shape.json",
    "bad_bits_missing_tensor.json",
    "bad_bits_extra_tensor.json",
}

VALID = [
    (section, e) for section in ("adam", "float32_state", "state_bits") for e in MANIFEST[section]
]
INVALID = MANIFEST["invalid"]


def run(capsys: pytest.CaptureFixture[str], *argv: Any) -> tuple[int, str, str]:
    """``tlckpt ARGV`` in-process: exit status, stdout, stderr."""
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_rejection(err: str, error_class: str | None = None) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert lines[0].startswith("tlckpt: ")
    if error_class is not None:
        assert lines[0].startswith(f"tlckpt: {error_class}: "), lines[0]


# --------------------------------------------------------------------------- inspect


@pytest.mark.parametrize(("section", "vector"), VALID, ids=[e["file"] for _, e in VALID])
def test_inspect_valid_vector(
    capsys: pytest.CaptureFixture[str], section: str, vector: dict
) -> None:
    path = VECTORS_DIR / vector["file"]
    code, out, err = run(capsys, "inspect", path)
    assert (code, err) == (0, "")
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


@pytest.mark.parametrize("vector", INVALID, ids=[e["file"] for e in INVALID])
def test_inspect_invalid_vector(capsys: pytest.CaptureFixture[str], vector: dict) -> None:
    code, out, err = run(capsys, "inspect", VECTORS_DIR / vector["file"])
    if vector["file"] in DESTINATION_ONLY:
        assert (code, err) == (0, "")
    else:
        assert (code, out) == (1, "")
        assert_one_line_rejection(err)
        assert vector["file"] in err  # the message names the file


# --------------------------------------------------------------------------- validate


@pytest.mark.parametrize(("section", "vector"), VALID, ids=[e["file"] for _, e in VALID])
def test_validate_valid_vector(
    capsys: pytest.CaptureFixture[str], section: str, vector: dict
) -> None:
    path = VECTORS_DIR / vector["file"]
    code, out, err = run(capsys, "validate", path)
    assert (code, err) == (0, "")
    assert out.startswith(f"{path}: ok (") and out.count("\n") == 1
    # A file fits the destination it describes itself.
    code, out, err = run(capsys, "validate", path, "--against", path)
    assert (code, err) == (0, "")
    assert f"fits {path}" in out


@pytest.mark.parametrize("vector", INVALID, ids=[e["file"] for e in INVALID])
def test_validate_invalid_vector(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, vector: dict
) -> None:
    path = VECTORS_DIR / vector["file"]
    code, out, err = run(capsys, "validate", path)
    if vector["file"] in DESTINATION_ONLY:
        assert (code, err) == (0, "")
    else:
        assert (code, out) == (1, "")
        assert_one_line_rejection(err)

    # Against the manifest's own destination (the description format is that vocabulary),
    # every invalid vector is rejected with the error class of its category.
    description = tmp_path / "destination.json"
    description.write_text(json.dumps(vector))
    code, out, err = run(capsys, "validate", path, "--against", description)
    assert (code, out) == (1, "")
    assert_one_line_rejection(err, CLASS_OF_CATEGORY[vector["category"]])


@pytest.mark.parametrize(
    ("file", "reference", "error_class"),
    [
        ("adam_v3_tied.tladam", "adam_v4_tied_counter.tladam", None),  # same schema/config
        ("adam_v2_adamw.tladam", "adam_v3_tied.tladam", "SchemaMismatchError"),
        ("adam_v5_f64.tladam", "adam_v4_counter.tladam", "ConfigError"),  # dtype differs
        ("state_basic.tlsf32", "state_basic.tlsf32", None),
        ("state_basic.tlsf32", "state_empty.tlsf32", "SchemaMismatchError"),
        ("state_basic.tlsf32", "adam_v3_tied.tladam", "UnsupportedFormatError"),
        ("bits_float32.json", "bits_float32.json", None),
        ("bits_float32.json", "bits_float64.json", "UnsupportedFormatError"),  # format tag
    ],
)
def test_validate_against_reference_checkpoint(
    capsys: pytest.CaptureFixture[str], file: str, reference: str, error_class: str | None
) -> None:
    code, _, err = run(capsys, "validate", VECTORS_DIR / file, "--against", VECTORS_DIR / reference)
    if error_class is None:
        assert (code, err) == (0, "")
    else:
        assert code == 1
        assert_one_line_rejection(err, error_class)


def test_validate_against_model_state_files(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    state = collections.OrderedDict(w=torch.zeros(3, 4), b=torch.zeros(8), s=torch.zeros(()))
    state["e"] = torch.zeros(2, 0)
    torch.save(state, tmp_path / "ref.pt")
    save_file(dict(state), tmp_path / "ref.safetensors")  # no order metadata
    basic = VECTORS_DIR / "state_basic.tlsf32"
    assert run(capsys, "validate", basic, "--against", tmp_path / "ref.pt")[0] == 0
    code, _, err = run(capsys, "validate", basic, "--against", tmp_path / "ref.safetensors")
    assert code == 1  # its order is not known: no positional file can be checked against it
    assert_one_line_rejection(err, "CheckpointError")
    assert "tlckpt.order" in err and "ref.safetensors" in err
    # The same tensors with tlckpt's order metadata (written by convert) are a reference.
    assert run(capsys, "convert", tmp_path / "ref.pt", tmp_path / "ordered.safetensors")[0] == 0
    assert run(capsys, "validate", basic, "--against", tmp_path / "ordered.safetensors")[0] == 0
    torch.save({k: v.double() for k, v in state.items()}, tmp_path / "f64.pt")
    code, _, err = run(capsys, "validate", basic, "--against", tmp_path / "f64.pt")
    assert code == 1
    assert_one_line_rejection(err, "ConfigError")  # TLSF32B into a float64 model


@pytest.mark.parametrize(
    ("description", "message"),
    [
        ("not json", "not JSON"),
        ("[1, 2]", "top level"),
        ('{"kind": "adam", "schema": {"shapes": [[2]], "requires_grad": [1]}}', "requires_grad"),
        ('{"kind": "spaceship", "shapes": []}', "unknown kind"),
        ('{"shapes": [[-1]]}', "shapes"),
        ('{"kind": "state_bits", "encoding": "float31", "shapes": []}', "float31"),
        (
            '{"schema": {"shapes": [[2]], "requires_grad": [false], "representatives": [0]}}',
            "well-formed",
        ),
    ],
)
def test_validate_bad_description(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, description: str, message: str
) -> None:
    (tmp_path / "d.json").write_text(description)
    code, _, err = run(
        capsys, "validate", VECTORS_DIR / "state_basic.tlsf32", "--against", tmp_path / "d.json"
    )
    assert code == 1
    assert_one_line_rejection(err, "MalformedError")
    assert message in err and "d.json" in err


def test_missing_file_is_a_one_line_rejection(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, _, err = run(capsys, "validate", tmp_path / "nope.tladam")
    assert code == 1
    assert_one_line_rejection(err, "FileNotFoundError")


# --------------------------------------------------------------------------- convert


def _words(path: Path) -> list[bytes]:
    """A state file's tensors as raw little-endian bytes with shapes (any of the formats)."""
    info = tlckpt.inspect(path)
    shapes = [t["shape"] for t in info["tensors"]]
    if info["family"] == "float32_state":
        arrays = tlckpt.read_float32_state(path, shapes)
    else:
        arrays = tlckpt.read_state_bits(path, shapes, info["format"])
    return [(a.shape, a.dtype.str, a.tobytes()) for a in arrays]


def test_convert_tlsf32_round_trips_byte_for_byte(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    for vector in MANIFEST["float32_state"]:
        src = VECTORS_DIR / vector["file"]
        chain = [
            src,
            tmp_path / "a.safetensors",
            tmp_path / "b.json",
            tmp_path / "c.tlsf32",
            tmp_path / "d.json",
            tmp_path / "e.safetensors",
            tmp_path / "f.tlsf32",
        ]
        for a, b in itertools.pairwise(chain):
            code, out, err = run(capsys, "convert", a, b)
            assert (code, err) == (0, ""), err
            assert out.count("\n") == 1 and "exact" in out
        assert (tmp_path / "c.tlsf32").read_bytes() == src.read_bytes()
        assert (tmp_path / "f.tlsf32").read_bytes() == src.read_bytes()
        assert _words(tmp_path / "d.json") == _words(tmp_path / "b.json")


@pytest.mark.parametrize(
    "vector", MANIFEST["state_bits"], ids=[e["file"] for e in MANIFEST["state_bits"]]
)
def test_convert_json_round_trips_bit_exact(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, vector: dict
) -> None:
    src = VECTORS_DIR / vector["file"]
    original = _words(src)
    targets = (
        [".pt"] if vector["encoding"] in ("complex128", "complex32") else [".safetensors", ".pt"]
    )
    for ext in targets:
        mid, back = tmp_path / f"mid{ext}", tmp_path / f"back{ext}.json"
        assert run(capsys, "convert", src, mid)[0] == 0
        code, _, err = run(capsys, "convert", mid, back, "--compact")
        assert (code, err) == (0, "")
        assert tlckpt.inspect(back)["format"] == vector["format"]
        assert _words(back) == original
    # TLSF32B holds float32: exact for narrower floats, refused (exit 1) where a value would round.
    code, _, err = run(capsys, "convert", src, tmp_path / "state.tlsf32")
    if code == 0:
        back = tmp_path / "again.json"
        assert (
            run(capsys, "convert", tmp_path / "state.tlsf32", back, "--dtype", vector["encoding"])[
                0
            ]
            == 0
        )
        assert _words(back) == original
    else:
        assert code == 1 and vector["encoding"] in ("float64", "complex64", "complex128")
        assert_one_line_rejection(err, "ConfigError")
        assert not (tmp_path / "state.tlsf32").exists()


def _state_dict() -> collections.OrderedDict[str, torch.Tensor]:
    """Names out of sorted order, special values, an int64 buffer, a scalar, a zero-size."""
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(4, 3, generator=g)
    weight[0, 0] = float("nan")
    weight[0, 1] = -0.0
    weight[0, 2] = float("-inf")
    weight[1, 0] = 1e-45  # subnormal
    nan_payload = torch.tensor([0x7FC12345], dtype=torch.int32).view(torch.float32)
    return collections.OrderedDict(
        [
            ("z.weight", weight),
            ("a.bias", torch.cat([torch.randn(2, generator=g), nan_payload])),
            ("m.running_mean", torch.zeros(())),
            ("m.num_batches_tracked", torch.tensor(12345, dtype=torch.int64)),
            ("empty", torch.zeros(2, 0)),
        ]
    )


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return torch.equal(a.contiguous().view(width), b.contiguous().view(width))


def test_convert_pt_to_each_format(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    state = _state_dict()
    torch.save(state, tmp_path / "model.pt")
    names = list(state)

    # .pt → .safetensors keeps names and order (in __metadata__), dtypes and every bit.
    assert run(capsys, "convert", tmp_path / "model.pt", tmp_path / "model.safetensors")[0] == 0
    with safe_open(tmp_path / "model.safetensors", framework="pt") as f:
        assert json.loads(f.metadata()[ORDER_KEY]) == names
    assert run(capsys, "convert", tmp_path / "model.safetensors", tmp_path / "back.pt")[0] == 0
    back = torch.load(tmp_path / "back.pt", weights_only=True)
    assert list(back) == names
    assert all(_bits_equal(state[k], back[k]) for k in names)

    # .pt → .tlsf32 and → .json: positional, the int64 buffer as an exact float32.
    for ext in (".tlsf32", ".json"):
        code, out, _ = run(capsys, "convert", tmp_path / "model.pt", tmp_path / f"model{ext}")
        assert code == 0 and "names dropped" in out
        arrays = (
            tlckpt.read_float32_state(tmp_path / "model.tlsf32", [t.shape for t in state.values()])
            if ext == ".tlsf32"
            else tlckpt.read_state_bits(
                tmp_path / "model.json", [t.shape for t in state.values()], "float32"
            )
        )
        for t, a in zip(state.values(), arrays):
            expected = t.float() if t.dtype == torch.int64 else t
            assert _bits_equal(expected, torch.from_numpy(a))

    # Back to named: positions as names, or the names of a reference file.
    assert run(capsys, "convert", tmp_path / "model.tlsf32", tmp_path / "pos.pt")[0] == 0
    assert list(torch.load(tmp_path / "pos.pt", weights_only=True)) == ["0", "1", "2", "3", "4"]
    code, out, _ = run(
        capsys,
        "convert",
        tmp_path / "model.json",
        tmp_path / "named.safetensors",
        "--names-from",
        tmp_path / "model.pt",
    )
    assert code == 0 and "names taken from" in out
    with safe_open(tmp_path / "named.safetensors", framework="pt") as f:
        assert json.loads(f.metadata()[ORDER_KEY]) == names
        assert f.get_tensor("m.num_batches_tracked").item() == 12345.0


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
    code, _, err = run(capsys, "convert", src, tmp_path / target)
    assert code == 1
    assert_one_line_rejection(err, "CheckpointError")
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
    code, _, err = run(capsys, *argv)
    assert code == 1
    assert_one_line_rejection(err, error)
    assert message in err, err
    assert not (tmp_path / "x.tlsf32").exists()


def test_convert_names_from_a_foreign_safetensors_is_no_order_either(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    src = _foreign_safetensors(tmp_path)
    code, _, err = run(capsys, "convert", src, tmp_path / "x.tlsf32", "--names-from", src)
    assert code == 1
    assert_one_line_rejection(err, "CheckpointError")
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


def test_convert_bfloat16_and_float8_through_pt(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    words = torch.arange(256, dtype=torch.uint8)
    state = {
        "bf16": torch.arange(-(2**15), 2**15, 97, dtype=torch.int32)
        .to(torch.int16)
        .view(torch.bfloat16),
        "e4m3": words.view(torch.float8_e4m3fn),
    }
    torch.save(state, tmp_path / "low.pt")
    for name, t in state.items():
        torch.save({name: t}, tmp_path / f"{name}.pt")
        assert run(capsys, "convert", tmp_path / f"{name}.pt", tmp_path / f"{name}.json")[0] == 0
        assert (
            run(capsys, "convert", tmp_path / f"{name}.json", tmp_path / f"{name}.safetensors")[0]
            == 0
        )
        assert (
            run(capsys, "convert", tmp_path / f"{name}.safetensors", tmp_path / f"{name}.back.pt")[
                0
            ]
            == 0
        )
        back = torch.load(tmp_path / f"{name}.back.pt", weights_only=True)["0"]
        assert _bits_equal(t, back)
    # Mixed floating dtypes need --dtype for one JSON file; float8 NaN words are no bfloat16.
    code, _, err = run(capsys, "convert", tmp_path / "low.pt", tmp_path / "low.json")
    assert code == 1 and "--dtype" in err
    assert_one_line_rejection(err, "ConfigError")


@pytest.mark.parametrize(
    ("values", "ok"),
    [([0.5, -0.0, 3.0, float("inf"), 2.0**-149], True), ([0.1], False), ([2.0**-150], False)],
)
def test_convert_float64_into_tlsf32_only_when_exact(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, values: list[float], ok: bool
) -> None:
    torch.save({"w": torch.tensor(values, dtype=torch.float64)}, tmp_path / "f64.pt")
    (tmp_path / "out.tlsf32").write_bytes(b"old")
    code, _, err = run(capsys, "convert", tmp_path / "f64.pt", tmp_path / "out.tlsf32")
    if ok:
        assert code == 0
        [got] = tlckpt.read_float32_state(tmp_path / "out.tlsf32", [(len(values),)])
        assert got.tobytes() == np.array(values, dtype=np.float32).tobytes()  # -0.0 kept
    else:
        assert code == 1
        assert_one_line_rejection(err, "ConfigError")
        assert "'w'" in err and "cannot hold exactly" in err
        assert (tmp_path / "out.tlsf32").read_bytes() == b"old"  # untouched


def test_convert_int64_out_of_float32_range_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    torch.save({"n": torch.tensor([2**24 + 1])}, tmp_path / "n.pt")
    code, _, err = run(capsys, "convert", tmp_path / "n.pt", tmp_path / "n.tlsf32")
    assert code == 1
    assert_one_line_rejection(err, "ConfigError")


class _Exploit:
    """Unpickling this would run code: ``weights_only=True`` must refuse it."""

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (print, ("pwned",))


def test_convert_pt_never_unpickles_code(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    torch.save({"w": torch.zeros(2), "x": _Exploit()}, tmp_path / "evil.pt")
    code, out, err = run(capsys, "convert", tmp_path / "evil.pt", tmp_path / "out.tlsf32")
    assert code == 1 and "pwned" not in out
    assert_one_line_rejection(err, "UnsupportedFormatError")
    assert "weights_only" in err
    for junk in (b"", b"PK\x03\x04 not a zip", b"\x80\x02}q\x00."):
        (tmp_path / "junk.pt").write_bytes(junk)
        code, _, err = run(capsys, "convert", tmp_path / "junk.pt", tmp_path / "out.json")
        assert code == 1
        assert_one_line_rejection(err)


def test_convert_rejects_bad_safetensors(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (tmp_path / "bad.safetensors").write_bytes(b"\xff" * 8 + b"{}")
    code, _, err = run(capsys, "convert", tmp_path / "bad.safetensors", tmp_path / "out.json")
    assert code == 1
    assert_one_line_rejection(err, "MalformedError")


def test_convert_rejects_bad_source_checkpoint(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, _, err = run(
        capsys, "convert", VECTORS_DIR / "bad_state_truncated.tlsf32", tmp_path / "o.pt"
    )
    assert code == 1
    assert_one_line_rejection(err, "TruncatedError")
    assert not (tmp_path / "o.pt").exists()


def test_convert_to_overrides_the_extension(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, _, _ = run(
        capsys,
        "convert",
        VECTORS_DIR / "state_basic.tlsf32",
        tmp_path / "state.bin",
        "--to",
        "json",
    )
    assert code == 0
    assert tlckpt.inspect(tmp_path / "state.bin")["format"] == "torchlean_state_float32_bits_v1"


# --------------------------------------------------------------------------- usage errors


@pytest.mark.parametrize(
    "argv",
    [
        ["frobnicate"],
        ["inspect"],
        ["inspect", "a", "b"],
        ["validate"],
        ["validate", "x.tladam", "--bogus"],
        ["convert", "a.tlsf32"],
        ["convert", "a.tlsf32", "b.json", "--to", "zip"],
        ["convert", "a.tlsf32", "b.unknown"],
        ["convert", "a.unknown", "b.json"],
        ["convert", "a.tlsf32", "b.tlsf32", "--dtype", "float64"],
        ["convert", "a.tlsf32", "b.json", "--dtype", "float31"],
        ["convert", "a.tlsf32", "b.json", "--names-from", "c.pt"],
        ["demo", "extra"],
        ["--nope"],
    ],
)
def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    code, _, err = run(capsys, *argv)
    assert code == 2
    assert "usage:" in err and "Traceback" not in err


def test_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--help")
    assert code == 0 and "inspect" in out and "convert" in out


# --------------------------------------------------------------------------- checkpoint sets


def test_ls_and_verify_checkpoint_sets(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    manager = tlckpt.CheckpointManager(tmp_path)
    good = manager.save(1, model=model, optimizer=opt).wait()
    bad = manager.save(2, model=model, optimizer=opt).wait()
    member = bad / "optimizer.tladam"
    data = member.read_bytes()
    member.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    (tmp_path / f".{good.name}.tlckpt-abcdefgh.tmp").mkdir()  # a killed save's leftover

    code, out, err = run(capsys, "ls", tmp_path)
    assert code == 0 and err == ""
    rows = {
        line.split()[0]: line for line in out.splitlines()[1:] if "KiB" in line or " B " in line
    }
    assert set(rows) == {"1", "2"}
    assert "verified (" in rows["1"] and "NOT VERIFIED" not in rows["1"]
    assert "NOT VERIFIED: IntegrityError (digest)" in rows["2"] and member.name in rows["2"]
    assert "1 leftover(s)" in out

    code, out, _ = run(capsys, "verify", good)
    assert code == 0 and f"{good}: ok (step 1, 2 state tensors" in out
    code, _, err = run(capsys, "verify", bad)
    assert code == 1
    assert_one_line_rejection(err, "IntegrityError")
    assert member.name in err and "digest" in err
    code, _, err = run(capsys, "ls", tmp_path / "missing")
    assert code == 1
    assert_one_line_rejection(err, "FileNotFoundError")


# --------------------------------------------------------------------------- progress bars


def test_progress_bar_only_for_large_files_on_a_terminal(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    path = VECTORS_DIR / "state_basic.tlsf32"
    assert run(capsys, "validate", path)[2] == ""  # small file, not a terminal: silent
    monkeypatch.setattr(progress, "THRESHOLD", 0)
    assert run(capsys, "validate", path)[2] == ""  # large, but stderr is not a terminal
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    code, _, err = run(capsys, "validate", path)
    assert code == 0 and "checking" in err  # tqdm drew on stderr
    code, _, err = run(capsys, "convert", path, tmp_path / "s.tlsf32")
    assert code == 0 and "writing" in err
    assert (tmp_path / "s.tlsf32").read_bytes() == path.read_bytes()


# --------------------------------------------------------------------------- demo


def test_demo_reports_bit_identical_resume(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out, err = run(capsys, "demo", "--keep", tmp_path)
    assert (code, err) == (0, "")
    assert "verdict: BIT-IDENTICAL" in out
    assert "DIFFERENT" not in out and "NOT" not in out
    assert "TLADAMF (Adam/AdamW optimizer state), version 4" in out  # tied + counter → v4
    info = tlckpt.inspect(tmp_path / "optimizer.tladam")
    assert info["version"] == 4 and info["has_aliases"] and info["random_counter"] == 5
    assert [s["trainable"] for s in info["slots"]].count(False) == 2  # the frozen layer
    assert tlckpt.inspect(tmp_path / "model.json")["encoding"] == "float32"


def test_demo_is_the_default_command(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import tlckpt.cli.demo

    calls = []
    monkeypatch.setattr(
        tlckpt.cli.demo, "training_demo", lambda out, keep: calls.append(keep) or False
    )
    assert cli.main([]) == 1  # a demo that is not bit-identical exits non-zero
    assert calls == [None]


def test_codec_demo(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "demo", "--codec")
    assert code == 0
    assert out.count("bit-exact: True") == 11 and "False" not in out


def test_python_dash_m_subprocess() -> None:
    vector = VECTORS_DIR / "adam_v5_f64_tied_counter.tladam"
    done = subprocess.run(
        [sys.executable, "-m", "tlckpt", "validate", str(vector)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"{vector}: ok (TLADAMF v5")
    bad = VECTORS_DIR / "bad_adam_truncated_payload.tladam"
    done = subprocess.run(
        [sys.executable, "-m", "tlckpt", "inspect", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1 and done.stdout == ""
    assert_one_line_rejection(done.stderr, "TruncatedError")


def test_numpy_is_enough_for_tlsf32_and_json(tmp_path: Path) -> None:
    """TLSF32B ↔ float32 JSON conversion does not touch torch (the codec's promise)."""
    from tlckpt.cli.convert import read_state, write_state

    state = read_state(VECTORS_DIR / "state_basic.tlsf32", "tlsf32")
    assert all(isinstance(t.array, np.ndarray) for t in state.tensors)
    assert write_state(state, tmp_path / "s.json", "json") == "float32"


def test_convert_refusals_are_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    torch.save({"s": torch.eye(3).to_sparse()}, tmp_path / "sparse.pt")
    code, _, err = run(capsys, "convert", tmp_path / "sparse.pt", tmp_path / "x.json")
    assert code == 1 and "dense" in err
    assert_one_line_rejection(err, "ConfigError")

    torch.save({"c": torch.tensor([0.1 + 1j], dtype=torch.complex64)}, tmp_path / "c.pt")
    code, _, err = run(
        capsys, "convert", tmp_path / "c.pt", tmp_path / "x.json", "--dtype", "complex32"
    )
    assert code == 1
    assert_one_line_rejection(err, "ConfigError")  # no torch warning leaks either
    code, _, err = run(capsys, "convert", tmp_path / "c.pt", tmp_path / "x.tlsf32")
    assert code == 1 and "complex and real" in err

    torch.save({"a": torch.zeros(3)}, tmp_path / "names.pt")
    code, _, err = run(
        capsys,
        "convert",
        VECTORS_DIR / "state_basic.tlsf32",
        tmp_path / "x.pt",
        "--names-from",
        tmp_path / "names.pt",
    )
    assert code == 1
    assert_one_line_rejection(err, "SchemaMismatchError")
