"""Injected I/O faults during saves: the caller gets the ``OSError``, the old file survives.

Faults are injected where a real failure would surface, with the errno and arguments the real
call would carry: a ``write`` or the final ``flush`` of the temporary (ENOSPC, EIO, EACCES),
its ``fsync``, the ``os.replace`` over the destination, the ``fsync`` of the folder after the
rename, and the creation of the temporary (``os.open`` with ``O_CREAT``, as in a read-only
folder).
A ``KeyboardInterrupt`` midway is checked too. For each, on every writer of the codec and
the runtime:

* the error reaches the caller as that ``OSError`` (same class and errno), not wrapped;
* the destination holds the previous file, byte for byte — except after a failed folder
  ``fsync``, which comes after the rename: the destination is then the complete new file;
* no temporary is left in the folder.

Separately, the error must name the destination path (API: "OSError from the file system,
with the path").

Real failures, not injected: a destination that is a directory, a dangling or live symlink
(the link is replaced, its target untouched, as ``atomic_output`` documents), a read-only
folder (as an unprivileged user: as root, permission bits do not apply, so the check runs in
a child process that drops to ``nobody``), and ENOSPC on a tiny tmpfs (where mounting one is
permitted).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hostile_support import run_python

from tlckpt import codec
from tlckpt.codec import (
    AdamEntry,
    ParameterSchema,
    is_temporary,
    read_float32_state,
    write_adam,
    write_float32_state,
    write_state_bits,
)
from tlckpt.testing.adam import adamw_config

ERRNOS = (errno.ENOSPC, errno.EIO, errno.EACCES)
FAULTS = ("write", "flush", "fsync", "replace", "dir_fsync", "create")

# ------------------------------------------------------------------------------ writers


def _arrays(value: float) -> list[np.ndarray]:
    # Large enough that the payload passes through several raw writes.
    return [np.full(600_000, value, np.float32), np.full((3, 4), value, np.float32)]


def _adam(path: Any, value: float) -> None:
    schema = ParameterSchema([(600_000,), (600_000,)], [True, True], [0, 0])
    config = adamw_config()
    m = np.full(600_000, value, np.float32)
    write_adam(path, schema, config, {0: AdamEntry(3, m, m + 1)})


def _model(value: float) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(400, 400), torch.nn.Linear(400, 3))
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 400)).sum().backward()
    opt.step()
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(value)
    return model, opt


def _save_module(path: Any, value: float) -> None:
    from tlckpt import save_module_state

    save_module_state(_model(value)[0], path)


def _save_optimizer(path: Any, value: float) -> None:
    from tlckpt import save_optimizer

    model, opt = _model(value)
    for s in opt.state.values():
        s["exp_avg"].fill_(value)
    save_optimizer(opt, model, path)


def _save_bits(path: Any, value: float) -> None:
    from tlckpt import save_state_bits

    save_state_bits(_model(value)[0], path, pretty=False)


WRITERS: dict[str, Callable[[Any, float], None]] = {
    "write_float32_state": lambda p, v: write_float32_state(p, _arrays(v)),
    "write_adam": _adam,
    "write_state_bits": lambda p, v: write_state_bits(p, _arrays(v), "float32"),
    "save_module_state": _save_module,
    "save_optimizer": _save_optimizer,
    "save_state_bits": _save_bits,
}

# ------------------------------------------------------------------------------ injection


def _oserror(code: int, filename: str | None = None, filename2: str | None = None) -> OSError:
    # What the real call raises: the OSError subclass for the errno, with the filenames the
    # real call attaches (none for write/flush/fsync, which work on descriptors).
    return OSError(code, os.strerror(code), filename, None, filename2)


class _FaultyFile:
    """A binary file whose ``write`` (the ``nth`` call) or ``flush`` raises ``error``."""

    def __init__(self, inner: Any, error: BaseException, where: str, nth: int):
        self._inner = inner
        self._error = error
        self._where = where
        self._nth = nth
        self._writes = 0

    def write(self, data: Any) -> int:
        self._writes += 1
        if self._where == "write" and self._writes == self._nth:
            raise self._error
        return self._inner.write(data)

    def flush(self) -> None:
        if self._where == "flush":
            raise self._error
        self._inner.flush()

    def __enter__(self) -> _FaultyFile:
        return self

    def __exit__(self, *exc: Any) -> None:
        with contextlib.suppress(OSError):  # a close after a failed flush fails again
            self._inner.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _is_dir(fd: int) -> bool:
    return stat.S_ISDIR(os.fstat(fd).st_mode)


@contextlib.contextmanager
def inject(
    monkeypatch: pytest.MonkeyPatch, fault: str, error: BaseException, nth: int = 2
) -> Iterator[None]:
    """Make ``fault`` fail with ``error`` while the block runs."""
    with monkeypatch.context() as m:
        if fault in ("write", "flush"):
            real_fdopen = os.fdopen

            def fdopen(fd: int, *a: Any, **k: Any) -> Any:
                f = real_fdopen(fd, *a, **k)
                return _FaultyFile(f, error, fault, nth) if "w" in (a[0] if a else "") else f

            m.setattr(os, "fdopen", fdopen)
        elif fault in ("fsync", "dir_fsync"):
            real_fsync = os.fsync

            def fsync(fd: int) -> None:
                if _is_dir(fd) == (fault == "dir_fsync"):
                    raise error
                real_fsync(fd)

            m.setattr(os, "fsync", fsync)
        elif fault == "replace":

            def replace(src: Any, dst: Any, **k: Any) -> None:
                raise _oserror(error.errno, os.fspath(src), os.fspath(dst))  # type: ignore[attr-defined]

            m.setattr(os, "replace", replace)
        elif fault == "create":
            real_open = os.open

            def create(path: Any, flags: int, *a: Any, **k: Any) -> int:
                if flags & os.O_CREAT:
                    raise _oserror(error.errno, os.fspath(path))  # type: ignore[attr-defined]
                return real_open(path, flags, *a, **k)

            m.setattr(os, "open", create)
        yield


def _expected_error(fault: str, code: int) -> BaseException:
    return _oserror(code)


def _prepared(tmp_path: Path, writer: str) -> tuple[Path, bytes, bytes]:
    """Destination holding the old file; returns (path, old bytes, new bytes)."""
    folder = tmp_path / "dest"
    folder.mkdir()
    dest = folder / "ckpt.bin"
    write = WRITERS[writer]
    write(tmp_path / "new.bin", 2.0)
    write(dest, 1.0)
    return dest, dest.read_bytes(), (tmp_path / "new.bin").read_bytes()


def _leftovers(dest: Path) -> list[str]:
    return sorted(set(os.listdir(dest.parent)) - {dest.name})


# ------------------------------------------------------------------------------ the checks


CASES = [
    (w, f, e)
    for w in WRITERS
    for f in FAULTS
    for e in ERRNOS
    if w in ("write_float32_state", "write_adam", "write_state_bits") or e == errno.ENOSPC
]


@pytest.mark.parametrize(
    ("writer", "fault", "code"), CASES, ids=[f"{w}-{f}-{errno.errorcode[e]}" for w, f, e in CASES]
)
def test_fault_reaches_caller_and_old_file_survives(
    writer: str, fault: str, code: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dest, old, new = _prepared(tmp_path, writer)
    with inject(monkeypatch, fault, _expected_error(fault, code)), pytest.raises(OSError) as info:
        WRITERS[writer](dest, 2.0)
    assert type(info.value) is type(_oserror(code)), repr(info.value)
    assert info.value.errno == code
    assert not isinstance(info.value, codec.CheckpointError)
    assert _leftovers(dest) == []
    if fault == "dir_fsync":  # after the rename: the complete new file, never a mix
        assert dest.read_bytes() == new
    else:
        assert dest.read_bytes() == old


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_keyboard_interrupt_midway_leaves_old_file(
    writer: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dest, old, _ = _prepared(tmp_path, writer)
    with inject(monkeypatch, "write", KeyboardInterrupt(), nth=3), pytest.raises(KeyboardInterrupt):
        WRITERS[writer](dest, 2.0)
    assert dest.read_bytes() == old
    assert _leftovers(dest) == []


def _names_destination(exc: OSError, dest: Path) -> bool:
    wanted = os.fspath(dest)
    return wanted in (exc.filename, exc.filename2) or wanted in str(exc)


@pytest.mark.parametrize("fault", FAULTS)
def test_fault_error_names_the_destination(
    fault: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dest, _, _ = _prepared(tmp_path, "write_float32_state")
    with inject(monkeypatch, fault, _oserror(errno.EIO)), pytest.raises(OSError) as info:
        write_float32_state(dest, _arrays(3.0))
    assert _names_destination(info.value, dest), repr(info.value)


# ------------------------------------------------------------------------------ real failures


def test_destination_is_a_directory(tmp_path: Path) -> None:
    dest = tmp_path / "ckpt"
    dest.mkdir()
    (dest / "inside").write_bytes(b"kept")
    with pytest.raises(OSError) as info:
        write_float32_state(dest, _arrays(1.0))
    assert _names_destination(info.value, dest), repr(info.value)
    assert (dest / "inside").read_bytes() == b"kept"
    assert os.listdir(tmp_path) == ["ckpt"]


def test_missing_folder_is_an_oserror_naming_it(tmp_path: Path) -> None:
    dest = tmp_path / "missing" / "ckpt.tlsf32"
    with pytest.raises(FileNotFoundError) as info:
        write_float32_state(dest, _arrays(1.0))
    assert os.fspath(dest.parent) in str(info.value)
    assert os.listdir(tmp_path) == []


def test_symlink_destination_replaces_the_link_not_its_target(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere" / "real.tlsf32"
    target.parent.mkdir()
    write_float32_state(target, _arrays(1.0))
    old = target.read_bytes()
    folder = tmp_path / "dest"
    folder.mkdir()
    link = folder / "ckpt.tlsf32"
    link.symlink_to(target)
    write_float32_state(link, _arrays(2.0))
    assert not link.is_symlink()  # the link itself became the new, complete file
    assert read_float32_state(link, [(600_000,), (3, 4)])[1][0, 0] == 2.0
    assert target.read_bytes() == old  # its former target is untouched
    assert os.listdir(folder) == ["ckpt.tlsf32"]
    assert os.listdir(target.parent) == ["real.tlsf32"]


def test_dangling_symlink_destination(tmp_path: Path) -> None:
    link = tmp_path / "ckpt.tlsf32"
    link.symlink_to(tmp_path / "nowhere" / "gone.tlsf32")
    write_float32_state(link, _arrays(2.0))
    assert not link.is_symlink()
    assert read_float32_state(link, [(600_000,), (3, 4)])[0][0] == 2.0
    assert os.listdir(tmp_path) == ["ckpt.tlsf32"]


_UNPRIVILEGED = r"""
import errno, os, sys
import numpy as np
from tlckpt.codec import write_float32_state
folder, uid, gid = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
if os.geteuid() == 0:
    os.setgid(gid)
    os.setuid(uid)
