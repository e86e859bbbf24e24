"""How much of a file the exact-bits JSON readers take, and when they refuse it unread.

* The first bytes decide: a binary checkpoint (the families differ), anything but ``{`` after
  leading whitespace, an empty file, a byte order mark. Proven with a file object that counts
  the bytes read: never more than ``HEAD_BYTES``.
* A destination bounds a read from the file's size (the largest valid encoding of the
  expected tensors), and the bound takes generously laid out documents of the widest words.
* Without a destination, ``max_json_bytes`` caps it; leading whitespace past the head counts.
* ``MemoryError`` never leaves a reader: it is a ``FileTooLargeError`` naming file and size.
* Sparse files of 4 and 12 GiB, read in a child process under an address-space limit, are
  refused with a ``CheckpointError``, in a child whose peak memory stays small; a document
  is read a chunk at a time and refused at its first NUL byte.
"""

from __future__ import annotations

import io
import json
import re
import sys
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import pytest

from tlckpt.codec import (
    DEFAULT_MAX_JSON_BYTES,
    CheckpointError,
    FileTooLargeError,
    MalformedError,
    UnsupportedFormatError,
    inspect,
    read_float32_state,
    sniff_family,
)
from tlckpt.codec.exact_json.json_document import largest_document
from tlckpt.codec.families import families_differ, family_title
from tlckpt.codec.fileio import source as source_module
from tlckpt.codec.model_state.state_bits import inspect_state_bits, read_state_bits
from tlckpt.codec.model_state.state_bits_writer import write_state_bits
from tlckpt.codec.sniffing import HEAD_BYTES
from tlckpt.formats.state_bits import ENCODINGS, encoding_by_name
from tlckpt.testing.limits import DESTINATION, run_limited, sparse_file
from tlckpt.testing.vectors import vectors_dir

VECTORS = vectors_dir()
F32 = "torchlean_state_float32_bits_v1"
GiB = 1 << 30
PADDING = 1 << 20  # bytes after a refused head: never read


class CountingFile(io.BytesIO):
    """An in-memory file that counts the bytes handed out."""

    def __init__(self, data: bytes):
        super().__init__(data)
        self.bytes_read = 0

    def read(self, size: int | None = -1) -> bytes:
        data = super().read(size)
        self.bytes_read += len(data)
        return data

    def readinto(self, buffer: Any) -> int:
        n = super().readinto(buffer)
        self.bytes_read += n
        return n


def doc(*state: Any, tag: str = F32) -> bytes:
    return json.dumps({"format": tag, "state": list(state)}).encode()


# --------------------------------------------------------------------------- first bytes

BINARY = {
    "float32_state": (VECTORS / "state_basic.tlsf32").read_bytes(),
    "adam": (VECTORS / "adam_v4_counter.tladam").read_bytes(),
}


@pytest.mark.parametrize(
    ("data", "error", "match"),
    [
        (BINARY["float32_state"], UnsupportedFormatError, "this is a TLSF32B file"),
        (BINARY["adam"], UnsupportedFormatError, "this is a TLADAMF file"),
        (b"\0" * 64, MalformedError, "not JSON: the document starts with b'\\\\x00"),
        (b"TLSF", MalformedError, "not JSON"),
        (b"not json", MalformedError, "not JSON"),
        (b"null", MalformedError, "top level is not a JSON object"),
        (b'  "text"', MalformedError, "top level is not a JSON object"),
        (b"[1, 2]", MalformedError, "top level is not a JSON object"),
        (b"-1", MalformedError, "top level is not a JSON object"),
        (b"\xef\xbb\xbf{}", MalformedError, "byte order mark"),
        (b"\xff\xfe{\x00}\x00", MalformedError, "not JSON"),
        (b"", MalformedError, "not JSON: the document is empty"),
        (b" \n\t\r", MalformedError, "whitespace only"),
    ],
)
def test_first_bytes_decide_unread(data: bytes, error: type[Exception], match: str) -> None:
    padded = data + b"\0" * PADDING if data.strip() else data
    for call in (
        lambda f: read_state_bits(f, DESTINATION, "float32"),
        lambda f: inspect_state_bits(f),
    ):
        f = CountingFile(padded)
        with pytest.raises(error, match=match) as info:
            call(f)
        assert type(info.value) is error
        assert f.bytes_read <= HEAD_BYTES
        assert info.value.offset is None


