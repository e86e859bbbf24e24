"""Checkpoint sets on disk: the commit protocol, listing, verification, leftovers, removal
(numpy-free, torch-free: ``verify_checkpoint`` and ``tlckpt ls/verify`` need neither).

Commit protocol of a set (:class:`SetWriter`), the folder-level twin of
:func:`~.atomic.atomic_output`:

1. a temporary folder next to the set's, named like a file temporary
   (``.step-<20 digits>.tlckpt-<8 random>.tmp``: hidden, recognisable), created and held
   under an exclusive ``flock`` for as long as the save lives, so that a killed save's
   folder is recognisably stale (:func:`clean_leftovers`);
2. each member written through a :class:`DigestingWriter` (size and ``xxh3_128`` digest of
   the bytes as they stream, never a second pass), flushed and ``fsync``\\ ed;
3. the manifest, written last and ``fsync``\\ ed: it records every member's size and
   digest;
4. the folder ``fsync``\\ ed, renamed to ``step-<20 digits>`` (which must not exist), and the
   parent ``fsync``\\ ed so that the rename survives a power cut.

A folder named ``step-…`` whose manifest parses is *committed*; it *verifies* when every
member is present with the size and digest the manifest records. Removing a set renames it
to a temporary name first, so that a removal killed midway leaves a leftover, never a
damaged committed set.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import importlib.metadata
import os
import shutil
import stat
import warnings
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import xxhash

from ..formats.checkpoint_set import (
    FOLDER_PATTERN,
    MANIFEST_FILE,
    MAX_MANIFEST_BYTES,
    MAX_TRAINING_STATE_BYTES,
    STEP_MAX,
    folder_name,
)
from .atomic import (
    fsync_folder,
    is_library_temporary,
    temporary_name,
    temporary_prefix,
)
from .errors import (
    CheckpointError,
    FileChangedError,
    FileTooLargeError,
    IntegrityError,
    names_the_file,
)
from .families import HEAD_BYTES, head_family
from .inspection import inspect
from .set_documents import (
    Manifest,
    MemberRecord,
    TrainingState,
    build_manifest,
    parse_manifest,
    parse_training_state,
)
from .source import FileStamp

__all__ = [
    "SkippedCheckpointWarning",
    "DigestingWriter",
    "DigestingReader",
    "SetWriter",
    "VerifiedSet",
    "check_step",
    "set_path",
    "committed_steps",
    "candidate_steps",
    "read_manifest",
    "latest_verified",
    "clean_leftovers",
    "remove_set",
    "retention_victims",
    "library_name",
    "warn_skipped",
    "verify_checkpoint",
]

#: Bytes read per call while hashing a member.
HASH_CHUNK = 16 << 20


class SkippedCheckpointWarning(UserWarning):
    """A checkpoint set was passed over because it does not verify; the message names the
    set, the member and the check that failed."""


@functools.cache
def library_name() -> str:
    """What a manifest records as its writer: ``"tlckpt <version>"`` (the installed
    distribution's version; the package itself imports this module, so it is not asked)."""
    try:
        return f"tlckpt {importlib.metadata.version('tlckpt')}"
    except importlib.metadata.PackageNotFoundError:  # run from a source tree, not installed
        return "tlckpt (not installed)"


def check_step(step: Any) -> int:
    """``step`` if it is an integer in the u64 range.

    Raises:
        CheckpointError: it is not.
    """
    if type(step) is not int or not 0 <= step <= STEP_MAX:
        raise CheckpointError(
            f"step must be an integer in [0, 2**64 - 1], got {step!r}", field="step", actual=step
        )
    return step


def set_path(directory: str | os.PathLike, step: int) -> Path:
    """The folder of ``step``'s set in ``directory``."""
    return Path(directory) / folder_name(check_step(step))


# --------------------------------------------------------------------------- writing


#: Buffers from this size on are hashed by the digest thread while the calling thread writes
#: them (both release the GIL, so the two run on two cores); smaller ones are hashed inline.
PARALLEL_DIGEST_BYTES = 1 << 20

_digest_pool: tuple[int, ThreadPoolExecutor] | None = None


def _digest_thread() -> ThreadPoolExecutor:
    """The digest thread of this process (a forked child gets its own: the parent's thread
    does not exist in it)."""
    global _digest_pool
    if _digest_pool is None or _digest_pool[0] != os.getpid():
        _digest_pool = (os.getpid(), ThreadPoolExecutor(1, thread_name_prefix="tlckpt-digest"))
    return _digest_pool[1]


class DigestingWriter:
    """A binary file object that hashes and counts every byte on its way to ``file``.

    The digest is of the bytes in the order written (``xxh3_128``); one pass over the data,
    never a second one over the file. A large buffer is hashed by a worker thread while this
    thread writes it (both release the GIL), and :meth:`write` returns once both are done,
    so the caller may reuse its buffer at once and updates stay in order. The first
    :data:`~.families.HEAD_BYTES` are kept, to name the family. Seeking is not offered: a
    writer that needs it fails (``AttributeError``) rather than digest bytes out of order.
    """

    def __init__(self, file: BinaryIO):
        self.file = file
        self.hash = xxhash.xxh3_128()
        self.size = 0
        self.head = bytearray()

    def write(self, data: Any) -> int:
        view = memoryview(data)
        if not view.c_contiguous:
            raise ValueError("write() needs a contiguous buffer")
        view = view.cast("B") if view.ndim != 1 or view.format != "B" else view
        if view.nbytes >= PARALLEL_DIGEST_BYTES:
            hashing = _digest_thread().submit(self.hash.update, view)
            try:
                written = self.file.write(view)
            finally:
                hashing.result()  # the caller may reuse the buffer once we return
        else:
            written = self.file.write(view)
            self.hash.update(view)
        if written is not None and written != view.nbytes:  # a raw file's short write
            raise OSError(errno.EIO, f"short write: {written} of {view.nbytes} bytes")
        if len(self.head) < HEAD_BYTES:
            self.head += view[: HEAD_BYTES - len(self.head)]
        self.size += view.nbytes
        return view.nbytes

    def flush(self) -> None:
        self.file.flush()

    def writable(self) -> bool:
        return True

    def hexdigest(self) -> str:
        """The digest of everything written so far."""
        return self.hash.hexdigest()


def _lock_folder(path: str) -> int:
    """An open descriptor of the folder at ``path``, exclusively locked (blocking)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _same_inode(path: str, fd: int) -> bool:
    try:
        st = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    own = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino)


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
        if _same_inode(path, fd):
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
    rename (the module docstring's protocol). Use it as a context manager: leaving the block
    without :meth:`commit` (an error, ``KeyboardInterrupt``) removes the temporary folder.

    Args:
        path: the set's folder (its parent is created if missing); the manager's are
            ``<directory>/step-<20 digits>`` (:func:`set_path`).
        step: the set's step.
        overwrite: replace a committed set at ``path`` (else it is an error, checked here
            and again at the rename).
        durable: ``fsync`` files and folders (default); ``False`` keeps atomicity against a
            crash of this process, not against a power cut.

    Raises:
        FileExistsError: ``path`` exists already and ``overwrite`` is false.
        OSError: from the file system.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        step: int,
        *,
        overwrite: bool = False,
        durable: bool = True,
    ):
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
            writer = DigestingWriter(f)
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
        data = build_manifest(self.step, library_name(), self.records(), state, world_size)
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


def _remove_if_stale(path: str) -> bool:
    """Remove the temporary folder at ``path`` if no live save holds its lock."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    if not stat.S_ISDIR(st.st_mode):
        return False
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except (FileNotFoundError, PermissionError, NotADirectoryError):
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # a live save holds it
            return False
        if not _same_inode(path, fd):
            return False
        shutil.rmtree(path)
        return True
    finally:
        os.close(fd)


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
            if _remove_if_stale(path):
                removed.append(Path(path))
    return removed


def retention_victims(
    steps: Sequence[int], keep_last: int | None, keep_every: int | None, keep: int
) -> list[int]:
    """The sets a retention policy removes (never ``keep``, the set just committed).

    Args:
        steps: the committed steps.
        keep_last: keep this many newest sets (``None``: all).
        keep_every: also keep every set whose step is a multiple of this (``None``: none).
        keep: the step just committed.
    """
    if keep_last is None:
        return []
    newest = set(sorted(steps)[-keep_last:]) if keep_last > 0 else set()
    return [
        s
        for s in steps
        if s != keep and s not in newest and not (keep_every and s % keep_every == 0)
    ]


# --------------------------------------------------------------------------- reading


def _read_bounded(path: str, limit: int, what: str) -> bytes:
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size > limit:
            raise FileTooLargeError(
                f"the {what} has {size:,} bytes, more than the {limit:,} a {what} may have",
                path=path,
                field=what,
                actual=size,
                expected=f"at most {limit} bytes",
            )
        return f.read(limit + 1)


def read_manifest(folder: str | os.PathLike) -> Manifest:
    """The checked manifest of the set in ``folder``.

    Raises:
        IntegrityError: there is no manifest (the set was never committed).
        CheckpointError: the manifest is malformed (the subclass says how), or its step is
            not the folder's.
    """
    folder = os.fspath(folder)
    path = os.path.join(folder, MANIFEST_FILE)
    try:
        data = _read_bounded(path, MAX_MANIFEST_BYTES, "manifest")
    except FileNotFoundError:
        raise IntegrityError(
            "the set has no manifest: it was never committed",
            check="present",
            path=folder,
            field="manifest",
        ) from None
    try:
        manifest = parse_manifest(data, MAX_MANIFEST_BYTES)
    except CheckpointError as exc:
        raise exc.with_path(path) from None
    match = FOLDER_PATTERN.fullmatch(os.path.basename(os.path.abspath(folder)))
    if match is not None and int(match.group(1)) != manifest.step:
        raise CheckpointError(
            f"the manifest is of step {manifest.step}, the folder of step {int(match.group(1))}",
            path=path,
            field="step",
            actual=manifest.step,
            expected=int(match.group(1)),
        )
    return manifest


def committed_steps(directory: str | os.PathLike) -> list[int]:
    """The steps of the committed sets in ``directory`` (a ``step-…`` folder whose manifest
    parses), ascending. A missing directory has none."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    steps = []
    for name in sorted(names):
        match = FOLDER_PATTERN.fullmatch(name)
        if match is None:
            continue
        try:
            read_manifest(os.path.join(directory, name))
        except (CheckpointError, OSError):
            continue
        steps.append(int(match.group(1)))
    return steps


def _hash_range(fd: int, h: Any, start: int, stop: int, buffer: bytearray) -> int:
    """Feed bytes ``[start, stop)`` of ``fd`` to ``h`` (``pread``: the handle's position is
    left alone); returns where it stopped (before ``stop`` at the end of the file)."""
    view = memoryview(buffer)
    pos = start
    while pos < stop:
        n = os.preadv(fd, [view[: min(len(view), stop - pos)]], pos)
        if not n:
            break
        h.update(view[:n])
        pos += n
    return pos


def _hash_file(file: BinaryIO, size_hint: int) -> tuple[str, int]:
    """The digest and length of ``file``'s bytes from the start (one sequential pass)."""
    h = xxhash.xxh3_128()
    buffer = bytearray(min(HASH_CHUNK, max(size_hint, 1)))
    # Past the size hint, on to the end: a file that grew shows in the length.
    length = _hash_range(file.fileno(), h, 0, 2**63 - 1, buffer)
    return h.hexdigest(), length


#: A read this close past the hashed prefix first hashes the bytes in between (a record's
#: header between two payloads); a longer jump is left for :meth:`DigestingReader.finish`,
#: where it is hashed once (a checking pass that skips payloads would otherwise hash them
#: all a second time by ``pread`` before the payload pass reads them).
GAP_BYTES = 64 << 10


class DigestingReader:
    """A read-only view of an open member file that hashes its bytes as a load reads them.

    The digest is of the file's bytes in order. A read that starts inside, at, or just past
    (:data:`GAP_BYTES`) the prefix hashed so far extends it with the very bytes the caller
    receives — hashed before they are handed over, so what was loaded is what was hashed.
    Bytes the caller never reads, or reads out of order, are hashed by :meth:`finish` (one
    ``pread`` pass over what is left). A load that reads its file front to back is thus
    verified without a second pass; any other pattern stays correct and costs the rest.

    The position is tracked here (every read goes through this object); ``fileno`` is
    offered for ``fstat`` only — bytes read through the descriptor directly are hashed by
    :meth:`finish` like any unread ones.
    """

    def __init__(self, file: BinaryIO, name: Any = None):
        self.file = file
        self.name = name
        self.hash = xxhash.xxh3_128()
        self.hashed = 0  # bytes [0, hashed) went into the hash
        self.pos = file.seek(0)

    def _consume(self, start: int, view: memoryview) -> None:
        if self.hashed < start <= self.hashed + GAP_BYTES:
            self.hashed = _hash_range(
                self.file.fileno(), self.hash, self.hashed, start, bytearray(start - self.hashed)
            )
        end = start + view.nbytes
        if start <= self.hashed < end:
            self.hash.update(view[self.hashed - start :])
            self.hashed = end

    def read(self, size: int | None = -1) -> bytes:
        data = self.file.read(size)
        self._consume(self.pos, memoryview(data))
        self.pos += len(data)
        return data

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        n = self.file.readinto(view) or 0
        self._consume(self.pos, view[:n])
        self.pos += n
        return n

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        self.pos = self.file.seek(offset, whence)
        return self.pos

    def tell(self) -> int:
        return self.pos

    def fileno(self) -> int:
        return self.file.fileno()

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def finish(self) -> tuple[str, int]:
        """Hash whatever was not read in order, up to the end of the file.

        Returns:
            The digest of the whole file and its length (as found now).
        """
        fd = self.file.fileno()
        left = os.fstat(fd).st_size - self.hashed
        end = _hash_range(
            fd, self.hash, self.hashed, 2**63 - 1, bytearray(min(HASH_CHUNK, max(left, 1)))
        )
        self.hashed = end
        return self.hash.hexdigest(), end


def _compare(role: str, path: Path, record: MemberRecord, digest: str, length: int) -> None:
    """Compare a member's digest and length (as hashed) with the manifest's.

    Raises:
        IntegrityError: the digest differs.
        FileChangedError: the file's length changed while it was hashed.
    """
    if length != record.size:
        raise FileChangedError(
            f"member {role} changed while it was verified ({length} bytes read)",
            path=path,
            actual=length,
            expected=record.size,
        )
    if digest != record.digest:
        raise IntegrityError(
            f"member {role} ({record.file}): digest {digest} differs from the manifest's"
            f" {record.digest} (the file's bytes are damaged)",
            check="digest",
            path=path,
            field=f"members.{role}",
            actual=digest,
            expected=record.digest,
        )


#: With ``streaming``, members up to this size are still hashed when the set is opened:
#: the training state is parsed right away, and a small member costs nothing to hash twice.
_INLINE_BYTES = 4 << 20


@dataclass
class _Opened:
    record: MemberRecord
    path: Path
    file: BinaryIO
    stamp: FileStamp
    reader: DigestingReader | None = None  # None: hashed when the set was opened


@dataclass
class VerifiedSet:
    """A set whose members are open and verified: each member's bytes, read through the
    handle held here, have the size and digest its manifest records.

    Loads read the members through the same handles (:meth:`file`), and
    :meth:`confirm_unchanged` checks afterwards that no member changed in place since it
    was hashed: the bytes verified are the bytes loaded. Use :func:`VerifiedSet.open` as a
    context manager.

    With ``streaming=True`` the large members are hashed while the caller reads them
    through :meth:`file` (a :class:`DigestingReader`: one pass over the bytes for the load
    and the digest together), and :meth:`finish_digests` hashes what the load skipped and
    compares. A caller must call it before anything live changes — the plan of a damaged
    file is then never committed.
    """

    folder: Path
    manifest: Manifest
    members: dict[str, _Opened] = field(default_factory=dict)

    @classmethod
    @contextlib.contextmanager
    def open(cls, folder: str | os.PathLike, *, streaming: bool = False) -> Iterator[VerifiedSet]:
        """Open every member of the set in ``folder`` and verify it (the large ones while
        they are read, with ``streaming``; see the class docstring).

        Raises:
            IntegrityError: a member is missing, or its size or digest differs (the message
                names the member and the check).
            CheckpointError: the manifest is missing or malformed.
            OSError: from the file system.
        """
        folder = Path(folder)
        manifest = read_manifest(folder)
        verified = cls(folder, manifest)
        with contextlib.ExitStack() as stack:
            for role, record in manifest.members.items():
                path = folder / record.file
                try:
                    f = stack.enter_context(open(path, "rb"))
                except FileNotFoundError:
                    raise IntegrityError(
                        f"member {role} ({record.file}) is missing",
                        check="present",
                        path=folder,
                        field=f"members.{role}",
                    ) from None
                stamp = FileStamp.of(os.fstat(f.fileno()))
                if stamp.size != record.size:
                    raise IntegrityError(
                        f"member {role} ({record.file}) has {stamp.size} bytes, the manifest"
                        f" records {record.size}",
                        check="size",
                        path=path,
                        field=f"members.{role}",
                        actual=stamp.size,
                        expected=record.size,
                    )
                verified.members[role] = _Opened(record, path, f, stamp)
            for role, opened in verified.members.items():
                if streaming and role != "training_state" and opened.record.size > _INLINE_BYTES:
                    opened.reader = DigestingReader(opened.file, getattr(opened.file, "name", None))
                else:
                    _compare(
                        role,
                        opened.path,
                        opened.record,
                        *_hash_file(opened.file, opened.record.size),
                    )
            yield verified

    def finish_digests(self) -> None:
        """Hash what the loads did not read of the streamed members, and compare every
        digest with the manifest's (nothing to do without ``streaming``).

        Raises:
            IntegrityError: a member's digest differs from the manifest's.
            FileChangedError: a member's length changed while it was hashed.
        """
        for role, opened in self.members.items():
            if opened.reader is not None:
                _compare(role, opened.path, opened.record, *opened.reader.finish())

    def file(self, role: str) -> BinaryIO:
        """The verified member's open handle (its digesting reader when streamed), at its
        start."""
        opened = self.members[role]
        f: Any = opened.reader if opened.reader is not None else opened.file
        f.seek(0)
        return f

    def training_state(self) -> TrainingState:
        """The training-state member, parsed and checked (step equal to the manifest's).

        Raises:
            CheckpointError: malformed, or of another step.
        """
        opened = self.members["training_state"]
        data = self.file("training_state").read(MAX_TRAINING_STATE_BYTES + 1)
        try:
            state = parse_training_state(data, MAX_TRAINING_STATE_BYTES)
            if state.step != self.manifest.step:
                raise CheckpointError(
                    f"the training state is of step {state.step}, the set of step"
                    f" {self.manifest.step}",
                    field="step",
                    actual=state.step,
                    expected=self.manifest.step,
                )
        except CheckpointError as exc:
            raise exc.with_path(self.folder / opened.record.file) from None
        return state

    def confirm_unchanged(self) -> None:
        """Raise :class:`FileChangedError` if a member changed in place since it was hashed."""
        for role, opened in self.members.items():
            now = FileStamp.of(os.fstat(opened.file.fileno()))
            if not opened.stamp.same_contents(now):
                raise FileChangedError(
                    f"member {role} changed after it was verified (another process wrote it"
                    " in place)",
                    path=opened.path,
                    actual=now.size,
                    expected=opened.stamp.size,
                )


@names_the_file()
def verify_checkpoint(path: str | os.PathLike) -> Manifest:
    """Check a checkpoint set completely, without torch.

    The manifest is parsed and checked; every member must be present with the size and
    ``xxh3_128`` digest it records; the training-state document must parse and be of the
    set's step; the model and optimizer members must be well-formed files of their family
    (read through, payloads skipped) and the model's tensor shapes those of the manifest.

    Args:
        path: the set's folder.

    Returns:
        The set's manifest.

    Raises:
        IntegrityError: a member is missing, or its size or digest differs from the
            manifest's (the message names the member and the check).
        CheckpointError: the manifest, the training state or a member is malformed (the
            subclass and message say which and how).
        OSError: from the file system.

    Example:
        >>> verify_checkpoint("checkpoints/step-00000000000000001200")  # doctest: +SKIP
    """
    with VerifiedSet.open(path) as verified:
        verified.training_state()
        for role in ("model", "optimizer"):
            if role not in verified.manifest.members:
                continue
            record = verified.manifest.members[role]
            try:
                info = inspect(verified.file(role))
            except CheckpointError as exc:
                raise exc.with_path(Path(path) / record.file) from None
            if info.get("family") != record.family:
                raise CheckpointError(
                    f"member {role} is a {info.get('family')} file, the manifest records"
                    f" {record.family}",
                    path=Path(path) / record.file,
                    field=f"members.{role}.family",
                    actual=info.get("family"),
                    expected=record.family,
                )
            if role == "model":
                shapes = [tuple(t["shape"]) for t in info.get("tensors", [])]
                if shapes != [shape for _, shape in verified.manifest.state]:
                    raise CheckpointError(
                        "the model member's tensor shapes differ from the manifest's",
                        path=Path(path) / record.file,
                        field="state",
                    )
        verified.confirm_unchanged()
        return verified.manifest


def latest_verified(directory: str | os.PathLike, *, warn: bool = True) -> int | None:
    """The newest committed set in ``directory`` that verifies, or ``None``.

    Every set passed over on the way is named in a :class:`SkippedCheckpointWarning` (with
    the member and the check), when ``warn``.
    """
    for step in reversed(candidate_steps(directory)):
        try:
            with VerifiedSet.open(set_path(directory, step)) as verified:
                verified.training_state()
            return step
        except (CheckpointError, OSError) as exc:
            if warn:
                warn_skipped(step, exc)
    return None


def candidate_steps(directory: str | os.PathLike) -> list[int]:
    """Every ``step-…`` folder, committed or not (a folder without a manifest is named in a
    warning too: someone made or damaged it)."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted(int(m.group(1)) for m in map(FOLDER_PATTERN.fullmatch, names) if m)


def warn_skipped(step: int, exc: BaseException) -> None:
    """Warn that the set of ``step`` was passed over because of ``exc``."""
    check = getattr(exc, "check", None) or type(exc).__name__
    warnings.warn(
        f"checkpoint set of step {step} skipped: {exc} (check: {check})",
        SkippedCheckpointWarning,
        stacklevel=3,
    )
