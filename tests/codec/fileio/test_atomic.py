"""Atomic writes: a failed write leaves the previous file byte-identical and no temporary.

Failures are provoked at every stage: the caller's iterator raising midway, a payload of the
wrong dtype in the middle, ``KeyboardInterrupt`` from a generator, ``fsync`` / ``replace`` /
``fchmod`` failing. Successful writes leave only the destination, with the permissions a
plain ``open()`` gives.
"""

from __future__ import annotations

import io
import os
import sys
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tlckpt.codec import (
    AdamConfig,
    AdamEntry,
    AdamKind,
    CheckpointError,
    EntryError,
    ParameterSchema,
    atomic_output,
    is_temporary,
    read_adam,
    read_float32_state,
    write_adam,
    write_float32_state,
)

OLD = b"the previous checkpoint, which must survive"

SCHEMA = ParameterSchema([(3,), (2, 2), (), (5,)], [True, True, False, True])
CONFIG = AdamConfig(AdamKind.ADAM, 0.9, 0.999, 1e-8, 0.0)


def _entries() -> dict[int, AdamEntry]:
    return {
        slot: AdamEntry(
            4,
            np.arange(SCHEMA.element_count(slot), dtype="<f4"),
            np.ones(SCHEMA.element_count(slot), "<f4"),
        )
        for slot in SCHEMA.representative_slots
    }


def _arrays() -> list[np.ndarray]:
    return [np.full((2, 3), 1.5, "<f4"), np.zeros(4, "<f4"), np.array(2.0, "<f4")]


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else set()


def _assert_untouched(folder: Path, path: Path, old: bytes | None) -> None:
    names = sorted(p.name for p in folder.iterdir())
    assert not [n for n in names if is_temporary(n)], f"temporary left behind: {names}"
    if old is None:
        assert names == [], names
    else:
        assert names == [path.name], names
        assert path.read_bytes() == old


