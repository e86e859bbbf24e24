"""Atomic, durable writes: a file at ``path`` is either the old one or the complete new one.

Protocol: create a unique temporary sibling (in the destination's folder, so the final rename
never crosses file systems) and hold an exclusive ``flock`` on it, write, flush, ``fsync``,
``os.replace`` over the destination, then ``fsync`` the folder so the rename itself survives
a power cut. On any failure — ``KeyboardInterrupt`` and a caller's generator raising midway
included — the temporary is removed and the error re-raised; the old file is never opened
for writing.

* **Permissions.** The temporary is created with mode ``0o666`` through ``os.open``, so the
  kernel applies the process's umask *at that moment*, exactly as a plain ``open()`` would
  (the umask is never read, so no other thread sees it changed). Overwriting keeps the
  destination's own mode.
* **Names.** Temporaries are ``.<name>.tlckpt-<8 random>.tmp``. Where that would exceed the
  folder's ``NAME_MAX`` (a destination name of 235 bytes or more), ``<name>`` is the
  destination name cut on a character boundary plus ``~`` and 12 hex digits of its SHA-256,
  so every name that ``open()`` accepts can be saved to, and temporaries of different
  destinations stay apart.
* **Stale temporaries.** A save that is killed (``kill -9``, power cut) leaves its temporary
  behind. The lock marks a live one: the kernel drops it when the writer's process ends, so
  a temporary whose lock can be taken belongs to no running save. :func:`clean_temporaries`
  removes those (never one a live writer holds), and every successful save removes its own
  destination's.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import errno
import fcntl
import functools
import hashlib
import os
import platform
import re
import shutil
import stat
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from .retired import Retired, retire
from .source import PathOrFile

__all__ = [
    "TEMP_PREFIX",
    "TEMP_SUFFIX",
    "Temporary",
    "atomic_output",
    "clean_temporaries",
    "commit_temporary",
    "create_temporary",
    "discard_temporary",
    "exchange",
    "fsync_folder",
    "is_temporary",
    "is_library_temporary",
    "output",
    "temporary_name",
    "temporary_prefix",
]

#: Temporaries are named ``.<name>.tlckpt-<random>.tmp``: hidden, recognisable, and never
#: mistaken for a checkpoint (no reader looks at such a name; ``is_temporary`` says so).
TEMP_PREFIX = "."
TEMP_SUFFIX = ".tmp"
_MARK = ".tlckpt-"
# The random part: 8 characters, as tempfile.mkstemp (which earlier versions used) makes them,
# so leftovers of those versions are recognised and cleaned too.
_RANDOM_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789_"
_RANDOM_LEN = 8
# What a cleaner removes: exactly our names, not everything is_temporary recognises.
_TAIL = re.compile(rf"[{_RANDOM_CHARS}]{{{_RANDOM_LEN}}}{re.escape(TEMP_SUFFIX)}")
_OURS = re.compile(rf"{re.escape(TEMP_PREFIX)}.*{re.escape(_MARK)}{_TAIL.pattern}", re.DOTALL)
_OVERHEAD = len(TEMP_PREFIX) + len(_MARK) + _RANDOM_LEN + len(TEMP_SUFFIX)
_DIGEST_HEX = 12  # of the full name, when it has to be cut: 48 bits keep destinations apart
_DEFAULT_NAME_MAX = 255
_ATTEMPTS = 100  # names tried before giving up (as tempfile does)


def is_temporary(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a temporary left by an interrupted atomic write."""
    name = os.path.basename(os.fsdecode(path))
    return name.startswith(TEMP_PREFIX) and _MARK in name and name.endswith(TEMP_SUFFIX)


def _name_max(folder: str) -> int:
    try:
        return int(os.pathconf(folder, "PC_NAME_MAX"))
    except (OSError, ValueError, TypeError):  # no such folder yet, or no limit reported
        return _DEFAULT_NAME_MAX


def _cut(name: str, budget: int) -> str:
    """The longest start of ``name`` whose file-system bytes fit ``budget``, whole
    characters only."""
    used = 0
    for i, ch in enumerate(name):
        used += len(os.fsencode(ch))
        if used > budget:
            return name[:i]
    return name


