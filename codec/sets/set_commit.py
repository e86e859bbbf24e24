"""Writing and removing checkpoint sets: :class:`SetWriter` (the commit protocol of
:mod:`.checkpoint_set`), :func:`remove_set` and :func:`clean_leftovers` (torch-free).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ...formats.checkpoint_set import MANIFEST_FILE, folder_name
from ..fileio.atomic import (
    exchange,
    fsync_folder,
    is_library_temporary,
    remove_if_stale,
    same_inode,
    temporary_prefix,
)
from .member_ledger import MemberLedger, WrittenMember
from .set_digests import DigestingWriter
from .set_folder_moves import (
    ATTEMPTS,
    create_temporary_folder,
    lock_if_folder,
    remove_tree,
    rename_aside,
)
from .set_folders import check_step
from .set_keys import as_key

__all__ = ["SetWriter", "remove_set", "remove_set_folder", "clean_leftovers", "is_retired"]

#: A set that an overwrite moved aside where no exchange exists is named
#: ``.<set name>.tlckpt-<8 random>.old`` until the new set is in place: a cleaner finding
#: one unlocked puts it back if the step has no set (the overwrite was killed midway), else
#: removes it.
RETIRED_SUFFIX = ".old"
_RANDOM = r"[a-z0-9_]{8}"
_RETIRED = re.compile(rf"\.(.+)\.tlckpt-{_RANDOM}{re.escape(RETIRED_SUFFIX)}", re.DOTALL)
_OWN_TAIL = re.compile(rf"{_RANDOM}{re.escape(RETIRED_SUFFIX)}")
_CUT = re.compile(r"~[0-9a-f]{12}\Z")  # how temporary_prefix ends a shortened name
_CONFLICT = (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR)


class _Discarded:
    """Where an adopted member's digesting writer writes: nowhere (it is on disk already)."""

    def write(self, data: Any) -> int:
        return memoryview(data).nbytes


