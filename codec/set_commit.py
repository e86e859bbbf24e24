"""Writing and removing checkpoint sets: :class:`SetWriter` (the commit protocol of
:mod:`.checkpoint_set`), :func:`remove_set` and :func:`clean_leftovers` (numpy-free,
torch-free).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..formats.checkpoint_set import MANIFEST_FILE, folder_name
from .atomic import (
    fsync_folder,
    is_library_temporary,
    remove_if_stale,
    same_inode,
    temporary_name,
    temporary_prefix,
)
from .families import head_family
from .set_digests import DigestingWriter
from .set_documents import MemberRecord, build_manifest
from .set_folders import check_step, library_name
from .set_keys import as_key

__all__ = ["SetWriter", "remove_set", "clean_leftovers"]


def _lock_folder(path: str) -> int:
    """An open descriptor of the folder at ``path``, exclusively locked (blocking)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _create_temporary_folder(directory: str, name: str) -> tuple[str, int]:
    """A new, locked temporary folder for the set folder ``name``: ``(path, fd)``."""
    prefix = temporary_prefix(os.path.join(directory, name))
    for _ in range(100):
        path = os.path.join(directory, temporary_name(prefix))
        try:
            os.mkdir(path, 0o777)  # the umask applies, as for a plain mkdir
        except FileExistsError:
            continue
        fd = _lock_folder(path)
        # A cleaner may have taken the lock between mkdir and flock and removed the folder
        # as stale: then the name is not ours any more; try another.
        if same_inode(path, fd):
            return path, fd
        os.close(fd)
    raise FileExistsError(errno.EEXIST, "no unused temporary folder name", directory)


@dataclass
class _Member:
    file: str
    family: str | None  # None: named from the first bytes
    version: int
    writer: DigestingWriter


class SetWriter:
    """Writes one set: members into a locked temporary folder, then the manifest, then the
    rename (the protocol in :mod:`.checkpoint_set`). Use it as a context manager: leaving the block
    without :meth:`commit` (an error, ``KeyboardInterrupt``) removes the temporary folder.

    Args:
        path: the set's folder (its parent is created if missing); the manager's are
            ``<directory>/step-<20 digits>`` (:func:`set_path`).
        step: the set's step.
        overwrite: replace a committed set at ``path`` (else it is an error, checked here
            and again at the rename).
        durable: ``fsync`` files and folders (default); ``False`` keeps atomicity against a
            crash of this process, not against a power cut.
        key: sign the set with this 32-byte key (members digested with keyed BLAKE3 as
            they stream, the manifest authenticated); ``None``: unsigned (``xxh3_128``).

    Raises:
        FileExistsError: ``path`` exists already and ``overwrite`` is false.
        CheckpointError: ``key`` is not 32 bytes.
        OSError: from the file system.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        step: int,
        *,
        overwrite: bool = False,
        durable: bool = True,
        key: Any = None,
    ):
        self.key = as_key(key)
        self.final = os.path.abspath(os.fspath(path))
        self.directory, self.name = os.path.split(self.final)
        self.step = check_step(step)
        self.overwrite = overwrite
        self.durable = durable
        self.members: dict[str, _Member] = {}
        self.committed = False
        self.fd: int | None = None
        self.path = ""

    def __enter__(self) -> SetWriter:
        os.makedirs(self.directory, exist_ok=True)
        if not self.overwrite:
            self._refuse_existing()
        self.path, self.fd = _create_temporary_folder(self.directory, self.name)
        return self

    def _refuse_existing(self) -> None:
        if os.path.lexists(self.final):
            raise FileExistsError(
                errno.EEXIST,
                "a checkpoint set exists there already (pass overwrite=True to replace it)",
                self.final,
            )

    @contextlib.contextmanager
    def _file(self, file: str) -> Iterator[DigestingWriter]:
        """A new file in the temporary folder; flushed and ``fsync``\\ ed on clean exit."""
        fd = os.open(
            os.path.join(self.path, file),
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW,
            0o666,
        )
        with os.fdopen(fd, "wb") as f:
            writer = DigestingWriter(f, self.key)
            yield writer
            f.flush()
            if self.durable:
                os.fsync(f.fileno())

    @contextlib.contextmanager
    def member(
        self, role: str, file: str, version: int = 0, family: str | None = None
    ) -> Iterator[DigestingWriter]:
        """A digesting writer for member ``file``; on clean exit it is flushed, ``fsync``\\ ed
        and recorded.

        Args:
            role: ``"model"``, ``"optimizer"`` or ``"training_state"``.
            file: its file name (one of the role's ``MEMBER_FILES``).
            version: the version of its family that was written (or later, through
                :meth:`set_version`, once the writer has said).
            family: its family; ``None`` names it from its first bytes.
        """
        with self._file(file) as writer:
            yield writer
        self.members[role] = _Member(file, family, version, writer)

    def set_version(self, role: str, version: int) -> None:
        """Record the version a member's writer reported once it returned."""
        self.members[role].version = version

    def records(self) -> dict[str, MemberRecord]:
        """What the manifest will record of each member written so far."""
        out = {}
        for role, m in self.members.items():
            family = m.family or head_family(bytes(m.writer.head), m.writer.size) or role
            out[role] = MemberRecord(m.file, family, m.version, m.writer.size, m.writer.hexdigest())
        return out

    def commit(self, state: Sequence[tuple[str, Sequence[int]]], world_size: int = 1) -> Path:
        """Write the manifest, make the folder the step's set, durably.

        Args:
            state: the model's ``(name, shape)`` in file order.
            world_size: how many processes saved the set.

        Returns:
            The set's folder.

        Raises:
            FileExistsError: a set of this step was committed meanwhile (no ``overwrite``).
            OSError: from the file system; nothing is committed.
        """
        data = build_manifest(
            self.step, library_name(), self.records(), state, world_size, self.key
        )
        with self._file(MANIFEST_FILE) as f:
            f.write(data)
        if self.durable:
            os.fsync(self.fd)  # type: ignore[arg-type]  # the folder's entries
        replaced = None
        if os.path.lexists(self.final):
            if not self.overwrite:
                self._refuse_existing()
            replaced = _retire(self.directory, self.final)
        try:
            os.rename(self.path, self.final)
        except OSError as exc:
            if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):  # committed meanwhile
                self._refuse_existing()
            raise
        self.committed = True
        if self.durable:
            fsync_folder(self.directory)
        if replaced is not None:
            _remove_tree(replaced)
        return Path(self.final)

    def __exit__(self, *exc_info: object) -> None:
        fd, self.fd = self.fd, None
        try:
            if not self.committed and self.path:
                # Housekeeping only: the error that ended the save is what the caller must
                # see; a folder that cannot be removed now is a leftover, cleaned later.
                with contextlib.suppress(OSError):
                    _remove_tree(self.path)
        finally:
            if fd is not None:
                os.close(fd)  # releases the lock


