"""The leased load's copies from a mapping of the file (``codec/fileio/mapped.py``).

Under a read lease, large payloads whose pages are in memory are copied from a read-only
mapping of the file instead of read with ``preadv`` (the kernel's copy is slow where the file
offset and the tensor differ in alignment, as every ``TLSF32B`` payload does). These tests
hold the conditions the mapping is used under: pages in memory (cold ones are read), the
lease unbroken (once a writer asks, the rest is read), every page mapped in without error
(else read), tied copies compared there, and the process's resident set not grown by the
file. Real files, the real kernel.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

import tlckpt
from tlckpt.codec import SchemaMismatchError
from tlckpt.codec.fileio import leases, mapped, transfer
from tlckpt.testing.processes import PeakProbe, current_rss

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="read leases and mincore are Linux's"
)

#: 1 Mi float32 values per weight: 4 MiB payloads, well above transfer.MAPPED_MIN_PIECE.
WIDTH = 1024


class _Big(torch.nn.Module):
    def __init__(self, layers: int, seed: int):
        super().__init__()
        torch.manual_seed(seed)
        self.layers = torch.nn.ModuleList(
            torch.nn.Linear(WIDTH, WIDTH, bias=True) for _ in range(layers)
        )


def _holds(model: torch.nn.Module, other: torch.nn.Module) -> bool:
    return all(
        torch.equal(a.view(torch.int32), b.view(torch.int32))
        for a, b in zip(model.state_dict().values(), other.state_dict().values())
    )


class _Copies:
    """Each call of the transfer's mapped copy and whether it copied (else ``preadv`` read)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self.results: list[bool] = []
        real = transfer._copy_mapped

        def spy(mapping: Any, call: Any) -> bool:
            done = real(mapping, call)
            self.results.append(done)
            return done

        monkeypatch.setattr(transfer, "_copy_mapped", spy)


def _granted(path: Path) -> None:
    if not leases.lease_possible(path):
        pytest.skip("no read lease on this file system")


@pytest.mark.parametrize("layers", [3, 12])  # 12 MiB: one thread; 48 MiB: several
def test_warm_payloads_are_copied_from_the_mapping(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, layers: int
) -> None:
    path = tmp_path / "m.tlsf32"
    saved = _Big(layers, 1)
    tlckpt.save_module_state(saved, path)
    _granted(path)
    copies = _Copies(monkeypatch)
    live = _Big(layers, 2)
    tlckpt.load_module_state(live, path)  # the save left its pages in memory
    assert _holds(live, saved)
    assert copies.results and all(copies.results)