class SetWriter(MemberLedger):
    """Writes one set: members into a locked temporary folder, then the manifest, then the
    rename (the protocol in :mod:`.checkpoint_set`). Use it as a context manager: leaving the block
    without :meth:`commit` (an error, ``KeyboardInterrupt``) removes the temporary folder.

    Args:
        path: the set's folder (its parent is created if missing); the manager's are
            ``<directory>/step-<20 digits>`` (:func:`set_path`).
        step: the set's step.
        overwrite: replace a committed set at ``path`` (else it is an error, checked here
            and again at the rename). The two are exchanged atomically where the platform
            can (:meth:`_install`): killed at any moment, ``path`` holds the old set or the
            new one. A symbolic link at ``path`` is replaced as a link (its target is
            never followed or removed).
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
        self.members: dict[str, WrittenMember] = {}
        self.committed = False
        self.fd: int | None = None
        self.path = ""

    def __enter__(self) -> SetWriter:
        os.makedirs(self.directory, exist_ok=True)
        # Housekeeping first: what killed saves left here (their folders would otherwise
        # stay forever where no manager cleans), and a set of this path whose overwrite
        # was killed midway is put back before it is refused or replaced.
        with contextlib.suppress(OSError):
            _clean(self.directory, self.final)
        if not self.overwrite:
            self._refuse_existing()
        self.path, self.fd = create_temporary_folder(self.directory, self.name)
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
            writer = DigestingWriter(f, self.key, writeback=self.durable)
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
        self.members[role] = WrittenMember(file, family, version, writer)

    def adopt(
        self,
        role: str,
        file: str,
        version: int = 0,
        family: str | None = None,
        fd: int | None = None,
    ) -> None:
        """Record member ``file``, which other code (every rank of a sharded save, in
        parallel) wrote in the temporary folder: its bytes are read back once and digested
        as :meth:`member` would have digested them.

        Args:
            fd: the member's bytes open for reading (its temporary's, opened before its
                rename: the bytes must be final), closed here; default: ``file`` is opened.

        Raises:
            OSError: the file cannot be read.
        """
        if fd is None:
            fd = os.open(os.path.join(self.path, file), os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        try:
            digesting = DigestingWriter(_Discarded(), self.key)
            digesting.absorb(fd)
        finally:
            os.close(fd)
        self.members[role] = WrittenMember(file, family, version, digesting)

    def _commit_manifest(self, data: bytes) -> Path:
        """Write the manifest's bytes, then the rename (see :meth:`commit`)."""
        with self._file(MANIFEST_FILE) as f:
            f.write(data)
        if self.durable:
            os.fsync(self.fd)  # type: ignore[arg-type]  # the folder's entries
        replaced = self._install()
        self.committed = True
        if self.durable:
            fsync_folder(self.directory)
        if replaced is not None:
            # Housekeeping: the new set is committed whatever happens here; a set that
            # cannot be removed now is a leftover (unlocked), removed by the next cleaner.
            with contextlib.suppress(OSError):
                remove_tree(replaced)
        return Path(self.final)

    def _install(self) -> str | None:
        """Put the temporary folder at the set's name; returns where the set it replaced
        lies now (to be removed), if any.

        The step's name never names nothing while a set is replaced: the two are exchanged
        atomically (:func:`~.atomic.exchange`), or, where no exchange exists, the old set is
        moved aside under its lock and a recognisable name (:func:`is_retired`), which a
        cleaner puts back if this process dies before the new set is in place.
        """
        for _ in range(ATTEMPTS):
            if os.path.lexists(self.final):
                if not self.overwrite:
                    self._refuse_existing()
                try:
                    if exchange(self.path, self.final):
                        return self.path  # the old set now lies at the temporary's name
                except FileNotFoundError:
                    continue  # removed meanwhile: a plain rename now
                retired = self._replace_without_exchange()
                if retired is not None:
                    return retired
                continue
            try:
                os.rename(self.path, self.final)
                return None
            except OSError as exc:
                if exc.errno not in _CONFLICT:
                    raise
                if not self.overwrite:  # committed meanwhile
                    self._refuse_existing()
        raise FileExistsError(errno.EEXIST, "the set kept changing while replaced", self.final)

    def _replace_without_exchange(self) -> str | None:
        """Move the old set aside (locked, under a retired name), rename the new one in;
        returns the retired path, or ``None`` if the old set changed meanwhile (retry)."""
        lock = lock_if_folder(self.final)
        try:
            try:
                retired = rename_aside(self.directory, self.final, RETIRED_SUFFIX)
            except FileNotFoundError:
                return None
            try:
                os.rename(self.path, self.final)
            except BaseException as exc:
                # Put the old set back; if the name was taken meanwhile, a cleaner removes
                # the retired one once our lock is gone.
                with contextlib.suppress(OSError):
                    os.rename(retired, self.final)
                if isinstance(exc, OSError) and exc.errno in _CONFLICT:
                    return None
                raise
            return retired
        finally:
            if lock is not None:
                os.close(lock)

    def __exit__(self, *exc_info: object) -> None:
        fd, self.fd = self.fd, None
        try:
            if not self.committed and self.path:
                # Housekeeping only: the error that ended the save is what the caller must
                # see; a folder that cannot be removed now is a leftover, cleaned later.
                with contextlib.suppress(OSError):
                    remove_tree(self.path)
        finally:
            if fd is not None:
                os.close(fd)  # releases the lock


# --------------------------------------------------------------------------- removal


def _retire(directory: str, folder: str) -> str:
    """Rename a committed set to a leftover's name (a removal killed after this leaves a
    leftover, never a damaged set); returns the new path."""
    return rename_aside(directory, folder, ".tmp")


def remove_set(directory: str | os.PathLike, step: int, *, durable: bool = True) -> None:
    """Remove the set of ``step``: renamed away first (atomically), then deleted.

    Raises:
        FileNotFoundError: there is no such set.
        OSError: from the file system.
    """
    directory = os.fspath(directory)
    remove_set_folder(os.path.join(directory, folder_name(check_step(step))), durable=durable)


