"""Checkpoint sets on object storage, read: listing, the manifest, members streamed by
ranged reads and hashed as they arrive, the newest set that verifies, and a set staged in a
local folder for the loads (which need files).

A member is read by one ranged request of exactly its recorded size on S3, consumed as it
streams in pieces of :data:`RANGE_BYTES` (elsewhere, one ranged read per piece); each piece
is hashed as it arrives (the set's digest: ``xxh3_128``, or keyed BLAKE3 for a signed set)
and, when staging, written to the local copy. A member whose size or digest differs from
the manifest's raises :class:`~..errors.IntegrityError` naming its URL, before any load has
read it. Reading
never holds more than a piece: sizes come from the manifest, bounded, and the store's own
size of each object must equal them first.
"""

from __future__ import annotations

import contextlib
import hmac
import os
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from ...formats.checkpoint_set import (
    FOLDER_PATTERN,
    MANIFEST_FILE,
    MAX_MANIFEST_BYTES,
    MAX_TRAINING_STATE_BYTES,
    STEP_MAX,
    folder_name,
)
from ..errors import CheckpointError, FileTooLargeError, IntegrityError
from .remote_store import Store, open_store, split_url
from .set_documents import Manifest, parse_manifest, parse_training_state
from .set_folders import SkippedCheckpointWarning
from .set_keys import SetKey, as_key, member_hash

__all__ = [
    "RANGE_BYTES",
    "remote_candidate_steps",
    "remote_committed_steps",
    "read_remote_manifest",
    "verify_remote",
    "remote_latest",
    "staged_set",
]

#: Bytes of one piece of a member, hashed and written as it arrives.
RANGE_BYTES = 16 << 20


def remote_candidate_steps(root: Store) -> list[int]:
    """Every ``step-…`` prefix under ``root``, committed or not, ascending."""
    steps = []
    for name in root.names():
        match = FOLDER_PATTERN.fullmatch(name)
        if match is not None and int(match.group(1)) <= STEP_MAX:
            steps.append(int(match.group(1)))
    return sorted(steps)


def read_remote_manifest(
    folder: Store, key: SetKey | None = None, *, authenticate: bool = True
) -> tuple[Manifest, bytes]:
    """The checked manifest of the set at ``folder`` and its bytes (as
    :func:`~.set_folders.read_manifest_bytes`).

    Raises:
        IntegrityError: there is no manifest (never committed, or no such set).
        FileTooLargeError: the manifest is larger than a manifest may be.
        CheckpointError: it is malformed, or of another step than the prefix's name.
    """
    url = folder.url_of(MANIFEST_FILE)
    try:
        size = folder.size(MANIFEST_FILE)
    except FileNotFoundError:
        raise IntegrityError(
            "the set has no manifest: it was never committed (or does not exist)",
            check="present",
            path=folder.url,
            field="manifest",
        ) from None
    if size > MAX_MANIFEST_BYTES:
        raise FileTooLargeError(
            f"the manifest has {size:,} bytes, more than the {MAX_MANIFEST_BYTES:,} a"
            " manifest may have",
            path=url,
            field="manifest",
            actual=size,
            expected=f"at most {MAX_MANIFEST_BYTES} bytes",
        )
    data = folder.read(MANIFEST_FILE, 0, size) if size else b""
    try:
        manifest = parse_manifest(data, MAX_MANIFEST_BYTES, key, authenticate=authenticate)
    except CheckpointError as exc:
        raise exc.with_path(url) from None
    match = FOLDER_PATTERN.fullmatch(split_url(folder.url)[1])
    if match is not None and int(match.group(1)) != manifest.step:
        raise IntegrityError(
            f"the manifest is of step {manifest.step}, the set of step {int(match.group(1))}",
            check="step",
            path=url,
            field="step",
            actual=manifest.step,
            expected=int(match.group(1)),
        )
    return manifest, data


def remote_committed_steps(root: Store) -> list[int]:
    """The steps of the committed sets under ``root`` (a manifest that parses; a signed one
    is not authenticated here), ascending."""
    steps = []
    for step in remote_candidate_steps(root):
        try:
            read_remote_manifest(root.child(folder_name(step)), authenticate=False)
        except (CheckpointError, OSError):
            continue
        steps.append(step)
    return steps