@pytest.mark.parametrize("found", sorted(BINARY))
def test_binary_file_read_as_json_names_its_family(found: str, tmp_path: Path) -> None:
    path = tmp_path / "model.json"
    path.write_bytes(BINARY[found])
    expected = (
        f"{path}, field magic: the families differ: this is {family_title(found)}, "
        "not an exact-bits JSON file (model state)"
    )
    for call in (
        lambda: read_state_bits(path, DESTINATION, "float32"),
        lambda: inspect_state_bits(path),
    ):
        with pytest.raises(UnsupportedFormatError) as info:
            call()
        assert str(info.value) == expected
        assert (info.value.actual, info.value.expected) == (found, "state_bits")


def test_family_titles() -> None:
    assert family_title("float32_state") == "a TLSF32B file (float32 model state)"
    assert family_title("adam") == "a TLADAMF file (Adam/AdamW optimizer state)"
    assert family_title("state_bits") == "an exact-bits JSON file (model state)"
    error = families_differ("state_bits", ("float32_state", "adam"), destination="ref.tlsf32")
    assert error.reason == (
        "the families differ: this is an exact-bits JSON file (model state), not a TLSF32B "
        "file (float32 model state) or a TLADAMF file (Adam/AdamW optimizer state) as the "
        "destination (ref.tlsf32) requires"
    )


def test_leading_whitespace_past_the_head_is_read_and_judged_whole() -> None:
    body = doc({"shape": [2], "values": [1, 2]})
    data = b" \n" * HEAD_BYTES + body
    [back] = read_state_bits(io.BytesIO(data), [[2]], "float32")
    assert back.view(np.uint32).tolist() == [1, 2]
    assert sniff_family(io.BytesIO(data)) == "state_bits"
    assert inspect(io.BytesIO(data))["tensors"] == [{"shape": [2], "elements": 2}]
    # ... counted against the cap like every other byte
    f = CountingFile(data)
    with pytest.raises(FileTooLargeError):
        inspect_state_bits(f, max_json_bytes=len(data) - 1)
    assert f.bytes_read <= HEAD_BYTES
    with pytest.raises(MalformedError, match="not JSON"):
        inspect_state_bits(io.BytesIO(b" " * (2 * HEAD_BYTES)))


def test_reading_stops_at_the_first_nul_byte() -> None:
    """No JSON text holds a NUL byte: the hole of a sparse file is refused on arrival."""
    body = doc({"shape": [2], "values": [1, 2]})
    with mock.patch("tlckpt.codec.exact_json.json_document.READ_CHUNK", 1024):
        f = CountingFile(body + b"\0" * PADDING)
        with pytest.raises(MalformedError, match=f"a NUL byte at position {len(body)} of"):
            inspect_state_bits(f)
        assert f.bytes_read <= HEAD_BYTES + 1024
        for nul_at in (0, 5, len(body) - 1):
            data = body[:nul_at] + b"\0" + body[nul_at + 1 :] if nul_at else b"{\0}"
            with pytest.raises(MalformedError, match="not JSON"):
                read_state_bits(io.BytesIO(data), [(2,)], "float32")
        # read in many chunks, a valid document is read whole
        [back] = read_state_bits(io.BytesIO(body + b" " * 5000), [(2,)], "float32")
        assert back.view(np.uint32).tolist() == [1, 2]


# --------------------------------------------------------------------------- bounds