def remove_set_folder(path: str | os.PathLike, *, durable: bool = True) -> None:
    """Remove the set folder at ``path`` (any name): renamed away first, atomically, to a
    leftover's name, then deleted — a removal killed midway leaves a leftover that the next
    save cleans, never a damaged committed set. A symbolic link at ``path`` is removed as a
    link (what it points to is never touched).

    Raises:
        FileNotFoundError: nothing is at ``path``.
        OSError: from the file system.
    """
    final = os.path.abspath(os.fspath(path))
    directory = os.path.dirname(final)
    retired = _retire(directory, final)
    if durable:
        fsync_folder(directory)
    remove_tree(retired)  # a link itself, never what it points to


def is_retired(name: str) -> bool:
    """Whether ``name`` is that of a set an overwrite moved aside (where no exchange
    exists): ``.<set name>.tlckpt-<8 random>.old``."""
    return _RETIRED.fullmatch(name) is not None


def _retired_home(directory: str, name: str) -> str | None:
    """The set folder a retired ``name`` came from, or ``None`` where the name cannot say
    (a set name that was shortened to fit; the save to that path puts it back)."""
    match = _RETIRED.fullmatch(name)
    if match is None:
        return None
    home = match.group(1)
    if _CUT.search(home) or "/" in home or home in (".", ".."):
        return None
    path = os.path.join(directory, home)
    if not name.startswith(temporary_prefix(path)):
        return None
    return path


def _settle_retired(path: str, home: str) -> bool:
    """Put the retired set at ``path`` back at ``home`` if ``home`` names nothing (its
    overwrite was killed before the new set was in place), else remove it; never while a
    live overwrite holds it. Whether anything was done."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    fd = None
    if stat.S_ISDIR(st.st_mode):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_DIRECTORY)
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            return False
    try:
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # its overwrite is alive
                return False
            if not same_inode(path, fd):
                return False
        if not os.path.lexists(home):
            try:
                os.rename(path, home)
                return True
            except OSError as exc:
                if exc.errno not in _CONFLICT:
                    raise
        remove_tree(path)
        return True
    finally:
        if fd is not None:
            os.close(fd)


def _remove_stale(path: str) -> bool:
    """Remove a leftover: a folder no live save holds, or a link (an overwritten or removed
    set that was a symbolic link: the link goes, never what it points to)."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    if stat.S_ISLNK(st.st_mode):
        try:
            os.unlink(path)
        except FileNotFoundError:
            return False
        return True
    return remove_if_stale(path, folder=True)


def clean_leftovers(directory: str | os.PathLike) -> list[Path]:
    """Remove what killed saves and removals left in ``directory``; never what a live save
    holds; put back a set whose overwrite was killed before the new set was in place.

    Leftovers are temporary folders named as :class:`SetWriter` names them
    (``.<set name>.tlckpt-<8 random>.tmp``, e.g. ``.step-<20 digits>.tlckpt-ab12cd34.tmp``)
    whose lock can be taken (the kernel drops a lock when its process ends), and symbolic
    links of such names (a replaced or removed set that was a link: the link is removed,
    never what it points to). A retired set (:func:`is_retired`) no live overwrite holds is
    put back if its step's name is free, else removed. File temporaries are never touched
    here (:func:`~.atomic.clean_temporaries` handles those).

    Returns:
        The leftovers removed or put back (their names before).
    """
    return _clean(os.path.abspath(os.fspath(directory)), None)


def _clean(directory: str, destination: str | None) -> list[Path]:
    """:func:`clean_leftovers`; retired sets of ``destination`` (the path of a set being
    saved) are put back there even where their name cannot say it (a shortened name)."""
    own = None if destination is None else temporary_prefix(destination)
    removed = []
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    for name in names:
        path = os.path.join(directory, name)
        if is_library_temporary(name):
            done = _remove_stale(path)
        elif not is_retired(name):
            continue
        elif own is not None and _OWN_TAIL.fullmatch(name, len(own)) and name.startswith(own):
            done = _settle_retired(path, destination)  # type: ignore[arg-type]
        elif (home := _retired_home(directory, name)) is not None:
            done = _settle_retired(path, home)
        else:
            continue
        if done:
            removed.append(Path(path))
    return removed