def _stream_member(
    folder: Store, role: str, record: Any, key: SetKey | None, out: BinaryIO | None
) -> bytes | None:
    """Read member ``role`` by ranges, hash it, write it to ``out`` (if given); compare
    size and digest with ``record``. Returns its bytes for the training state (parsed next).

    Raises:
        IntegrityError: missing, or another size or digest than the manifest's.
    """
    url = folder.url_of(record.file)
    try:
        size = folder.size(record.file)
    except FileNotFoundError:
        raise IntegrityError(
            f"member {role} ({record.file}) is missing",
            check="present",
            path=folder.url,
            field=f"members.{role}",
        ) from None
    if size != record.size:
        raise IntegrityError(
            f"member {role} ({record.file}) has {size} bytes, the manifest records {record.size}",
            check="size",
            path=url,
            field=f"members.{role}",
            actual=size,
            expected=record.size,
        )
    h = member_hash(key)
    kept = bytearray() if role == "training_state" and size <= MAX_TRAINING_STATE_BYTES else None
    got = 0
    for data in folder.stream(record.file, 0, size, RANGE_BYTES):
        h.update(data)
        if out is not None:
            out.write(data)
        if kept is not None:
            kept += data
        got += len(data)
    if got != size:  # the object changed (shrank) under us
        raise IntegrityError(
            f"member {role} ({record.file}) changed while it was read ({got} bytes read)",
            check="size",
            path=url,
            field=f"members.{role}",
            actual=got,
            expected=size,
        )
    digest = h.hexdigest()
    if not hmac.compare_digest(digest, record.digest):
        raise IntegrityError(
            f"member {role} ({record.file}): digest {digest} differs from the manifest's"
            f" {record.digest} (the object's bytes are damaged)",
            check="digest",
            path=url,
            field=f"members.{role}",
            actual=digest,
            expected=record.digest,
        )
    return None if kept is None else bytes(kept)


def _check_training_state(folder: Store, manifest: Manifest, data: bytes | None) -> None:
    if data is None:
        return
    record = manifest.members["training_state"]
    try:
        state = parse_training_state(data, MAX_TRAINING_STATE_BYTES)
    except CheckpointError as exc:
        raise exc.with_path(folder.url_of(record.file)) from None
    if state.step != manifest.step:
        raise CheckpointError(
            f"the training state is of step {state.step}, the set of step {manifest.step}",
            path=folder.url_of(record.file),
            field="step",
            actual=state.step,
            expected=manifest.step,
        )


def _fetch(folder: Store, key: SetKey | None, into: Path | None) -> Manifest:
    """Verify the set at ``folder`` by streaming every member; with ``into``, write the
    manifest and members there as they are read."""
    manifest, data = read_remote_manifest(folder, key)
    state = None
    for role, record in manifest.members.items():
        if "/" in record.file or record.file.startswith(".") or record.file == MANIFEST_FILE:
            raise IntegrityError(
                f"member {role} names no member file: {record.file!r}",
                check="file",
                path=folder.url_of(MANIFEST_FILE),
                field=f"members.{role}.file",
            )
        if into is None:
            got = _stream_member(folder, role, record, key, None)
        else:
            with open(into / record.file, "xb") as out:
                got = _stream_member(folder, role, record, key, out)
        state = got if role == "training_state" else state
    _check_training_state(folder, manifest, state)
    if into is not None:
        (into / MANIFEST_FILE).write_bytes(data)  # last: the local copy is whole
    return manifest


def verify_remote(
    url: str, *, key: Any = None, storage_options: dict[str, Any] | None = None
) -> Manifest:
    """Check the sizes and digests of a remote set's members (streamed, not stored), and
    its training state.

    Raises:
        IntegrityError, CheckpointError: as for a local set, naming the object's URL.
        OSError: from the store.
    """
    return _fetch(open_store(url, storage_options), as_key(key), None)


def remote_latest(root: Store, *, key: Any = None, warn: bool = True) -> int | None:
    """The newest committed set under ``root`` that verifies (sizes, digests, training
    state; with ``key``: authenticated), or ``None``; every newer one is passed over with a
    :class:`SkippedCheckpointWarning` naming it, the member and the check."""
    key = as_key(key)
    for step in reversed(remote_candidate_steps(root)):
        try:
            _fetch(root.child(folder_name(step)), key, None)
            return step
        except (CheckpointError, OSError) as exc:
            if warn:
                check = getattr(exc, "check", None) or type(exc).__name__
                warnings.warn(
                    f"checkpoint set of step {step} skipped: {exc} (check: {check})",
                    SkippedCheckpointWarning,
                    stacklevel=2,
                )
    return None


@contextlib.contextmanager
def staged_set(
    url: str, *, key: Any = None, storage_options: dict[str, Any] | None = None
) -> Iterator[Path]:
    """The remote set at ``url``, verified while it is copied into a local temporary
    folder of the same name (under ``TLCKPT_STAGING_DIR``, else the system's temporary
    folder), removed on exit. Loads read the local copy, which they verify again.

    Raises:
        IntegrityError, CheckpointError: the set does not verify (nothing is kept).
        OSError: from the store or the local disk.
    """
    parent = tempfile.mkdtemp(prefix="tlckpt-stage-", dir=os.environ.get("TLCKPT_STAGING_DIR"))
    try:
        name = split_url(url)[1]
        name = name if name and "/" not in name and name not in (".", "..") else "set"
        local = Path(parent) / name
        local.mkdir()
        _fetch(open_store(url, storage_options), as_key(key), local)
        yield local
    finally:
        shutil.rmtree(parent, ignore_errors=True)