def temporary_prefix(path: str | os.PathLike) -> str:
    """The start every temporary of destination ``path`` has: ``.<name>.tlckpt-``.

    ``<name>`` is the destination's name, or, where a temporary would otherwise exceed the
    folder's ``NAME_MAX`` bytes, its start cut on a character boundary plus ``~`` and the
    first 12 hex digits of the SHA-256 of the full name.
    """
    dest = os.path.abspath(os.fsdecode(path))
    folder, name = os.path.split(dest)
    budget = _name_max(folder) - _OVERHEAD
    if len(os.fsencode(name)) > budget:
        digest = hashlib.sha256(os.fsencode(name)).hexdigest()[:_DIGEST_HEX]
        name = f"{_cut(name, budget - 1 - _DIGEST_HEX)}~{digest}"
    return f"{TEMP_PREFIX}{name}{_MARK}"


def _random_part() -> str:
    data = os.urandom(_RANDOM_LEN)
    return "".join(_RANDOM_CHARS[b % len(_RANDOM_CHARS)] for b in data)


def temporary_name(prefix: str) -> str:
    """A fresh temporary name for a destination whose temporaries start with ``prefix``
    (:func:`temporary_prefix`): ``prefix``, 8 random characters, ``.tmp``."""
    return f"{prefix}{_random_part()}{TEMP_SUFFIX}"


def is_library_temporary(name: str) -> bool:
    """Whether ``name`` is exactly as this library names temporaries (what a cleaner may
    remove; :func:`is_temporary` recognises more)."""
    return _OURS.fullmatch(name) is not None


def same_inode(path: str, fd: int) -> bool:
    """Whether ``path`` (not followed) names the file open as ``fd``."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    own = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino)


def _create_temporary(folder: str, prefix: str) -> tuple[int, str]:
    """A new temporary in ``folder``, open for writing and locked: ``(fd, path)``."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW
    for _ in range(_ATTEMPTS):
        tmp = os.path.join(folder, f"{prefix}{_random_part()}{TEMP_SUFFIX}")
        try:
            fd = os.open(tmp, flags, 0o666)  # the umask applies, as for open()
        except FileExistsError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            # A cleaner may have taken the lock between our create and our flock, and
            # removed the file as stale: then this name is no longer ours. Try another.
            if same_inode(tmp, fd):
                return fd, tmp
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        os.close(fd)
    raise FileExistsError(errno.EEXIST, "no unused temporary name", os.path.join(folder, prefix))


def fsync_folder(folder: str | os.PathLike) -> None:
    """``fsync`` a folder, so that the creations, renames and removals of its entries
    survive a power cut."""
    _fsync_dir(os.fspath(folder))


