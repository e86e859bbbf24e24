"""Destinations of every public save function: permissions, long names, stale temporaries.

* A new file gets the mode a plain ``open()`` gives it under the umask in force *when the
  save runs* (set here after the library was imported), an overwritten one keeps its mode.
* Every name ``open()`` accepts can be saved to: 200 to 255 bytes, ASCII and multi-byte UTF-8,
  through each public writer; the temporary's name stays within ``NAME_MAX``, is recognised
  by ``is_temporary``, and stays apart from other destinations' temporaries.
* A temporary left by a killed save (SIGKILL) is removed by the next save to that path and
  by ``clean_temporaries``; one a live save holds (another process) never is — and a
  cleaner acting between a writer's create and lock does not break that writer's save.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hostile_support import child_env

import tlckpt
from tlckpt.cli.main import main as cli_main
from tlckpt.codec import (
    AdamEntry,
    ParameterSchema,
    atomic_output,
    clean_temporaries,
    is_temporary,
    write_adam,
    write_float32_state,
    write_state_bits,
)
from tlckpt.codec.fileio import atomic
from tlckpt.testing.adam import adamw_config

# ------------------------------------------------------------------------------ writers


def _model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    return model, opt


def _convert(path: Path) -> None:
    source = path.parent / "source-of-convert.tlsf32"
    write_float32_state(source, [np.ones((2, 2), np.float32)])
    # The CLI picks the format by extension; --to says it for any name.
    code = cli_main(["convert", str(source), str(path), "--to", "json", "--compact"])
    source.unlink()
    if code:
        raise AssertionError(f"convert exited {code}")


def _atomic(path: Path) -> None:
    with atomic_output(path) as f:
        f.write(b"bytes")


SCHEMA = ParameterSchema([(2,)], [True])
CONFIG = adamw_config()

WRITERS: dict[str, Callable[[Path], None]] = {
    "write_float32_state": lambda p: write_float32_state(p, [np.ones(3, np.float32)]),
    "write_adam": lambda p: write_adam(
        p, SCHEMA, CONFIG, {0: AdamEntry(1, np.ones(2, "<f4"), np.ones(2, "<f4"))}
    ),
    "write_state_bits": lambda p: write_state_bits(p, [np.ones(3, np.float32)], "float32"),
    "save_module_state": lambda p: tlckpt.save_module_state(_model()[0], p),
    "save_optimizer": lambda p: tlckpt.save_optimizer(*reversed(_model()), p),
    "save_state_bits": lambda p: tlckpt.save_state_bits(_model()[0], p),
    "atomic_output": _atomic,
    "cli convert": _convert,
}


def _only(folder: Path, *names: str) -> None:
    found = sorted(os.listdir(folder))
    assert found == sorted(names), found


# ------------------------------------------------------------------------------ the umask


@contextlib.contextmanager
def _umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


@pytest.mark.parametrize("mask", [0o077, 0o002, 0o022])
@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_new_files_follow_the_umask_in_force(writer: str, mask: int, tmp_path: Path) -> None:
    dest = tmp_path / "ckpt"
    with _umask(mask):
        WRITERS[writer](dest)
    assert dest.stat().st_mode & 0o777 == 0o666 & ~mask, oct(dest.stat().st_mode)
    _only(tmp_path, "ckpt")


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_saving_never_touches_the_umask(
    writer: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reading the umask means setting it, which another thread would see: never done."""

    def umask(mask: int) -> int:
        raise AssertionError("os.umask called during a save")

    WRITERS[writer](tmp_path / "warm-up")  # lazy imports (torch, safetensors) happen here
    monkeypatch.setattr(os, "umask", umask)
    WRITERS[writer](tmp_path / "ckpt")
    WRITERS[writer](tmp_path / "ckpt")  # overwriting too


@pytest.mark.parametrize("writer", ["write_float32_state", "save_optimizer", "cli convert"])
def test_overwriting_keeps_the_mode_whatever_the_umask(writer: str, tmp_path: Path) -> None:
    dest = tmp_path / "ckpt"
    dest.write_bytes(b"old")
    dest.chmod(0o640)
    with _umask(0o077):
        WRITERS[writer](dest)
    assert dest.stat().st_mode & 0o777 == 0o640


