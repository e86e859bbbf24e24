"""``tlckpt convert`` refuses what it cannot convert exactly or safely, in one line: code in a
``.pt`` pickle, broken sources, sparse and complex tensors it cannot hold, names that do not
fit; nothing is written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from cli_support import (
    VECTORS_DIR,
    one_line_rejection,
    refused,
    run,
)


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
    one_line_rejection(err, "UnsupportedFormatError")
    assert "weights_only" in err
    for junk in (b"", b"PK\x03\x04 not a zip", b"\x80\x02}q\x00."):
        (tmp_path / "junk.pt").write_bytes(junk)
        refused(capsys, None, "convert", tmp_path / "junk.pt", tmp_path / "out.json")


def test_convert_rejects_bad_safetensors(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (tmp_path / "bad.safetensors").write_bytes(b"\xff" * 8 + b"{}")
    refused(
        capsys, "MalformedError", "convert", tmp_path / "bad.safetensors", tmp_path / "out.json"
    )


def test_convert_rejects_bad_source_checkpoint(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    refused(
        capsys,
        "TruncatedError",
        "convert",
        VECTORS_DIR / "bad_state_truncated.tlsf32",
        tmp_path / "o.pt",
    )
    assert not (tmp_path / "o.pt").exists()


def test_convert_refusals_are_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    torch.save({"s": torch.eye(3).to_sparse()}, tmp_path / "sparse.pt")
    code, _, err = run(capsys, "convert", tmp_path / "sparse.pt", tmp_path / "x.json")
    assert code == 1 and "dense" in err
    one_line_rejection(err, "ConfigError")

    torch.save({"c": torch.tensor([0.1 + 1j], dtype=torch.complex64)}, tmp_path / "c.pt")
    # One line: no torch warning leaks either.
    refused(
        capsys,
        "ConfigError",
        "convert",
        tmp_path / "c.pt",
        tmp_path / "x.json",
        "--dtype",
        "complex32",
    )
    code, _, err = run(capsys, "convert", tmp_path / "c.pt", tmp_path / "x.tlsf32")
    assert code == 1 and "complex and real" in err

    torch.save({"a": torch.zeros(3)}, tmp_path / "names.pt")
    refused(
        capsys,
        "SchemaMismatchError",
        "convert",
        VECTORS_DIR / "state_basic.tlsf32",
        tmp_path / "x.pt",
        "--names-from",
        tmp_path / "names.pt",
    )
