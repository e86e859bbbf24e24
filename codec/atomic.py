"""Atomic, durable writes: a file at ``path`` is either the old one or the complete new one.

Protocol: a unique temporary sibling (``tempfile.mkstemp`` in the destination's folder, so the
final rename never crosses file systems), write, flush, ``fsync``, ``os.replace`` over the
destination, then ``fsync`` the folder so the rename itself survives a power cut. On any
failure — ``KeyboardInterrupt`` and a caller's generator raising midway included — the
temporary is removed and the error re-raised; the old file is never opened for writing.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from typing import BinaryIO

from .source import PathOrFile

__all__ = ["TEMP_PREFIX", "TEMP_SUFFIX", "atomic_output", "is_temporary", "output"]

#: Temporaries are named ``.<name>.tlckpt-<random>.tmp``: hidden, recognisable, and never
#: mistaken for a checkpoint (no reader looks at such a name; ``is_temporary`` says so).
TEMP_PREFIX = "."
TEMP_SUFFIX = ".tmp"
_MARK = ".tlckpt-"

# mkstemp creates files readable by the owner only; a checkpoint gets the permissions a
# plain open() would give it. The umask can only be read by setting it, so once, at import.
_UMASK = os.umask(0)
os.umask(_UMASK)


def is_temporary(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a temporary left by an interrupted atomic write."""
    name = os.path.basename(os.fspath(path))
    return name.startswith(TEMP_PREFIX) and _MARK in name and name.endswith(TEMP_SUFFIX)


def _fsync_dir(folder: str) -> None:
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)
    fd = os.open(folder, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _name_destination(exc: OSError, dest: str) -> None:
    """Make the error name the destination the caller asked for: the OS names the
    temporary (removed by now), the folder, or nothing at all."""
    exc.filename = dest


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike, *, durable: bool = True) -> Iterator[BinaryIO]:
    """Yield a binary file; on clean exit it atomically becomes ``path``.

    Args:
        path: destination. If it is a symlink, the link is replaced, not its target
            (like ``os.replace``).
        durable: fsync the file and the folder (default). ``False`` skips both: still atomic
            against crashes of this process, not against power loss.

    Raises:
        OSError: from the file system, with the path; the old file is untouched and the
            temporary removed.
    """
    dest = os.path.abspath(os.fspath(path))
    folder, name = os.path.split(dest)
    try:
        fd, tmp = tempfile.mkstemp(
            prefix=f"{TEMP_PREFIX}{name}{_MARK}", suffix=TEMP_SUFFIX, dir=folder
        )
    except OSError as exc:  # no such folder, read-only, full: say which destination
        _name_destination(exc, dest)
        raise
    try:
        try:
            mode = os.stat(dest).st_mode & 0o7777
        except OSError:
            mode = 0o666 & ~_UMASK
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), mode)
            yield f
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, dest)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        # Errors of our own writing name nothing or the temporary; an error about some
        # other file (raised by the caller's code inside the block) keeps its name.
        if isinstance(exc, OSError) and exc.filename in (None, tmp):
            _name_destination(exc, dest)
        raise
    if durable:
        try:
            _fsync_dir(folder)
        except OSError as exc:  # the new file is in place; its rename may not be durable yet
            _name_destination(exc, dest)
            raise


@contextlib.contextmanager
def output(path_or_file: PathOrFile, *, durable: bool = True) -> Iterator[BinaryIO]:
    """Atomic output for a path; a caller's open file object is written as it is."""
    if isinstance(path_or_file, (str, os.PathLike)):
        with atomic_output(path_or_file, durable=durable) as f:
            yield f
    else:
        yield path_or_file