def test_destination_bounds_the_read_from_the_size() -> None:
    fmt = encoding_by_name("float32")
    limit = largest_document([(4,)], fmt)
    body = doc({"shape": [4], "values": [1, 2, 3, 4]})
    at_limit = body + b" " * (limit - len(body))
    [back] = read_state_bits(io.BytesIO(at_limit), [(4,)], "float32")
    assert back.view(np.uint32).tolist() == [1, 2, 3, 4]
    f = CountingFile(at_limit + b" ")
    with pytest.raises(FileTooLargeError, match="largest valid encoding") as info:
        read_state_bits(f, [(4,)], "float32")
    assert f.bytes_read <= HEAD_BYTES
    assert (info.value.actual, info.value.field) == (limit + 1, "document")
    # the bound grows with the destination: the same file fits a larger one's bound
    with pytest.raises(CheckpointError, match="shape"):
        read_state_bits(io.BytesIO(at_limit + b" "), [(1000,)], "float32")


@pytest.mark.parametrize("encoding", sorted(ENCODINGS))
def test_bound_takes_generous_layouts_of_the_widest_words(encoding: str) -> None:
    """Every word the widest, each on its own deeply indented line, names and a comment."""
    fmt = encoding_by_name(encoding)
    shapes = [(2, 3), (), (0, 99_999_999), (5,)]
    top = (1 << fmt.width) - 1
    state = []
    for shape in shapes:
        count = int(np.prod(shape))
        values: list[Any] = [[top, top]] * count if fmt.pair else [top] * count
        state.append({"name": "n" * 500, "shape": list(shape), "values": values})
    document = {"comment": "c" * 500_000, "format": fmt.tag, "state": state}
    for indent in (8, "\t\t\t\t"):
        data = json.dumps(document, indent=indent).encode()
        assert len(data) <= largest_document(shapes, fmt)
        arrays = read_state_bits(io.BytesIO(data), shapes, encoding)
        assert [a.shape[: len(s)] for a, s in zip(arrays, shapes)] == shapes


def test_our_writer_is_well_inside_the_bound() -> None:
    arrays = [np.full((64, 64), np.nan, np.float64), np.zeros(0), np.float64(-0.0)]
    fmt = encoding_by_name("float64")
    for pretty in (True, False):
        out = io.BytesIO()
        write_state_bits(out, arrays, "float64", pretty=pretty)
        bound = largest_document([a.shape for a in arrays], fmt)
        assert len(out.getvalue()) < bound / 2


def test_cap_without_destination() -> None:
    assert DEFAULT_MAX_JSON_BYTES / GiB == 4
    data = doc({"shape": [2], "values": [1, 2]})
    assert inspect_state_bits(io.BytesIO(data), max_json_bytes=len(data))["bytes"] == len(data)
    assert inspect(io.BytesIO(data), max_json_bytes=len(data))["family"] == "state_bits"
    for call in (inspect_state_bits, inspect):
        f = CountingFile(data)
        with pytest.raises(FileTooLargeError, match="JSON read cap max_json_bytes"):
            call(f, max_json_bytes=len(data) - 1)
        assert f.bytes_read <= HEAD_BYTES
    # binary files are read record by record: the cap is for JSON only
    assert inspect(io.BytesIO(BINARY["float32_state"]), max_json_bytes=1)["tensors"]


# --------------------------------------------------------------------------- memory


def test_memory_error_never_leaves_a_reader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "state.json"
    path.write_bytes(doc({"shape": [2], "values": [1, 2]}))
    size = path.stat().st_size
    binary = tmp_path / "state.tlsf32"
    binary.write_bytes(BINARY["float32_state"])

    def exhausted(*args: Any, **kwargs: Any) -> Any:
        raise MemoryError

    with mock.patch("orjson.loads", exhausted), pytest.raises(FileTooLargeError):
        inspect_state_bits(path)
    shapes = [tuple(t["shape"]) for t in inspect(binary)["tensors"]]
    monkeypatch.setattr(source_module.Source, "read", exhausted)
    monkeypatch.setattr(source_module.Source, "readinto", exhausted)
    for call in (
        lambda: read_state_bits(path, [(2,)], "float32"),
        lambda: inspect_state_bits(path),
        lambda: inspect(path),
    ):
        with pytest.raises(FileTooLargeError) as info:
            call()
        assert str(info.value) == f"{path}: out of memory while reading this {size}-byte file"
        assert info.value.actual == size
    with pytest.raises(FileTooLargeError, match="out of memory"):
        read_float32_state(binary, shapes)


