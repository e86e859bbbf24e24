"""The default load under a read lease, and its fallback to staging.

Where the kernel grants a read lease (``codec/fileio/leases.py``), the default
``load_module_state`` validates the file and copies its payloads straight into the live
tensors: no writer can open the file until the load ends. Where none is granted (another
handle open for writing, a process that does not own the file, a file system without
leases, a lease-break time too short), it stages. Real processes and the real kernel
throughout; only the "file system without leases" case is simulated (by making
``F_SETLEASE`` fail as NFS does).
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

import tlckpt
from tlckpt.codec import PartialLoadError
from tlckpt.codec.fileio import leases, transfer
from tlckpt.runtime.ops import float32_bulk

REPO = Path(__file__).resolve().parents[2]


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(256, 256), torch.nn.BatchNorm1d(256), torch.nn.Linear(256, 64)
    )


def _values(model: torch.nn.Module) -> list[torch.Tensor]:
    return [t.clone() for t in model.state_dict().values()]


def _holds(model: torch.nn.Module, values: list[torch.Tensor]) -> bool:
    return all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), values))


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Any]:
    """A live model at OLD values; ``A`` (the file at the path) and ``B`` (same size)."""
    a, b, live = _model(1), _model(2), _model(3)
    for t in b.state_dict().values():
        if not t.is_floating_point():
            t.fill_(7)  # BatchNorm's counter: distinct in B
    path = tmp_path / "m.tlsf32"
    tlckpt.save_module_state(a, path)
    tlckpt.save_module_state(b, tmp_path / "b.tlsf32")
    assert path.stat().st_size == (tmp_path / "b.tlsf32").stat().st_size
    return {"path": path, "A": _values(a), "B": _values(b), "live": live, "old": _values(live)}


class _Paths:
    """Which path a load took: in place (under a lease) or staged."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self.taken: list[str] = []
        real_stage, real_in_place = float32_bulk.stage, float32_bulk.plan_in_place

        def stage(*args: Any) -> Any:
            self.taken.append("staged")
            return real_stage(*args)

        def in_place(*args: Any, lease: Any = None) -> Any:
            self.taken.append("leased" if lease is not None else "in place")
            return real_in_place(*args, lease=lease)

        monkeypatch.setattr(float32_bulk, "stage", stage)
        monkeypatch.setattr(float32_bulk, "plan_in_place", in_place)