def _fsync_dir(folder: str) -> None:
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)
    fd = os.open(folder, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ----------------------------------------------------------------------- exchange

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2  # linux/fs.h
_RENAME_SWAP = 2  # macOS sys/stdio.h
# renameat2's system call number, for a C library too old to wrap it (glibc < 2.28).
_SYS_RENAMEAT2 = {"x86_64": 316, "aarch64": 276, "riscv64": 276}
# What says "this kernel or this file system cannot exchange": nothing was changed.
_NO_EXCHANGE = {errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP}


@functools.cache
def _exchange_call() -> tuple[str, object] | None:
    """The C function that exchanges two names here, or ``None`` (no such call)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:  # pragma: no cover - a process without a C library to look into
        return None
    if sys.platform.startswith("linux"):
        if hasattr(libc, "renameat2"):
            return "renameat2", libc.renameat2
        number = _SYS_RENAMEAT2.get(platform.machine())
        if number is not None and hasattr(libc, "syscall"):
            return "syscall", functools.partial(libc.syscall, ctypes.c_long(number))
        return None
    if sys.platform == "darwin" and hasattr(libc, "renamex_np"):
        return "renamex_np", libc.renamex_np
    return None


def exchange(first: str | os.PathLike, second: str | os.PathLike) -> bool:
    """Swap the names ``first`` and ``second`` atomically (both must exist; they may be of
    different kinds): at every moment each name holds one of the two, never nothing.

    Linux 3.15+ ``renameat2(RENAME_EXCHANGE)``, macOS ``renamex_np(RENAME_SWAP)``.

    Returns:
        Whether they were exchanged; ``False`` (nothing changed) where the platform, the
        kernel or the file system offers no exchange.

    Raises:
        OSError: naming both paths (one is missing, permissions, ...); nothing changed.
    """
    call = _exchange_call()
    if call is None:
        return False
    kind, function = call
    a, b = os.fsencode(first), os.fsencode(second)
    ctypes.set_errno(0)
    if kind == "renamex_np":
        result = function(a, b, ctypes.c_uint(_RENAME_SWAP))  # type: ignore[operator]
    elif kind == "renameat2":
        fd = ctypes.c_int(_AT_FDCWD)
        result = function(fd, a, fd, b, ctypes.c_uint(_RENAME_EXCHANGE))  # type: ignore[operator]
    else:  # syscall(2) is variadic: every argument a full register
        fd = ctypes.c_long(_AT_FDCWD)
        result = function(fd, a, fd, b, ctypes.c_long(_RENAME_EXCHANGE))  # type: ignore[operator]
    if result == 0:
        return True
    code = ctypes.get_errno()
    if code in _NO_EXCHANGE:
        return False
    raise OSError(code, os.strerror(code), os.fsdecode(first), None, os.fsdecode(second))


def _name_destination(exc: OSError, dest: str) -> None:
    """Make the error name the destination the caller asked for: the OS names the
    temporary (removed by now), the folder, or nothing at all."""
    exc.filename = dest


def remove_if_stale(path: str, *, folder: bool = False) -> bool:
    """Remove the temporary at ``path`` (a plain file; with ``folder``, a folder and all in
    it) if no live writer holds its lock; whether it was removed."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    # Never follow or remove anything but the kind asked for.
    if not (stat.S_ISDIR if folder else stat.S_ISREG)(st.st_mode):
        return False
    kind = os.O_DIRECTORY if folder else os.O_NONBLOCK
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | kind)
    except (FileNotFoundError, PermissionError, NotADirectoryError):  # gone, or not ours
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # a live save holds it
            return False
        # Locked by us now: no writer can take this one back. Remove it only if the name
        # still means what we locked (a finished save renames its temporary away).
        if not same_inode(path, fd):
            return False
        try:
            shutil.rmtree(path) if folder else os.unlink(path)
        except FileNotFoundError:
            return False
        return True
    finally:
        os.close(fd)


def _stale_in(folder: str, prefix: str | None) -> list[Path]:
    """Remove the stale temporaries in ``folder`` (of the destination whose temporaries
    start with ``prefix``, or all): only names exactly as this library makes them."""
    start = TEMP_PREFIX if prefix is None else prefix
    # One listing, a cheap startswith first: in a folder of 10,000 files this is ~6 ms, the
    # os.listdir itself ~4.5 ms of it (measured on Linux, ext4).
    names = [n for n in os.listdir(folder) if n.startswith(start)]
    if prefix is None:
        names = [n for n in names if _OURS.fullmatch(n)]
    else:
        names = [n for n in names if _TAIL.fullmatch(n, len(prefix))]
    removed = []
    for name in names:
        path = os.path.join(folder, name)
        if remove_if_stale(path):
            removed.append(Path(path))
    return removed


def clean_temporaries(path_or_folder: str | os.PathLike) -> list[Path]:
    """Remove temporaries that killed saves left behind; never one a running save holds.

    A running save holds an exclusive lock on its temporary, which the kernel releases when
    the writing process ends: a temporary whose lock can be taken is stale. Only plain files
    named exactly as this library names temporaries (``.<name>.tlckpt-<8 characters of
    a-z, 0-9, _>.tmp``) are removed.

    Args:
        path_or_folder: a destination path (its own temporaries, in its folder) or a folder
            (every temporary in it).

    Returns:
        The temporaries removed.

    Raises:
        OSError: the folder cannot be listed.
    """
    target = os.path.abspath(os.fsdecode(path_or_folder))
    if os.path.isdir(target):
        return _stale_in(target, None)
    return _stale_in(os.path.dirname(target), temporary_prefix(target))


@dataclasses.dataclass
class Temporary:
    """A new, locked temporary that is to become ``dest`` (see :func:`create_temporary`).

    Attributes:
        dest: the destination's absolute path.
        path: the temporary's path (a sibling of ``dest``).
        fd: its descriptor, open for writing; the exclusive ``flock`` lives as long as it.
    """

    dest: str
    path: str
    fd: int


