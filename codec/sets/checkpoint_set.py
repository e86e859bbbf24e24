"""Checkpoint sets on disk: the commit protocol, listing, verification, leftovers, removal
(torch-free: ``verify_checkpoint`` and ``tlckpt ls/verify`` work without torch).

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
4. the folder ``fsync``\\ ed and renamed to ``step-<20 digits>``, and the parent ``fsync``\\ ed
   so that the rename survives a power cut. The name must not exist, unless the save
   overwrites: then the new folder and the old one exchange names atomically
   (``renameat2(RENAME_EXCHANGE)``) and the old one is removed, or, where the file system
   cannot exchange, the old one is moved aside locked (``….old``) until the new one is in
   place, and put back by the next cleaner if the save died in between
   (:mod:`.set_commit`).

A folder named ``step-…`` whose manifest parses is *committed*; it *verifies* when every
member is present with the size and digest the manifest records. A set saved with a key is
*signed* (members digested with keyed BLAKE3, the manifest authenticated by a MAC: see
:mod:`tlckpt.formats.checkpoint_set`); it verifies only with its key, and with a key only a
signed set verifies. Removing a set renames it
to a temporary name first, so that a removal killed midway leaves a leftover, never a
damaged committed set.
"""

from __future__ import annotations

import contextlib
import hmac
import os
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

from ...formats.checkpoint_set import (
    MAX_TRAINING_STATE_BYTES,
    MODEL_BITS_VERSION,
    SAFETENSORS_MEMBER_VERSION,
    TRAINING_STATE_FAMILY,
    TRAINING_STATE_VERSION,
)
from ..errors import CheckpointError, FileChangedError, IntegrityError, names_the_file
from ..fileio.source import FileStamp, open_regular
from ..inspection import inspect
from ..sniffing import JSON_FAMILY
from .remote_set_reading import staged_set
from .remote_store import is_url

# The parts of the protocol live in their own modules; this one verifies, and names them all.
from .set_digests import (
    DigestingReader,
    hash_file,
)
from .set_documents import Manifest, MemberRecord, TrainingState, parse_training_state
from .set_folders import (
    SkippedCheckpointWarning,
    candidate_steps,
    not_regular_member,
    read_manifest_bytes,
    set_path,
)
from .set_keys import as_key

__all__ = [
    "VerifiedSet",
    "latest_verified",
    "newest_usable",
    "RELISTS",
    "warn_skipped",
    "verify_checkpoint",
]


def _compare(
    role: str, path: Path, record: MemberRecord, digest: str, length: int, signed: bool = False
) -> None:
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
    # In constant time: a keyed digest must not be learnt byte by byte from timings.
    if not hmac.compare_digest(digest, record.digest):
        how = "damaged, or edited without the key" if signed else "damaged"
        raise IntegrityError(
            f"member {role} ({record.file}): digest {digest} differs from the manifest's"
            f" {record.digest} (the file's bytes are {how})",
            check="digest",
            path=path,
            field=f"members.{role}",
            actual=digest,
            expected=record.digest,
        )


#: The version a manifest records of a member whose family's header names none.
_UNNAMED_VERSIONS = {JSON_FAMILY: MODEL_BITS_VERSION, "safetensors": SAFETENSORS_MEMBER_VERSION}