def test_cold_payloads_are_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "m.tlsf32"
    saved = _Big(3, 1)
    tlckpt.save_module_state(saved, path)  # durable: no dirty page stays in the cache
    _granted(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    copies = _Copies(monkeypatch)
    live = _Big(3, 2)
    tlckpt.load_module_state(live, path)
    assert _holds(live, saved)
    # The first chunk is read; later ones may be in memory by then (the kernel's readahead).
    assert copies.results and copies.results[0] is False
    copies.results.clear()
    tlckpt.load_module_state(_Big(3, 3), path)  # the reads left the pages in memory
    assert copies.results and all(copies.results)


def test_pages_that_cannot_be_mapped_in_are_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``MADV_POPULATE_READ`` failing (an unreadable page, an old kernel) never reaches a
    copy that would touch the page: the chunk is read instead."""
    path = tmp_path / "m.tlsf32"
    saved = _Big(3, 1)
    tlckpt.save_module_state(saved, path)
    _granted(path)
    monkeypatch.setattr(mapped, "_POPULATE_READ", 0x7FFF)  # EINVAL from every madvise
    copies = _Copies(monkeypatch)
    live = _Big(3, 2)
    tlckpt.load_module_state(live, path)
    assert _holds(live, saved)
    assert copies.results and not any(copies.results)


_WRITER = """
import sys, time
start = time.monotonic()
with open(sys.argv[1], "r+b") as f:  # waits while the loader holds its lease
    opened = time.monotonic()
print(f"{start} {opened}", flush=True)
"""


def test_once_a_writer_asks_the_rest_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After the first mapped copy a writer opens the file: the kernel breaks the lease, the
    writer waits for the load's end, and no later chunk is copied from the mapping."""
    path = tmp_path / "m.tlsf32"
    saved = _Big(3, 1)
    tlckpt.save_module_state(saved, path)
    _granted(path)
    monkeypatch.setattr(transfer, "CHUNK_BYTES", 1 << 20)  # 12 chunks of 1 MiB
    results: list[bool] = []
    seen: dict[str, Any] = {}
    real = transfer._copy_mapped

    def spy(mapping: Any, call: Any) -> bool:
        done = real(mapping, call)
        results.append(done)
        if "writer" not in seen:
            seen["writer"] = subprocess.Popen(
                [sys.executable, "-c", _WRITER, str(path)], stdout=subprocess.PIPE, text=True
            )
            deadline = time.monotonic() + 20
            while fcntl.fcntl(mapping.lease.fd, fcntl.F_GETLEASE) == fcntl.F_RDLCK:
                assert time.monotonic() < deadline, "the writer never broke the lease"
                time.sleep(0.005)
            seen["broken"] = time.monotonic()
        return done

    monkeypatch.setattr(transfer, "_copy_mapped", spy)
    live = _Big(3, 2)
    tlckpt.load_module_state(live, path)
    ended = time.monotonic()
    assert _holds(live, saved)
    assert results[0] is True and len(results) > 1 and not any(results[1:])
    out, _ = seen["writer"].communicate(timeout=60)
    start, opened = (float(x) for x in out.split())
    assert start < seen["broken"] < opened <= ended + 0.5  # it waited for the load's end


class _Tied(torch.nn.Module):
    def __init__(self, seed: int):
        super().__init__()
        torch.manual_seed(seed)
        self.encode = torch.nn.Linear(WIDTH, WIDTH, bias=False)
        self.decode = torch.nn.Linear(WIDTH, WIDTH, bias=False)
        self.decode.weight = self.encode.weight


@pytest.mark.parametrize("differ", [False, True])
def test_tied_copies_are_compared_in_the_mapping(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, differ: bool
) -> None:
    path = tmp_path / "t.tlsf32"
    saved = _Tied(1)
    tlckpt.save_module_state(saved, path)
    _granted(path)
    if differ:  # one bit of the copy's last value (the file's last 4 bytes)
        with open(path, "r+b") as f:
            f.seek(-1, os.SEEK_END)
            last = f.read(1)[0]
            f.seek(-1, os.SEEK_END)
            f.write(bytes([last ^ 1]))
            f.flush()
            os.fsync(f.fileno())
    verdicts: list[bool | None] = []
    real = mapped.FileMapping.same

    def spy(self: mapped.FileMapping, *args: Any) -> bool | None:
        verdicts.append(real(self, *args))
        return verdicts[-1]

    monkeypatch.setattr(mapped.FileMapping, "same", spy)
    live = _Tied(2)
    before = [t.clone() for t in live.state_dict().values()]
    if differ:
        with pytest.raises(SchemaMismatchError, match="tied"):
            tlckpt.load_module_state(live, path)
        assert all(torch.equal(a, b) for a, b in zip(live.state_dict().values(), before))
    else:
        tlckpt.load_module_state(live, path)
        assert _holds(live, saved)
        assert live.decode.weight is live.encode.weight
    assert verdicts == [not differ]


def test_the_mapping_does_not_grow_the_resident_set(tmp_path: Path) -> None:
    """Copied chunks' pages leave the process's page tables (they stay in the page cache):
    a 64 MiB load grows the resident set by a few chunks at most, not by the file."""
    path = tmp_path / "m.tlsf32"
    tlckpt.save_module_state(_Big(16, 1), path)
    _granted(path)
    live = _Big(16, 2)
    tlckpt.load_module_state(live, path)  # first-call costs out of the way
    probe = PeakProbe()
    if not probe.resettable:
        pytest.skip("the peak resident set cannot be reset here")
    before = current_rss()
    probe.reset()
    tlckpt.load_module_state(live, path)
    assert probe.peak() - before < 24 << 20


def test_pieces_crossing_windows_land_exactly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Windows of an odd size cut through payloads and headers alike: every byte lands."""
    torch.manual_seed(3)
    saved = torch.nn.ParameterList(
        torch.nn.Parameter(torch.randn(n)) for n in (30_011, 1, 65_536, 12_345, 99_999)
    )
    path = tmp_path / "m.tlsf32"
    tlckpt.save_module_state(saved, path)
    _granted(path)
    monkeypatch.setattr(transfer, "MAPPED_WINDOW", 12_289)
    monkeypatch.setattr(transfer, "MAPPED_MIN_PIECE", 1)
    copies = _Copies(monkeypatch)
    live = torch.nn.ParameterList(torch.nn.Parameter(torch.zeros_like(p)) for p in saved)
    tlckpt.load_module_state(live, path)
    assert copies.results and all(copies.results)
    assert all(torch.equal(a.view(torch.int32), b.view(torch.int32)) for a, b in zip(live, saved))