@pytest.fixture(params=["previous", "none"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Path, Path, bytes | None]:
    """(folder, destination, previous bytes or None): with and without a previous file."""
    folder = tmp_path / "ckpts"
    folder.mkdir()
    path = folder / "state.bin"
    if request.param == "previous":
        path.write_bytes(OLD)
        return folder, path, OLD
    return folder, path, None


# --------------------------------------------------------------------- failures midway


def _raising_after(n: int, exc: BaseException) -> Iterator[np.ndarray]:
    arrays = _arrays()
    yield from arrays[:n]
    raise exc


@pytest.mark.parametrize("n", [0, 1, 2])
def test_iterator_raising_midway(target: Any, n: int) -> None:
    folder, path, old = target
    with pytest.raises(RuntimeError, match="disk on fire"):
        write_float32_state(path, _raising_after(n, RuntimeError("disk on fire")), count=3)
    _assert_untouched(folder, path, old)


def test_keyboard_interrupt_from_a_generator(target: Any) -> None:
    folder, path, old = target
    with pytest.raises(KeyboardInterrupt):
        write_float32_state(path, _raising_after(1, KeyboardInterrupt()), count=3)
    _assert_untouched(folder, path, old)


def test_wrong_dtype_in_the_middle_of_a_stream(target: Any) -> None:
    folder, path, old = target
    arrays = _arrays()
    arrays[1] = arrays[1].astype("<f8")
    with pytest.raises(CheckpointError):
        write_float32_state(path, iter(arrays), count=3)
    _assert_untouched(folder, path, old)


def test_too_few_and_too_many_arrays(target: Any) -> None:
    folder, path, old = target
    with pytest.raises(CheckpointError):
        write_float32_state(path, iter(_arrays()), count=4)
    _assert_untouched(folder, path, old)
    with pytest.raises(CheckpointError):
        write_float32_state(path, iter(_arrays()), count=2)
    _assert_untouched(folder, path, old)


def test_lazy_adam_entries_failing_midway(target: Any) -> None:
    """A mapping that is not a dict is read one entry at a time while writing."""
    folder, path, old = target
    entries = _entries()
    bad = dict(entries)
    bad[1] = AdamEntry(4, entries[1].m.astype("<f8"), entries[1].v)
    with pytest.raises(EntryError):
        write_adam(path, SCHEMA, CONFIG, types.MappingProxyType(bad))
    _assert_untouched(folder, path, old)

    class Exploding(dict):
        def __getitem__(self, key: int) -> AdamEntry:
            if key == 3:
                raise KeyboardInterrupt
            return super().__getitem__(key)

    lazy = types.MappingProxyType(Exploding(entries))
    with pytest.raises(KeyboardInterrupt):
        write_adam(path, SCHEMA, CONFIG, lazy)
    _assert_untouched(folder, path, old)


# ---------------------------------------------------------------- file-system failures


def _failing(name: str) -> Callable[..., Any]:
    def fail(*args: Any, **kwargs: Any) -> Any:
        raise OSError(28, f"{name} failed (injected)")

    return fail


@pytest.mark.parametrize("call", ["fsync", "replace"])
@pytest.mark.parametrize("writer", ["adam", "float32_state"])
def test_os_failures(target: Any, monkeypatch: pytest.MonkeyPatch, call: str, writer: str) -> None:
    folder, path, old = target
    monkeypatch.setattr(os, call, _failing(call))
    with pytest.raises(OSError, match="injected"):
        if writer == "adam":
            write_adam(path, SCHEMA, CONFIG, _entries())
        else:
            write_float32_state(path, _arrays())
    monkeypatch.undo()
    _assert_untouched(folder, path, old)


def test_fchmod_failure_leaks_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Overwriting keeps the old file's mode with fchmod (a new file needs none)."""
    folder, path, old = tmp_path, tmp_path / "state.bin", OLD
    path.write_bytes(OLD)
    before = _open_fds()
    monkeypatch.setattr(os, "fchmod", _failing("fchmod"))
    with pytest.raises(OSError, match="injected"):
        write_float32_state(path, _arrays())
    monkeypatch.undo()
    _assert_untouched(folder, path, old)
    assert _open_fds() == before, "the temporary's file descriptor was not closed"


def test_failed_writes_close_their_files(target: Any) -> None:
    folder, path, old = target
    before = _open_fds()
    for _ in range(3):
        with pytest.raises(RuntimeError):
            write_float32_state(path, _raising_after(1, RuntimeError("x")), count=3)
    assert _open_fds() == before
    _assert_untouched(folder, path, old)


def test_temporary_is_a_sibling(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The temporary lives in the destination's folder (a rename never crosses devices)."""
    seen: list[tuple[str, str]] = []
    real = os.replace

    def spy(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
        seen.append((os.fspath(src), os.fspath(dst)))
        assert is_temporary(src)
        assert os.path.exists(src)
        real(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", spy)
    path = tmp_path / "model.tlsf32"
    write_float32_state(path, _arrays())
    assert len(seen) == 1
    src, dst = seen[0]
    assert os.path.dirname(src) == str(tmp_path)
    assert dst == str(path)


# ------------------------------------------------------------------------ successes


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX permissions")
def test_new_files_get_umask_permissions(tmp_path: Path) -> None:
    adam, state = tmp_path / "opt.tladam", tmp_path / "model.tlsf32"
    write_adam(adam, SCHEMA, CONFIG, _entries())
    write_float32_state(state, _arrays())
    want = 0o666 & ~_umask()
    for path in (adam, state):
        assert path.stat().st_mode & 0o777 == want, oct(path.stat().st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.tlsf32", "opt.tladam"]


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX permissions")
def test_overwriting_keeps_the_files_permissions(tmp_path: Path) -> None:
    path = tmp_path / "model.tlsf32"
    path.write_bytes(OLD)
    path.chmod(0o640)
    write_float32_state(path, _arrays())
    assert path.stat().st_mode & 0o777 == 0o640
    assert [a.tobytes() for a in read_float32_state(path, [a.shape for a in _arrays()])] == [
        a.tobytes() for a in _arrays()
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.tlsf32"]


def test_successful_overwrite_replaces_content(tmp_path: Path) -> None:
    path = tmp_path / "opt.tladam"
    path.write_bytes(OLD)
    assert write_adam(path, SCHEMA, CONFIG, _entries()) == 2
    ckpt = read_adam(path, SCHEMA)
    assert sorted(ckpt.entries) == [0, 1, 3]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["opt.tladam"]


def test_writing_through_a_callers_bytesio(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    buffer = io.BytesIO()
    assert write_adam(buffer, SCHEMA, CONFIG, _entries()) == 2
    buffer.seek(0)
    assert sorted(read_adam(buffer, SCHEMA).entries) == [0, 1, 3]
    state = io.BytesIO()
    write_float32_state(state, _arrays())
    state.seek(0)
    assert len(read_float32_state(state, [a.shape for a in _arrays()])) == 3
    assert list(tmp_path.iterdir()) == []  # nothing touched the file system
    assert not buffer.closed and not state.closed


def test_writing_through_a_callers_open_file(tmp_path: Path) -> None:
    path = tmp_path / "opt.tladam"
    with open(path, "wb") as f:
        write_adam(f, SCHEMA, CONFIG, _entries())
        assert not f.closed
    assert sorted(read_adam(path, SCHEMA).entries) == [0, 1, 3]


def test_atomic_output_directly(tmp_path: Path) -> None:
    path = tmp_path / "x.bin"
    path.write_bytes(OLD)
    with pytest.raises(ValueError), atomic_output(path) as f:
        f.write(b"partial")
        raise ValueError("abort")
    _assert_untouched(tmp_path, path, OLD)
    with atomic_output(path, durable=False) as f:
        f.write(b"new")
    assert path.read_bytes() == b"new"
    _assert_untouched(tmp_path, path, b"new")


def test_is_temporary(tmp_path: Path) -> None:
    assert not is_temporary("state.bin")
    assert not is_temporary("/some/dir/opt.tladam")
    assert not is_temporary(".hidden")
    with pytest.raises(RuntimeError), atomic_output(tmp_path / "x.bin"):
        names = [p.name for p in tmp_path.iterdir()]
        assert len(names) == 1 and is_temporary(names[0]), names
        assert is_temporary(tmp_path / names[0])
        raise RuntimeError
    assert list(tmp_path.iterdir()) == []


def test_destination_is_a_directory(tmp_path: Path) -> None:
    target = tmp_path / "taken"
    target.mkdir()
    (target / "keep").write_bytes(OLD)
    with pytest.raises(OSError):
        write_float32_state(target, _arrays())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]
    assert (target / "keep").read_bytes() == OLD