def _check_record(role: str, path: Path, record: MemberRecord, family: Any, version: Any) -> None:
    """Compare the family and version the manifest records for a member with what the
    member's bytes are (its header, or the document's own tag).

    Raises:
        IntegrityError: they differ (``check="family"`` or ``"version"``).
    """
    for check, found, recorded in (
        ("family", family, record.family),
        ("version", version, record.version),
    ):
        if found != recorded:
            raise IntegrityError(
                f"member {role} ({record.file}) is {family} v{version}, the manifest records"
                f" {record.family} v{record.version}",
                check=check,
                path=path,
                field=f"members.{role}.{check}",
                actual=found,
                expected=recorded,
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
    #: The manifest's bytes as parsed (and, for a signed set, authenticated).
    manifest_bytes: bytes = b""
    key: Any = None

    @classmethod
    @contextlib.contextmanager
    def open(
        cls, folder: str | os.PathLike, *, streaming: bool = False, key: Any = None
    ) -> Iterator[VerifiedSet]:
        """Open every member of the set in ``folder`` and verify it (the large ones while
        they are read, with ``streaming``; see the class docstring).

        Args:
            folder: the set's folder.
            streaming: hash the large members while the caller reads them.
            key: the 32-byte key the set must be signed with (or a
                :class:`~.set_keys.SetKey`); ``None``: the set must be unsigned.

        Raises:
            KeyRequiredError: the set is signed and ``key`` is ``None``.
            IntegrityError: a member is missing, or its size or digest differs (the message
                names the member and the check); the set does not authenticate with ``key``
                (or is not signed).
            CheckpointError: the manifest is missing or malformed; ``key`` is not 32 bytes.
            OSError: from the file system.
        """
        folder = Path(folder)
        key = as_key(key)
        manifest, data = read_manifest_bytes(folder, key)
        verified = cls(folder, manifest, manifest_bytes=data, key=key)
        with contextlib.ExitStack() as stack:
            for role, record in manifest.members.items():
                path = folder / record.file
                try:
                    f = stack.enter_context(
                        open_regular(path, not_regular_member(role, record.file))
                    )
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
                    opened.reader = DigestingReader(
                        opened.file,
                        getattr(opened.file, "name", None),
                        key,
                        opened.record.size,
                    )
                else:
                    _compare(
                        role,
                        opened.path,
                        opened.record,
                        *hash_file(opened.file, opened.record.size, key),
                        key is not None,
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
                _compare(
                    role, opened.path, opened.record, *opened.reader.finish(), self.key is not None
                )

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
        _check_record(
            "training_state",
            opened.path,
            opened.record,
            TRAINING_STATE_FAMILY,
            TRAINING_STATE_VERSION,  # the only version parse_training_state accepts
        )
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

    def check_members(self) -> None:
        """What :func:`verify_checkpoint` checks beyond the digests: each member's family,
        version and header (read through its verified handle, so its bytes are not read
        again), and the model's shapes against the manifest's; then that nothing changed in
        place since it was hashed.

        Raises:
            CheckpointError: as :func:`verify_checkpoint`.
        """
        for role, record in self.manifest.members.items():
            if role == "training_state":
                continue
            try:
                info = inspect(self.file(role))
            except CheckpointError as exc:
                raise exc.with_path(self.folder / record.file) from None
            family = info.get("family")
            # An exact-bits JSON file names its version in its format tag (all are v1); the
            # safetensors layout has none, which a manifest records as 0.
            version = info.get("version", _UNNAMED_VERSIONS.get(family))
            _check_record(role, self.folder / record.file, record, family, version)
            if (role == "model" or record.tensors is not None) and not _shapes_agree(
                info, record, self.manifest
            ):
                raise CheckpointError(
                    "the model member's tensor shapes differ from the manifest's",
                    path=self.folder / record.file,
                    field="state",
                )
        self.confirm_unchanged()

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
def verify_checkpoint(
    path: str | os.PathLike, *, key: Any = None, storage_options: dict[str, Any] | None = None
) -> Manifest:
    """Check a checkpoint set completely, without torch.

    The manifest is parsed and checked; every member must be present with the size and
    ``xxh3_128`` digest it records; the training-state document must parse and be of the
    set's step; every member must be of the family and version the manifest records (the
    model and optimizer members by their headers); the model and optimizer members must be
    well-formed files (read through, payloads skipped) and the model's tensor shapes those
    of the manifest. With ``key``, the set must be signed with it: the manifest's MAC is
    checked first, and the members' digests are keyed BLAKE3.

    Args:
        path: the set's folder; or its URL (``s3://…``: every member streamed by ranged
            reads, hashed as it arrives, into a local staging folder, checked there).
        key: the 32-byte key a signed set was saved with; ``None`` for an unsigned set.
        storage_options: for a URL, the fsspec filesystem's options.

    Returns:
        The set's manifest.

    Raises:
        KeyRequiredError: the set is signed and no key was given (it cannot be
            authenticated without it).
        IntegrityError: a member is missing or not a regular file, or its size, digest,
            family or version differs from the manifest's (the message names the member and
            the check); with ``key``: the set is signed with another key, its manifest was
            edited (``check="mac"``), or it is not signed.
        CheckpointError: the manifest, the training state or a member is malformed (the
            subclass and message say which and how).
        OSError: from the file system.

    Example:
        >>> verify_checkpoint("checkpoints/step-00000000000000001200")  # doctest: +SKIP
    """
    if is_url(path):
        with staged_set(str(path), key=key, storage_options=storage_options) as local:
            return verify_checkpoint(local, key=key)
    with VerifiedSet.open(path, key=key) as verified:
        verified.training_state()
        verified.check_members()
        return verified.manifest


_T = TypeVar("_T")

#: How many times the newest usable set is looked for in a fresh listing, when sets vanish
#: while they are tried (another process's retention removes them, its save commits newer
#: ones); a bound, so that a directory that changes without end is not looked at forever.
RELISTS = 8


def newest_usable(
    directory: str | os.PathLike,
    attempt: Callable[[int], _T],
    unusable: tuple[type[BaseException], ...],
    *,
    warn: bool = True,
    reason: Callable[[BaseException], BaseException] = lambda exc: exc,
) -> tuple[int, _T] | None:
    """The newest step of ``directory`` for which ``attempt`` succeeds, and its result.

    Steps are tried newest first. One whose ``attempt`` raises one of ``unusable`` is passed
    over (named in a :class:`SkippedCheckpointWarning` with ``reason(exc)``, when ``warn``) —
    unless its folder is gone by then: another process removed it meanwhile, and may have
    committed newer sets, so the directory is listed again (at most :data:`RELISTS` times)
    and the steps not yet passed over are tried anew.

    Args:
        directory: a checkpoint directory.
        attempt: what to do with a step (open it, restore it).
        unusable: what ``attempt`` raises for a step to pass over.
        warn: warn about each step passed over.
        reason: what a warning names, from the exception caught.

    Returns:
        ``(step, result)``, or ``None`` when no step is usable.
    """
    passed_over: set[int] = set()
    for _ in range(RELISTS):
        for step in reversed(candidate_steps(directory)):
            if step in passed_over:
                continue
            try:
                return step, attempt(step)
            except unusable as exc:
                if not os.path.lexists(set_path(directory, step)):
                    break  # removed while it was tried: look again
                passed_over.add(step)
                if warn:
                    warn_skipped(step, reason(exc))
        else:
            return None  # every listed step was tried
    return None


def _shapes_agree(info: dict[str, Any], record: MemberRecord, manifest: Manifest) -> bool:
    """Whether a model member's tensors (as :func:`~.inspection.inspect` describes them) are
    those its manifest records: in order for the positional families; by name for the
    safetensors layout, which holds each tied tensor once (version 2)."""
    described = info.get("tensors", [])
    if record.tensors is None:  # version 1: the manifest's state, in order
        return [tuple(t["shape"]) for t in described] == [s for _, s in manifest.state]
    if record.family == "safetensors":
        tied = record.tied or {}
        kept = {name: shape for name, shape in record.tensors if name not in tied}
        return {t.get("name"): tuple(t["shape"]) for t in described} == kept
    return [tuple(t["shape"]) for t in described] == [s for _, s in record.tensors]


def latest_verified(
    directory: str | os.PathLike, *, warn: bool = True, key: Any = None
) -> int | None:
    """The newest committed set in ``directory`` that verifies (with ``key``: that is signed
    with it), or ``None``.

    Every set passed over on the way is named in a :class:`SkippedCheckpointWarning` (with
    the member and the check), when ``warn``; sets removed meanwhile by another process are
    not, and the directory is listed again (:func:`newest_usable`).

    Raises:
        CheckpointError: ``key`` is not 32 bytes.
    """
    key = as_key(key)

    def verifies(step: int) -> None:
        with VerifiedSet.open(set_path(directory, step), key=key) as verified:
            verified.training_state()

    found = newest_usable(directory, verifies, (CheckpointError, OSError), warn=warn)
    return None if found is None else found[0]


def warn_skipped(step: int, exc: BaseException) -> None:
    """Warn that the set of ``step`` was passed over because of ``exc``."""
    check = getattr(exc, "check", None) or type(exc).__name__
    warnings.warn(
        f"checkpoint set of step {step} skipped: {exc} (check: {check})",
        SkippedCheckpointWarning,
        stacklevel=3,
    )