dest = os.path.join(folder, "ckpt.tlsf32")
old = open(dest, "rb").read()
try:
    write_float32_state(dest, [np.ones(1000, np.float32)])
except OSError as exc:
    print("ERRNO", errno.errorcode.get(exc.errno), "NAMES", dest in str(exc) or
          dest in (exc.filename, exc.filename2), "MSG", exc)
else:
    print("NO ERROR")
print("INTACT", open(dest, "rb").read() == old, "LEFT", sorted(os.listdir(folder)))
"""


def _unprivileged_ids() -> tuple[int, int] | None:
    if os.geteuid() != 0:
        return os.geteuid(), os.getegid()
    try:
        import pwd

        entry = pwd.getpwnam("nobody")
    except (ImportError, KeyError):
        return None
    return entry.pw_uid, entry.pw_gid


def _read_only_folder_run() -> str:
    ids = _unprivileged_ids()
    if ids is None:
        pytest.skip("no unprivileged user to drop to")
    base = Path(tempfile.mkdtemp(prefix="tlckpt-ro-"))
    try:
        base.chmod(0o755)
        folder = base / "ro"
        folder.mkdir()
        write_float32_state(folder / "ckpt.tlsf32", [np.zeros(10, np.float32)])
        (folder / "ckpt.tlsf32").chmod(0o644)
        folder.chmod(0o555)
        proc = run_python(["-c", _UNPRIVILEGED, str(folder), str(ids[0]), str(ids[1])], 120)
        if proc.returncode and "Permission denied" in proc.stderr and "import" in proc.stderr:
            pytest.skip(f"the unprivileged user cannot import the library: {proc.stderr[-300:]}")
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc.stdout
    finally:
        (base / "ro").chmod(0o755)
        for p in sorted(base.rglob("*"), reverse=True):
            p.unlink() if p.is_file() else p.rmdir()
        base.rmdir()


@pytest.fixture(scope="module")
def read_only_run() -> str:
    return _read_only_folder_run()


def test_read_only_folder_real_eacces(read_only_run: str) -> None:
    """Real permission check (the child drops to ``nobody``: as root, bits do not apply)."""
    assert "ERRNO EACCES" in read_only_run, read_only_run
    assert "INTACT True LEFT ['ckpt.tlsf32']" in read_only_run, read_only_run


def test_read_only_folder_error_names_the_destination(read_only_run: str) -> None:
    assert "NAMES True" in read_only_run, read_only_run


@pytest.fixture
def tiny_tmpfs() -> Iterator[Path]:
    """A 256 KiB tmpfs, where this process may mount one (root with CAP_SYS_ADMIN)."""
    if os.geteuid() != 0 or not sys.platform.startswith("linux"):
        pytest.skip("mounting a tmpfs needs root on Linux")
    mount = Path(tempfile.mkdtemp(prefix="tlckpt-full-"))
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode:
        mount.rmdir()
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=False)
        mount.rmdir()


def test_real_enospc_keeps_old_file_and_leaves_no_temporary(tiny_tmpfs: Path) -> None:
    dest = tiny_tmpfs / "ckpt.tlsf32"
    write_float32_state(dest, [np.zeros(1000, np.float32)])
    old = dest.read_bytes()
    with pytest.raises(OSError) as info:
        write_float32_state(dest, [np.ones(200_000, np.float32)])  # 800 KB > 256 KiB
    assert info.value.errno == errno.ENOSPC
    assert dest.read_bytes() == old
    assert os.listdir(tiny_tmpfs) == ["ckpt.tlsf32"]
    # The space came back: a save that fits succeeds afterwards.
    write_float32_state(dest, [np.ones(1000, np.float32)])
    assert not any(is_temporary(n) for n in os.listdir(tiny_tmpfs))


def test_real_enospc_error_names_the_destination(tiny_tmpfs: Path) -> None:
    dest = tiny_tmpfs / "ckpt.tlsf32"
    with pytest.raises(OSError) as info:
        write_float32_state(dest, [np.ones(200_000, np.float32)])
    assert _names_destination(info.value, dest), repr(info.value)
