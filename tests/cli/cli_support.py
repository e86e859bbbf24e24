"""Helpers shared by the command-line tests: running ``tlckpt`` in-process, the one-line
rejection it must print, and the conformance vectors as the CLI sees them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tlckpt import cli
from tlckpt.codec.errors import ERROR_OF_CATEGORY
from tlckpt.testing.vectors import vectors_dir

VECTORS_DIR = vectors_dir()
MANIFEST = json.loads((VECTORS_DIR / "manifest.json").read_text())

#: Error class the CLI names for each manifest category (the codec's table).
CLASS_OF_CATEGORY = {category: error.__name__ for category, error in ERROR_OF_CATEGORY.items()}

#: Invalid vectors that are well-formed files in themselves: they break a rule only against
#: the destination the manifest gives (schema, dtype, config or shape of the reader). Alone,
#: ``inspect`` and ``validate`` accept them; ``validate --against`` rejects them.
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

#: The manifest's sections of valid vectors (``@pytest.mark.vectors(*VALID_SECTIONS)``).
VALID_SECTIONS = ("adam", "float32_state", "state_bits")


def run(capsys: pytest.CaptureFixture[str], *argv: Any) -> tuple[int, str, str]:
    """``tlckpt ARGV`` in-process: exit status, stdout, stderr."""
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def run_ok(capsys: pytest.CaptureFixture[str], *argv: Any) -> str:
    """``tlckpt ARGV`` in-process, which must succeed (exit 0) and print nothing on stderr;
    its stdout."""
    code, out, err = run(capsys, *argv)
    assert (code, err) == (0, ""), err
    return out


def one_line_rejection(err: str, error_class: str | None = None) -> str:
    """Assert that ``err`` is one line ``tlckpt: ...`` without a traceback, naming
    ``error_class`` first if given; the line."""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert lines[0].startswith("tlckpt: ")
    if error_class is not None:
        assert lines[0].startswith(f"tlckpt: {error_class}: "), lines[0]
    return lines[0]


def refused(capsys: pytest.CaptureFixture[str], error_class: str | None, *argv: Any) -> str:
    """``tlckpt ARGV`` in-process, which must fail (exit 1) with a one-line rejection naming
    ``error_class`` (if given); its stderr."""
    code, _, err = run(capsys, *argv)
    assert code == 1, err
    one_line_rejection(err, error_class)
    return err


def invalid_vector_outcome(
    capsys: pytest.CaptureFixture[str], command: str, vector: dict, path: Path
) -> str | None:
    """``tlckpt COMMAND PATH`` on an invalid vector: one that only a destination can reject
    (:data:`DESTINATION_ONLY`) passes silently; any other is refused with a one-line rejection
    and nothing on stdout. Returns that rejection's stderr, or None if the file passed."""
    code, out, err = run(capsys, command, path)
    if vector["file"] in DESTINATION_ONLY:
        assert (code, err) == (0, "")
        return None
    assert (code, out) == (1, "")
    one_line_rejection(err)
    return err