def create_temporary(path: str | os.PathLike) -> Temporary:
    """Create the locked temporary of a save to ``path``, with the mode the new file is to
    have (the umask's, or that of the file it will replace).

    Raises:
        OSError: naming ``path`` (no such folder, read-only, full, name too long).
    """
    dest = os.path.abspath(os.fsdecode(path))
    try:
        fd, tmp = _create_temporary(os.path.dirname(dest), temporary_prefix(dest))
    except OSError as exc:  # no such folder, read-only, full, name too long: say which
        _name_destination(exc, dest)
        raise
    temporary = Temporary(dest, tmp, fd)
    try:
        try:
            mode: int | None = os.stat(dest).st_mode & 0o7777
        except OSError:
            mode = None  # a new file: the umask applied when the temporary was created
        if mode is not None:
            os.fchmod(fd, mode)
    except BaseException as exc:
        discard_temporary(temporary, exc)
        raise
    return temporary


def discard_temporary(temporary: Temporary, exc: BaseException | None = None) -> None:
    """Remove the temporary and close it; the destination is untouched. ``exc`` (the error
    that stopped the save), if an :class:`OSError` of our own writing, is made to name the
    destination."""
    with contextlib.suppress(OSError):
        os.unlink(temporary.path)
    with contextlib.suppress(OSError):
        os.close(temporary.fd)
    # Errors of our own writing name nothing or the temporary; an error about some
    # other file (raised by the caller's code inside the block) keeps its name.
    if isinstance(exc, OSError) and exc.filename in (None, temporary.path):
        _name_destination(exc, temporary.dest)


def commit_temporary(temporary: Temporary, *, durable: bool = True) -> None:
    """The complete temporary becomes its destination: ``fsync`` (if ``durable``), remove
    stale temporaries of the destination, rename while still locked, close, ``fsync`` the
    folder; a large old file is freed on a thread afterwards (:mod:`.retired`). A failure
    before the rename discards the temporary (the old file stays).

    Raises:
        OSError: naming the destination; before the rename, the old file is untouched; from
            the folder's ``fsync``, the new file is in place but its rename may not be
            durable yet.
    """
    folder = os.path.dirname(temporary.dest)
    retired: Retired | None = None
    try:
        if durable:
            os.fsync(temporary.fd)
        prefix = temporary_prefix(temporary.dest)
        # Housekeeping (a listing): stale temporaries of the destination, killed saves'.
        # Before the old file is locked below: a killed save's second name of that same file
        # (:mod:`.retired`) would look alive while the lock is held.
        with contextlib.suppress(OSError):
            _stale_in(folder, prefix)
        # A large old file keeps a second name until after the commit, so that freeing it
        # is not part of the rename.
        retired = retire(temporary.dest, os.path.join(folder, temporary_name(prefix)))
        # Still locked: the temporary never exists unlocked under its name.
        os.replace(temporary.path, temporary.dest)
    except BaseException as exc:
        if retired is not None:
            retired.release(wait=True)  # the old file keeps its own name: nothing is freed
        discard_temporary(temporary, exc)
        raise
    try:
        os.close(temporary.fd)
        if durable:
            try:
                _fsync_dir(folder)
            except OSError as exc:  # the new file is in place; its rename may not be durable
                _name_destination(exc, temporary.dest)
                raise
    finally:
        if retired is not None:
            retired.release()


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike, *, durable: bool = True) -> Iterator[BinaryIO]:
    """Yield a binary file; on clean exit it atomically becomes ``path``.

    The new file gets the mode a plain ``open()`` would give it under the current umask, or
    the mode of the file it replaces. At the commit, stale temporaries of ``path`` left by
    killed saves are removed (see :func:`clean_temporaries`).

    Args:
        path: destination. If it is a symlink, the link is replaced, not its target
            (like ``os.replace``).
        durable: fsync the file and the folder (default). ``False`` skips both: still atomic
            against crashes of this process, not against power loss.

    Raises:
        OSError: from the file system, with the path; the old file is untouched and the
            temporary removed.
    """
    temporary = create_temporary(path)
    try:
        # closefd=False: the descriptor (and its lock) lives until the rename is done.
        with os.fdopen(temporary.fd, "wb", closefd=False) as f:
            yield f
            f.flush()
    except BaseException as exc:
        discard_temporary(temporary, exc)
        raise
    commit_temporary(temporary, durable=durable)


@contextlib.contextmanager
def output(path_or_file: PathOrFile, *, durable: bool = True) -> Iterator[BinaryIO]:
    """Atomic output for a path; a caller's open file object is written as it is."""
    if isinstance(path_or_file, (str, os.PathLike)):
        with atomic_output(path_or_file, durable=durable) as f:
            yield f
    else:
        yield path_or_file
