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

import tlckpt


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


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (b"\xff" * 8 + b"{}", "FileTooLargeError"),  # the header length over the limit
        (b"\x02" + b"\x00" * 7 + b"{]", "MalformedError"),  # the header not JSON
    ],
)
def test_convert_rejects_bad_safetensors(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, data: bytes, error: str
) -> None:
    """The repository's own reader refuses them, with its typed errors."""
    (tmp_path / "bad.safetensors").write_bytes(data)
    refused(capsys, error, "convert", tmp_path / "bad.safetensors", tmp_path / "out.json")


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


def test_convert_refuses_optimizer_and_state_trees(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Their structure lives in ``__metadata__``, which no target holds: refused, named."""
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(1, 2)).sum().backward()
    opt.step()
    tlckpt.save_optimizer(opt, model, tmp_path / "opt.safetensors")
    tlckpt.save_state({"w": torch.ones(2), "step": 3}, tmp_path / "tree.safetensors")
    for name, what in (("opt", "optimizer tree"), ("tree", "state tree")):
        err = refused(
            capsys, "ConfigError", "convert", tmp_path / f"{name}.safetensors", tmp_path / "x.pt"
        )
        assert what in err
    assert not (tmp_path / "x.pt").exists()


def test_convert_keeps_tied_names(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A tied name (stored once, ``other → kept`` in metadata) converts under both names."""
    emb = torch.nn.Embedding(4, 3)
    head = torch.nn.Linear(3, 4, bias=False)
    head.weight = emb.weight
    model = torch.nn.ModuleDict({"emb": emb, "head": head})
    tlckpt.save_module_state(model, tmp_path / "tied.safetensors")
    code, _, err = run(capsys, "convert", tmp_path / "tied.safetensors", tmp_path / "tied.pt")
    assert code == 0, err
    state = torch.load(tmp_path / "tied.pt", weights_only=True)
    assert sorted(state) == ["emb.weight", "head.weight"]
    assert torch.equal(state["emb.weight"], emb.weight) and torch.equal(
        state["head.weight"], emb.weight
    )


def test_convert_says_optimizer_files_are_not_model_state(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, _, err = run(capsys, "convert", tmp_path / "opt.tladam", tmp_path / "x.safetensors")
    assert code == 2 and "optimizer file" in err and "load_optimizer" in err