# ------------------------------------------------------------------------------ long names


def _name_max(folder: Path) -> int:
    return os.pathconf(folder, "PC_NAME_MAX")


def _names(limit: int) -> dict[str, str]:
    """Names of 200 bytes up to ``limit`` bytes, one to four bytes per character."""
    return {
        "ascii-200": "a" * 196 + ".bin",
        "ascii-234": "b" * 230 + ".bin",
        "ascii-235": "c" * 231 + ".bin",
        "ascii-max": "d" * (limit - 4) + ".bin",
        "2-byte-max": "é" * ((limit - 1) // 2) + "x" * ((limit - 1) % 2 + 1),
        "3-byte-max": "€" * (limit // 3) + "y" * (limit % 3),
        "4-byte-max": "😀" * (limit // 4) + "z" * (limit % 4),
        "mixed-254": ("aé€😀" * 30)[: 254 // 10 * 4] + "q" * (254 - 254 // 10 * 10),
    }


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_every_name_open_accepts_can_be_saved_to(writer: str, tmp_path: Path) -> None:
    limit = _name_max(tmp_path)
    for label, name in _names(limit).items():
        size = len(os.fsencode(name))
        assert 200 <= size <= limit, (label, size)
        folder = tmp_path / label
        folder.mkdir()
        dest = folder / name
        with open(dest, "wb"):  # open() takes it ...
            pass
        dest.unlink()
        WRITERS[writer](dest)  # ... so a save must too
        assert dest.stat().st_size > 0
        _only(folder, name)


def test_temporaries_of_long_names_fit_and_stay_apart(tmp_path: Path) -> None:
    limit = _name_max(tmp_path)
    for name in _names(limit).values():
        prefix = atomic.temporary_prefix(tmp_path / name)
        temp = f"{prefix}abcdefgh.tmp"
        assert len(os.fsencode(temp)) <= limit, (name, temp)
        assert is_temporary(temp)
        temp.encode("utf-8")  # cut on a character boundary: still valid text
    # Two long names that share their first 240 bytes get different temporaries.
    a, b = "s" * 240 + "-one.bin", "s" * 240 + "-two.bin"
    assert atomic.temporary_prefix(tmp_path / a) != atomic.temporary_prefix(tmp_path / b)
    # ... and cleaning one leaves the other's stale temporary alone.
    stale_b = tmp_path / f"{atomic.temporary_prefix(tmp_path / b)}zzzzzzzz.tmp"
    stale_b.write_bytes(b"left by a killed save")
    assert clean_temporaries(tmp_path / a) == []
    assert clean_temporaries(tmp_path / b) == [stale_b]


def test_a_name_longer_than_open_accepts_is_an_oserror_naming_it(tmp_path: Path) -> None:
    dest = tmp_path / ("n" * (_name_max(tmp_path) + 1))
    with pytest.raises(OSError) as info:
        write_float32_state(dest, [np.ones(3, np.float32)])
    assert info.value.errno == errno.ENAMETOOLONG
    assert info.value.filename == os.fspath(dest)
    _only(tmp_path)


# ------------------------------------------------------------------------------ stale temporaries

_HOLDER = """
import sys, time
from tlckpt.codec import atomic_output
with atomic_output(sys.argv[1]) as f:
    f.write(b"half a checkpoint")
    f.flush()
    print("writing", flush=True)
    time.sleep(120)
"""


@contextlib.contextmanager
def _live_save(dest: Path) -> Iterator[subprocess.Popen]:
    """Another process in the middle of a save to ``dest`` (holding its temporary)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(dest)],
        stdout=subprocess.PIPE,
        text=True,
        env=child_env(),
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "writing"
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=30)
        if proc.stdout is not None:
            proc.stdout.close()


def _temporaries(folder: Path) -> list[str]:
    return sorted(n for n in os.listdir(folder) if is_temporary(n))


@pytest.mark.parametrize(
    "remover", ["next save", "clean_temporaries(path)", "clean_temporaries(folder)"]
)
def test_killed_saves_temporary_is_removed_a_live_one_never(remover: str, tmp_path: Path) -> None:
    dest = tmp_path / "model.tlsf32"
    write_float32_state(dest, [np.zeros(2, np.float32)])
    with _live_save(dest) as proc:
        (temp,) = _temporaries(tmp_path)
        # Alive: nothing removes it, not even a successful save to the same path.
        assert clean_temporaries(dest) == []
        assert clean_temporaries(tmp_path) == []
        write_float32_state(dest, [np.ones(2, np.float32)])
        assert _temporaries(tmp_path) == [temp]
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    assert _temporaries(tmp_path) == [temp]  # killed: left behind, now stale
    if remover == "next save":
        write_float32_state(dest, [np.full(2, 2.0, np.float32)])
    elif remover == "clean_temporaries(path)":
        assert clean_temporaries(dest) == [tmp_path / temp]
    else:
        assert clean_temporaries(tmp_path) == [tmp_path / temp]
    _only(tmp_path, "model.tlsf32")


def test_what_cleaning_leaves_alone(tmp_path: Path) -> None:
    dest = tmp_path / "a.tlsf32"
    prefix = atomic.temporary_prefix(dest)
    other = tmp_path / f"{atomic.temporary_prefix(tmp_path / 'b.tlsf32')}12345678.tmp"
    other.write_bytes(b"stale, of another destination")
    older = tmp_path / f"{prefix}k3_9zq0x.tmp"  # as tempfile.mkstemp named them (no lock)
    older.write_bytes(b"stale, of an earlier version")
    (tmp_path / f"{prefix}dirdirdi.tmp").mkdir()  # not a plain file
    (tmp_path / f"{prefix}linklink.tmp").symlink_to(dest)
    (tmp_path / f"{prefix}toolong12.tmp").write_bytes(b"not our pattern")
    (tmp_path / "a.tlsf32.tmp").write_bytes(b"not hidden")
    write_float32_state(dest, [np.zeros(1, np.float32)])  # the save removes its own: older
    assert not older.exists()
    assert other.exists()
    assert sorted(clean_temporaries(tmp_path)) == [other]
    assert sorted(os.listdir(tmp_path)) == sorted(
        [
            "a.tlsf32",
            "a.tlsf32.tmp",
            f"{prefix}dirdirdi.tmp",
            f"{prefix}linklink.tmp",
            f"{prefix}toolong12.tmp",
        ]
    )


def test_a_cleaner_between_create_and_lock_costs_a_retry_not_the_save(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cleaner that locks a just-created temporary before its writer does, and removes it
    as stale: the writer notices once it holds the lock and starts over with a new name."""
    created: list[str] = []
    real_open, real_flock = os.open, atomic.fcntl.flock

    def recording_open(path: Any, flags: int, *a: Any, **k: Any) -> int:
        if flags & os.O_CREAT:
            created.append(os.fspath(path))
        return real_open(path, flags, *a, **k)

    def racing_flock(fd: int, op: int) -> None:
        if op == atomic.fcntl.LOCK_EX and len(created) == 1:
            assert clean_temporaries(tmp_path) == [Path(created[0])]  # the race, staged
        real_flock(fd, op)

    monkeypatch.setattr(os, "open", recording_open)
    monkeypatch.setattr(atomic.fcntl, "flock", racing_flock)
    dest = tmp_path / "model.tlsf32"
    write_float32_state(dest, [np.ones(4, np.float32)])
    monkeypatch.undo()
    assert len(created) == 2 and created[0] != created[1]
    assert tlckpt.scan_float32_state(dest) == [(4,)]
    _only(tmp_path, "model.tlsf32")


def test_cleaning_a_large_folder(tmp_path: Path) -> None:
    """Only temporaries go; thousands of other files are merely listed."""
    for i in range(2000):
        (tmp_path / f"f{i}.tlsf32").touch()
    stale = [tmp_path / f"{atomic.temporary_prefix(tmp_path / 'x')}{i:08d}.tmp" for i in range(3)]
    for p in stale:
        p.touch()
    assert sorted(clean_temporaries(tmp_path)) == sorted(stale)
    assert len(os.listdir(tmp_path)) == 2000
