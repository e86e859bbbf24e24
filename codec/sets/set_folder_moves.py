"""A set folder's locks, renames and removal, which the commit and the cleaners share
(torch-free): a new temporary folder created and locked, a folder locked, renamed
aside under a fresh hidden name, removed without following links.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import stat

from ..fileio.atomic import same_inode, temporary_name, temporary_prefix

__all__ = [
    "ATTEMPTS",
    "lock_folder",
    "lock_if_folder",
    "create_temporary_folder",
    "rename_aside",
    "remove_tree",
]

#: How many fresh names (or retries of a replacement) are tried before giving up.
ATTEMPTS = 100


def lock_folder(path: str) -> int:
    """An open descriptor of the folder at ``path``, exclusively locked (blocking)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except BaseException:
        os.close(fd)
        raise
    return fd


def create_temporary_folder(directory: str, name: str) -> tuple[str, int]:
    """A new, locked temporary folder for the set folder ``name``: ``(path, fd)``."""
    prefix = temporary_prefix(os.path.join(directory, name))
    for _ in range(100):
        path = os.path.join(directory, temporary_name(prefix))
        try:
            os.mkdir(path, 0o777)  # the umask applies, as for a plain mkdir
        except FileExistsError:
            continue
        # A cleaner (another process's manager opening the same directory) may remove the
        # new folder as stale before it is locked: before the open (then there is nothing to
        # lock) or between the open and the flock (then the name is not ours any more). Either
        # way, try another name.
        try:
            fd = lock_folder(path)
        except FileNotFoundError:
            continue
        if same_inode(path, fd):
            return path, fd
        os.close(fd)
    raise FileExistsError(errno.EEXIST, "no unused temporary folder name", directory)


def lock_if_folder(path: str) -> int | None:
    """A descriptor of the folder at ``path`` (not followed) under an exclusive lock, or
    ``None`` if it is not a folder (a link, a file: nothing to lock)."""
    try:
        return lock_folder(path)
    except (NotADirectoryError, FileNotFoundError):
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # a symbolic link: O_NOFOLLOW refuses it
            return None
        raise


def rename_aside(directory: str, folder: str, suffix: str) -> str:
    """Rename ``folder`` to a fresh hidden name of its own (``prefix``, 8 random,
    ``suffix``); returns the new path."""
    prefix = temporary_prefix(folder)
    for _ in range(ATTEMPTS):
        target = os.path.join(directory, temporary_name(prefix)[: -len(".tmp")] + suffix)
        if not os.path.lexists(target):
            os.rename(folder, target)
            return target
    raise FileExistsError(errno.EEXIST, "no unused temporary folder name", directory)


def remove_tree(path: str) -> None:
    """Remove what ``path`` names: a folder and all in it, or a link or file itself — never
    what a symbolic link points to."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)  # which never follows the links inside either
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
