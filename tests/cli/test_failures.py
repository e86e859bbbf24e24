"""The command line fails in one line: exit 1 for every failure, 2 for usage, 130 for Ctrl-C.

* ``validate --against`` and ``convert`` name both families when a file is of another family
  than the destination or its extension says, for every pair, both ways;
* ``--max-json-bytes`` caps JSON reads without a destination, and parses sizes;
* memory exhaustion, a missing optional dependency and an unexpected error are one line too;
* sparse files of 4 and 12 GiB through ``inspect``, ``validate`` and ``convert`` in a child
  process under an address-space limit: one line, exit 1, small peak memory.
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from cli_support import VECTORS_DIR, one_line_rejection, run

from tlckpt.codec.families import family_named, family_title
from tlckpt.codec.sniffing import HEAD_BYTES
from tlckpt.testing.limits import run_limited, sparse_file

cli_main = importlib.import_module("tlckpt.cli.main")  # the module (``cli.main`` is its function)
GiB = 1 << 30
FILES = {
    "adam": VECTORS_DIR / "adam_v4_counter.tladam",
    "float32_state": VECTORS_DIR / "state_basic.tlsf32",
    "state_bits": VECTORS_DIR / "bits_float32.json",
}


# --------------------------------------------------------------------------- families


#: The families whose files a reference of each family takes: either optimizer family's files
#: load into an optimizer, so a ``TLADAMF`` reference takes ``TLCKOPT`` files too.
TAKERS = {"adam": ("adam", "tlckpt_optimizer"), "tlckpt_optimizer": ("tlckpt_optimizer", "adam")}
OWN_FAMILY = "tlckpt_optimizer"


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """:data:`FILES`, and a small ``TLCKOPT`` file (tlckpt's own optimizer family, which has
    no conformance vector: its family's own first example)."""
    own = tmp_path_factory.mktemp("own") / "optimizer.tlckopt"
    own.write_bytes(family_named(OWN_FAMILY).examples()[0].data)
    return {**FILES, OWN_FAMILY: own}


@pytest.mark.parametrize(
    ("found", "wanted"),
    [
        (a, b)
        for a, b in itertools.permutations([*FILES, OWN_FAMILY], 2)
        if a not in TAKERS.get(b, ())
    ],
)
def test_validate_against_another_family_names_both(
    capsys: pytest.CaptureFixture[str], files: dict[str, Path], found: str, wanted: str
) -> None:
    reference = files[wanted]
    code, out, err = run(capsys, "validate", files[found], "--against", reference)
    assert code == 1 and out == ""
    line = one_line_rejection(err, "UnsupportedFormatError")
    titles = " or ".join(family_title(f) for f in TAKERS.get(wanted, (wanted,)))
    assert line.endswith(
        f"{files[found]}, field magic: the families differ: this is {family_title(found)}, "
        f"not {titles} as the destination ({reference}) requires"
    )


@pytest.mark.parametrize("kind", ["adam", "float32_state", "state_bits"])
def test_validate_against_a_description_of_another_family(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, kind: str
) -> None:
    descriptions = {
        "adam": '{"schema": {"shapes": [[2]], "requires_grad": [true]}}',
        "float32_state": '{"kind": "float32_state", "shapes": [[2]]}',
        "state_bits": '{"kind": "state_bits", "encoding": "float32", "shapes": [[2]]}',
    }
    (tmp_path / "d.json").write_text(descriptions[kind])
    for found, path in FILES.items():
        if found == kind:
            continue
        code, _, err = run(capsys, "validate", path, "--against", tmp_path / "d.json")
        assert code == 1
        assert f"this is {family_title(found)}, not {family_title(kind)}" in one_line_rejection(
            err, "UnsupportedFormatError"
        )


def test_validate_adam_file_against_model_state(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    torch.save({"w": torch.zeros(2)}, tmp_path / "ref.pt")
    code, _, err = run(capsys, "validate", FILES["adam"], "--against", tmp_path / "ref.pt")
    assert code == 1
    assert (
        f"this is {family_title('adam')}, not {family_title('float32_state')} or "
        f"{family_title('state_bits')}" in one_line_rejection(err, "UnsupportedFormatError")
    )


@pytest.mark.parametrize(
    ("found", "extension"), [("float32_state", "json"), ("state_bits", "tlsf32")]
)
def test_convert_a_file_of_another_family_than_its_extension(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, found: str, extension: str
) -> None:
    disguised = tmp_path / f"model.{extension}"
    disguised.write_bytes(FILES[found].read_bytes())
    code, _, err = run(capsys, "convert", disguised, tmp_path / "out.pt")
    assert code == 1
    wanted = "state_bits" if extension == "json" else "float32_state"
    assert f"this is {family_title(found)}, not {family_title(wanted)}" in one_line_rejection(
        err, "UnsupportedFormatError"
    )
    assert not (tmp_path / "out.pt").exists()


# --------------------------------------------------------------------------- the cap


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("0", 0),
        ("4096", 4096),
        ("1k", 1024),
        ("8G", 8 * GiB),
        ("8GiB", 8 * GiB),
        (" 2 tb", 2 << 40),
    ],
)
def test_byte_sizes(text: str, size: int) -> None:
    assert cli_main.byte_size(text) == size