def test_the_default_load_copies_in_place_under_a_lease(
    files: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = _Paths(monkeypatch)
    tlckpt.load_module_state(files["live"], files["path"])
    assert paths.taken == ["leased"]
    assert _holds(files["live"], files["A"])
    # Released: a writer opens at once (non-blocking, so a held lease would refuse it).
    os.close(os.open(files["path"], os.O_RDWR | os.O_NONBLOCK))


def test_a_writer_holding_the_file_open_makes_it_stage(
    files: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = _Paths(monkeypatch)
    # A child keeps a handle open for writing while this process loads.
    code = (
        f"import sys\nf = open({str(files['path'])!r}, 'r+b')\n"
        "print('OPEN', flush=True)\nsys.stdin.read()\n"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "OPEN"
        tlckpt.load_module_state(files["live"], files["path"])
    finally:
        holder.communicate("")
    assert paths.taken == ["staged"]
    assert _holds(files["live"], files["A"])


_WRITER = """
import sys, time
path, image = sys.argv[1], open(sys.argv[2], "rb").read()
start = time.monotonic()
with open(path, "r+b") as f:  # waits while the loader holds its lease
    opened = time.monotonic()
    f.write(image)
print(f"{start} {opened}", flush=True)
"""


def _break_the_lease_mid_copy(
    monkeypatch: pytest.MonkeyPatch, files: dict[str, Any], tmp_path: Path
) -> dict[str, Any]:
    """A writer process opens the file for writing after the first payloads were copied; the
    copy goes on once the kernel has started breaking the lease (the writer waits)."""
    real = float32_bulk.read_float32_extents
    seen: dict[str, Any] = {}

    def hooked(
        f: Any,
        layout: Any,
        records: Any,
        addresses: Any,
        owners: Any,
        progress: Any = None,
        mapping: Any = None,
    ) -> None:

        def on_progress(through: int) -> None:
            if progress is not None:
                progress(through)
            if "writer" in seen:
                return
            seen["writer"] = subprocess.Popen(
                [sys.executable, "-c", _WRITER, str(files["path"]), str(tmp_path / "b.tlsf32")],
                stdout=subprocess.PIPE,
                text=True,
            )
            deadline = time.monotonic() + 20
            while fcntl.fcntl(f.fileno(), fcntl.F_GETLEASE) == fcntl.F_RDLCK:
                if time.monotonic() > deadline:
                    raise AssertionError("the writer never broke the lease")
                time.sleep(0.005)
            seen["broken"] = time.monotonic()

        real(f, layout, records, addresses, owners, on_progress, mapping=mapping)

    monkeypatch.setattr(float32_bulk, "read_float32_extents", hooked)
    monkeypatch.setattr(transfer, "IOV_MAX", 2)  # a read per payload
    return seen


def _writer_times(seen: dict[str, Any]) -> tuple[float, float]:
    out, _ = seen["writer"].communicate(timeout=60)
    start, opened = (float(x) for x in out.split())
    return start, opened


@pytest.mark.parametrize("thread", ["main", "worker"])
def test_a_writer_arriving_mid_load_waits_for_its_end(
    files: dict[str, Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Path, thread: str
) -> None:
    """The lease break signals nobody (no handler needed, in any thread), the writer waits,
    and the model holds the whole of the file as it was when the load began."""
    paths = _Paths(monkeypatch)
    seen = _break_the_lease_mid_copy(monkeypatch, files, tmp_path)
    errors: list[BaseException] = []

    def load() -> None:
        try:
            tlckpt.load_module_state(files["live"], files["path"])
        except BaseException as exc:  # handed to the test's thread below
            errors.append(exc)

    if thread == "main":
        load()
    else:
        worker = threading.Thread(target=load)
        worker.start()
        worker.join(60)
    ended = time.monotonic()
    assert errors == []
    assert paths.taken == ["leased"]
    assert _holds(files["live"], files["A"])
    start, opened = _writer_times(seen)
    assert start < seen["broken"] < opened  # it waited ...
    assert opened <= ended + 0.5  # ... until about the load's end, not a lease-break time
    tlckpt.load_module_state(files["live"], files["path"])  # and then wrote B
    assert _holds(files["live"], files["B"])


def test_a_writer_that_outwaits_the_lease_is_reported(
    files: dict[str, Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Past the kernel's lease-break time the writer may have changed the file under the
    copy: the load cannot prove otherwise and says the model is partially updated (the
    kernel's timer is stood in for by a margin larger than the break time)."""
    seen = _break_the_lease_mid_copy(monkeypatch, files, tmp_path)
    monkeypatch.setattr(leases, "BREAK_MARGIN_SECONDS", 3600.0)
    with pytest.raises(PartialLoadError, match="lease"):
        tlckpt.load_module_state(files["live"], files["path"])
    _writer_times(seen)


def test_an_unbroken_lease_survives_the_margin(
    files: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """No writer came: the lease is unbroken, whatever the time taken."""
    monkeypatch.setattr(leases, "BREAK_MARGIN_SECONDS", 3600.0)
    tlckpt.load_module_state(files["live"], files["path"])
    assert _holds(files["live"], files["A"])


def test_a_process_that_does_not_own_the_file_stages(files: dict[str, Any]) -> None:
    """A process that neither owns the file nor has ``CAP_LEASE`` gets no lease (EACCES).

    The child loads once as this user (so that every module is imported), then becomes
    ``nobody`` (dropping its capabilities) and loads the same root-owned file again."""
    if os.geteuid() != 0:
        pytest.skip("needs root to become another user")  # the project's CI runs as root
    shared = Path(tempfile.mkdtemp(prefix="tlckpt-lease-"))  # pytest's folders are 0700
    shared.chmod(0o755)
    target = shared / "m.tlsf32"
    target.write_bytes(files["path"].read_bytes())
    target.chmod(0o644)
    code = (
        "import os, sys, torch, tlckpt\n"
        "from tlckpt.codec.fileio import leases\n"
        "from tlckpt.runtime.ops import float32_bulk\n"
        "torch.manual_seed(1)\n"
        "m = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.BatchNorm1d(256),"
        " torch.nn.Linear(256, 64))\n"
        "want = [t.clone() for t in m.state_dict().values()]\n"
        "tlckpt.load_module_state(m, sys.argv[1])\n"
        "os.setgid(65534)\nos.setuid(65534)\n"
        "taken = []\n"
        "real = float32_bulk.stage\n"
        "float32_bulk.stage = lambda *a: taken.append('staged') or real(*a)\n"
        "[t.zero_() for t in m.state_dict().values()]\n"
        "tlckpt.load_module_state(m, sys.argv[1])\n"
        "same = all(torch.equal(a, b) for a, b in zip(m.state_dict().values(), want))\n"
        "print(leases.lease_possible(sys.argv[1]), taken, same)\n"
    )
    try:
        done = subprocess.run(
            [sys.executable, "-c", code, str(target)],
            env={**os.environ, "PYTHONPATH": str(REPO.parent)},
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        shutil.rmtree(shared)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "['staged']", "True"]


def test_a_file_system_without_leases_stages(
    files: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    real = fcntl.fcntl

    def nfs_like(fd: int, cmd: int, *args: Any) -> Any:
        if cmd == fcntl.F_SETLEASE and args and args[0] == fcntl.F_RDLCK:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(fd, cmd, *args)

    monkeypatch.setattr(leases.fcntl, "fcntl", nfs_like)
    paths = _Paths(monkeypatch)
    tlckpt.load_module_state(files["live"], files["path"])
    assert paths.taken == ["staged"]
    assert _holds(files["live"], files["A"])


def test_a_short_lease_break_time_stages(
    files: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kernel that lets a waiting writer through within a second protects too little."""
    monkeypatch.setattr(leases, "_break_seconds", lambda: 1.0)
    paths = _Paths(monkeypatch)
    tlckpt.load_module_state(files["live"], files["path"])
    assert paths.taken == ["staged"]


def test_file_objects_take_no_lease_and_in_place_loads_one_where_granted(
    files: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A caller's file object is the caller's to configure; ``staged=False`` reads in place,
    under a lease where one is granted, without one (and the guarantee) where not."""
    paths = _Paths(monkeypatch)
    with open(files["path"], "rb") as f:
        tlckpt.load_module_state(files["live"], f)
    tlckpt.load_module_state(files["live"], files["path"], staged=False)
    monkeypatch.setattr(leases, "_break_seconds", lambda: 1.0)  # no lease granted
    tlckpt.load_module_state(files["live"], files["path"], staged=False)
    assert paths.taken == ["staged", "leased", "in place"]
    assert _holds(files["live"], files["A"])