# --------------------------------------------------------------------------- sparse files

DOCUMENT = doc({"shape": [2], "values": [1, 2]})
SPARSE = {
    # name: (size, head, tail)
    "json-then-hole-4g": (4 * GiB, DOCUMENT, b""),
    "json-then-hole-12g": (12 * GiB, DOCUMENT, b""),
    "spaces-json-hole-12g": (12 * GiB, b" " * (2 * HEAD_BYTES) + DOCUMENT[:-2], b""),
    "zeros-4g": (4 * GiB, b"", b""),
    "hole-then-json-12g": (12 * GiB, b"", DOCUMENT),
}
#: What each reader says, by file: the destination's bound, the cap, or the first bytes; a
#: file the cap lets through (4 GiB) is refused at its first NUL byte, 64 MiB into it.
EXPECTED = {
    ("read_state_bits", "json-then-hole-4g"): "FileTooLargeError: .*largest valid encoding",
    ("read_state_bits", "json-then-hole-12g"): "FileTooLargeError: .*largest valid encoding",
    ("read_state_bits", "spaces-json-hole-12g"): "FileTooLargeError: .*largest valid encoding",
    ("read_state_bits", "zeros-4g"): "MalformedError: .*not JSON",
    ("read_state_bits", "hole-then-json-12g"): "MalformedError: .*not JSON",
    ("load_state_bits", "json-then-hole-12g"): "FileTooLargeError: .*largest valid encoding",
    ("load_state_bits", "zeros-4g"): "MalformedError: .*not JSON",
    ("inspect", "json-then-hole-4g"): "MalformedError: .*a NUL byte at position 90 of",
    ("inspect", "json-then-hole-12g"): "FileTooLargeError: .*JSON read cap",
    ("inspect", "spaces-json-hole-12g"): "FileTooLargeError: .*JSON read cap",
    ("inspect", "zeros-4g"): "UnsupportedFormatError: .*not a TorchLean checkpoint",
    ("inspect", "hole-then-json-12g"): "UnsupportedFormatError: .*not a TorchLean checkpoint",
}


@pytest.fixture(scope="module")
def sparse_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("sparse")
    files = {
        name: sparse_file(folder / f"{name}.json", size, head, tail)
        for name, (size, head, tail) in SPARSE.items()
    }
    blocks = sum(p.stat().st_blocks for p in files.values())
    if blocks * 512 > 64 << 20:
        pytest.fail("the file system stores holes: sparse files would fill the disk")
    return files


def test_sparse_files_under_an_address_space_limit(sparse_files: dict[str, Path]) -> None:
    """One child (torch imported for load_state_bits) runs every reader on every file, with
    2 GiB of address space: each is refused with a CheckpointError, none reads the file."""
    pairs = [f"{entry}:{sparse_files[name]}" for entry, name in EXPECTED]
    child = run_limited(
        [sys.executable, "-m", "tlckpt.testing.limits", *pairs], 3 * GiB, timeout=300
    )
    assert child.returncode == 0, child.stderr
    lines = [json.loads(line) for line in child.stdout.splitlines()]
    assert len(lines) == len(EXPECTED)
    for (entry, name), pattern, line in zip(EXPECTED, EXPECTED.values(), lines):
        assert line["entry"] == entry and line["file"] == str(sparse_files[name])
        assert re.match(pattern, line["outcome"]), (entry, name, line)
    assert child.max_rss < 1 * GiB  # torch and numpy included; the files are 4 and 12 GiB