# --------------------------------------------------------------------------- removal


def _retire(directory: str, folder: str) -> str:
    """Rename a committed set to a leftover's name (a removal killed after this leaves a
    leftover, never a damaged set); returns the new path."""
    prefix = temporary_prefix(folder)
    for _ in range(100):
        target = os.path.join(directory, temporary_name(prefix))
        if not os.path.lexists(target):
            os.rename(folder, target)
            return target
    raise FileExistsError(errno.EEXIST, "no unused temporary folder name", directory)


def _remove_tree(path: str) -> None:
    if os.path.isdir(path):
        shutil.rmtree(path)


def remove_set(directory: str | os.PathLike, step: int, *, durable: bool = True) -> None:
    """Remove the set of ``step``: renamed away first (atomically), then deleted.

    Raises:
        FileNotFoundError: there is no such set.
        OSError: from the file system.
    """
    directory = os.path.abspath(os.fspath(directory))
    retired = _retire(directory, os.path.join(directory, folder_name(check_step(step))))
    if durable:
        fsync_folder(directory)
    _remove_tree(retired)


def clean_leftovers(directory: str | os.PathLike) -> list[Path]:
    """Remove what killed saves and removals left in ``directory``; never what a live save
    holds.

    Leftovers are temporary folders named as :class:`SetWriter` names them
    (``.<set name>.tlckpt-<8 random>.tmp``, e.g. ``.step-<20 digits>.tlckpt-ab12cd34.tmp``)
    whose lock can be taken (the kernel drops a lock when its process ends). Files are
    never touched here (:func:`~.atomic.clean_temporaries` handles file temporaries).

    Returns:
        The folders removed.
    """
    directory = os.path.abspath(os.fspath(directory))
    removed = []
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    for name in names:
        if is_library_temporary(name):
            path = os.path.join(directory, name)
            if remove_if_stale(path, folder=True):
                removed.append(Path(path))
    return removed