@pytest.mark.parametrize("text", ["", "G", "1.5G", "-1", "8X", "8 Gibibytes"])
def test_bad_byte_sizes(capsys: pytest.CaptureFixture[str], text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        cli_main.byte_size(text)
    code, _, err = run(capsys, "inspect", FILES["state_bits"], "--max-json-bytes", text)
    assert code == 2 and "not a size" in err


def test_max_json_bytes(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = FILES["state_bits"]
    size = path.stat().st_size
    for argv in (
        ["inspect", path],
        ["validate", path],
        ["convert", path, tmp_path / "out.tlsf32"],
        ["validate", path, "--against", path],
    ):
        code, _, err = run(capsys, *argv, "--max-json-bytes", size - 1)
        assert code == 1
        assert "JSON read cap" in one_line_rejection(err, "FileTooLargeError")
        assert run(capsys, *argv, "--max-json-bytes", size)[0] == 0
    # binary files need no cap; a destination bounds a JSON read by itself
    assert run(capsys, "inspect", FILES["adam"], "--max-json-bytes", 1)[0] == 0
    (tmp_path / "d.json").write_text('{"kind": "state_bits", "shapes": [[1000]]}')
    code, _, err = run(capsys, "validate", path, "--against", tmp_path / "d.json")
    assert code == 1 and "SchemaMismatchError" in err


# --------------------------------------------------------------------------- one line


@pytest.mark.parametrize(
    ("error", "code", "line"),
    [
        (MemoryError(), 1, "tlckpt: MemoryError: out of memory"),
        (
            ModuleNotFoundError("No module named 'safetensors'"),
            1,
            "tlckpt: ModuleNotFoundError: No module named 'safetensors'",
        ),
        (
            RuntimeError("a bug\nover two lines"),
            1,
            "tlckpt: internal error: RuntimeError: a bug over two lines (please report it)",
        ),
        (KeyboardInterrupt(), 130, "tlckpt: interrupted"),
        (PermissionError(13, "Permission denied"), 1, "tlckpt: PermissionError: [Errno 13]"),
    ],
)
def test_every_failure_is_one_line_rejection(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    error: BaseException,
    code: int,
    line: str,
) -> None:
    def fail(*args: Any, **kwargs: Any) -> Any:
        raise error

    for command, name in (("inspect", "inspect"), ("validate", "validate"), ("convert", "convert")):
        monkeypatch.setattr(cli_main, name, fail)
        argv = [command, FILES["float32_state"]]
        if command == "convert":
            argv.append("out.json")
        status, out, err = run(capsys, *argv)
        assert (status, out) == (code, "")
        assert len(err.strip().splitlines()) == 1 and err.startswith(line), err


# --------------------------------------------------------------------------- sparse files

DOCUMENT = (
    b'{"format": "torchlean_state_float32_bits_v1", "state": [{"shape": [2], "values": [1, 2]}]}'
)


@pytest.fixture(scope="module")
def sparse(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("sparse-cli")
    files = {
        "json-4g": sparse_file(folder / "json-4g.json", 4 * GiB, DOCUMENT),
        "json-12g": sparse_file(folder / "json-12g.json", 12 * GiB, b" " * HEAD_BYTES + DOCUMENT),
        "zeros-12g": sparse_file(folder / "zeros-12g.json", 12 * GiB),
    }
    (folder / "d.json").write_text('{"kind": "state_bits", "encoding": "float32", "shapes": [[2]]}')
    if sum(p.stat().st_blocks for p in files.values()) * 512 > 64 << 20:
        pytest.fail("the file system stores holes: sparse files would fill the disk")
    return files


@pytest.mark.parametrize(
    ("command", "name", "error", "reason"),
    [
        ("inspect", "json-4g", "MalformedError", "a NUL byte at position 90"),
        ("validate", "json-4g", "MalformedError", "a NUL byte at position 90"),
        ("validate --against", "json-4g", "FileTooLargeError", "largest valid encoding"),
        ("convert", "json-4g", "MalformedError", "a NUL byte at position 90"),
        ("inspect", "json-12g", "FileTooLargeError", "JSON read cap"),
        ("validate", "json-12g", "FileTooLargeError", "JSON read cap"),
        ("convert", "json-12g", "FileTooLargeError", "JSON read cap"),
        ("validate", "zeros-12g", "UnsupportedFormatError", "not a TorchLean checkpoint"),
        ("convert", "zeros-12g", "UnsupportedFormatError", "not a TorchLean checkpoint"),
        ("validate --against", "zeros-12g", "MalformedError", "not JSON"),
    ],
)
def test_sparse_files_are_one_line_refusals(
    sparse: dict[str, Path], command: str, name: str, error: str, reason: str
) -> None:
    """With 2 GiB of address space (the 4 GiB file is within the default cap: its read stops
    at the first NUL byte of the hole); nothing is written."""
    path = sparse[name]
    argv = [sys.executable, "-m", "tlckpt", *command.split()[:1], str(path)]
    if command == "validate --against":
        argv += ["--against", str(path.parent / "d.json")]
    if command == "convert":
        argv.append(str(path.parent / "out.tlsf32"))
    child = run_limited(argv, 2 * GiB, timeout=120)
    assert (child.returncode, child.stdout) == (1, "")
    assert reason in one_line_rejection(child.stderr, error)
    assert child.max_rss < 512 << 20
    assert not (path.parent / "out.tlsf32").exists()
