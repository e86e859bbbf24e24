"""``tlckpt validate`` alone and ``--against`` a destination: every conformance vector, reference
checkpoints of every family, ``.pt`` and ``.safetensors`` model files, and destination
descriptions (the manifest's vocabulary), well-formed or not."""

from __future__ import annotations

import collections
import json
from pathlib import Path

import pytest
import torch
from cli_support import (
    CLASS_OF_CATEGORY,
    VALID_SECTIONS,
    VECTORS_DIR,
    invalid_vector_outcome,
    one_line_rejection,
    refused,
    run,
    run_ok,
)
from safetensors.torch import save_file


@pytest.mark.vectors(*VALID_SECTIONS)
def test_validate_valid_vector(capsys: pytest.CaptureFixture[str], vector_path: Path) -> None:
    out = run_ok(capsys, "validate", vector_path)
    assert out.startswith(f"{vector_path}: ok (") and out.count("\n") == 1
    # A file fits the destination it describes itself.
    out = run_ok(capsys, "validate", vector_path, "--against", vector_path)
    assert f"fits {vector_path}" in out


@pytest.mark.vectors("invalid")
def test_validate_invalid_vector(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, vector: dict, vector_path: Path
) -> None:
    path = vector_path
    invalid_vector_outcome(capsys, "validate", vector, path)

    # Against the manifest's own destination (the description format is that vocabulary),
    # every invalid vector is rejected with the error class of its category.
    description = tmp_path / "destination.json"
    description.write_text(json.dumps(vector))
    code, out, err = run(capsys, "validate", path, "--against", description)
    assert (code, out) == (1, "")
    one_line_rejection(err, CLASS_OF_CATEGORY[vector["category"]])


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
        one_line_rejection(err, error_class)


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
    one_line_rejection(err, "CheckpointError")
    assert "tlckpt.order" in err and "ref.safetensors" in err
    # The same tensors with tlckpt's order metadata (written by convert) are a reference.
    assert run(capsys, "convert", tmp_path / "ref.pt", tmp_path / "ordered.safetensors")[0] == 0
    assert run(capsys, "validate", basic, "--against", tmp_path / "ordered.safetensors")[0] == 0
    torch.save({k: v.double() for k, v in state.items()}, tmp_path / "f64.pt")
    # TLSF32B into a float64 model
    refused(capsys, "ConfigError", "validate", basic, "--against", tmp_path / "f64.pt")


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
    err = refused(
        capsys,
        "MalformedError",
        "validate",
        VECTORS_DIR / "state_basic.tlsf32",
        "--against",
        tmp_path / "d.json",
    )
    assert message in err and "d.json" in err


def test_missing_file_is_a_one_line_rejection(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    refused(capsys, "FileNotFoundError", "validate", tmp_path / "nope.tladam")
