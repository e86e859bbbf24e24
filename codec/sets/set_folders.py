"""Checkpoint-set folders by name: the step's folder, listing the committed sets, reading a
set's manifest, and the retention policy (torch-free).
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ...formats.checkpoint_set import (
    FOLDER_PATTERN,
    MANIFEST_FILE,
    MAX_MANIFEST_BYTES,
    STEP_MAX,
    folder_name,
)
from ..errors import CheckpointError, FileTooLargeError, IntegrityError
from ..fileio.source import file_kind, open_regular
from . import (
    set_manifest_v2,  # noqa: F401  (registers the version-2 manifest reader)
    set_manifest_v3,  # noqa: F401  (registers the version-3 manifest reader)
)
from .set_documents import Manifest, parse_manifest
from .set_keys import SetKey

__all__ = [
    "SkippedCheckpointWarning",
    "library_name",
    "check_step",
    "set_path",
    "read_manifest",
    "read_manifest_bytes",
    "not_regular_member",
    "committed_steps",
    "scan_sets",
    "candidate_steps",
    "retention_victims",
]


class SkippedCheckpointWarning(UserWarning):
    """A checkpoint set was passed over because it does not verify (the message names the
    set, the member and the check that failed), or an entry named like a set is not one
    (the message names it)."""


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


def not_regular_member(role: str, file: str) -> Any:
    """The ``refuse`` of :func:`~.source.open_regular` for a set's ``file`` (its member
    ``role``, or ``"manifest"``): an :class:`IntegrityError` naming it (``check="regular
    file"``) — a FIFO or a device in a set was put there by someone, and would block or
    never end."""

    def refuse(path: str, kind: str) -> CheckpointError:
        what = "the manifest" if role == "manifest" else f"member {role} ({file})"
        return IntegrityError(
            f"{what} is not a regular file ({kind})",
            check="regular file",
            path=path,
            field="manifest" if role == "manifest" else f"members.{role}",
            actual=kind,
            expected="a regular file",
        )

    return refuse


def _read_bounded(path: str, limit: int, what: str) -> bytes:
    with open_regular(path, not_regular_member(what, os.path.basename(path))) as f:
        size = os.fstat(f.fileno()).st_size
        if size > limit:
            raise FileTooLargeError(
                f"the {what} has {size:,} bytes, more than the {limit:,} a {what} may have",
                path=path,
                field=what,
                actual=size,
                expected=f"at most {limit} bytes",
            )
        # Ask for what the file holds, never for the limit: a read of ``limit + 1`` bytes
        # would allocate that much for a small file. A file that grows while it is read is
        # read on in bounded chunks until its end or the limit (the caller refuses more).
        chunks = [f.read(size + 1)]
        total = len(chunks[0])
        while total > size and total <= limit:
            chunk = f.read(min(1 << 20, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        return b"".join(chunks)


def read_manifest(
    folder: str | os.PathLike, key: SetKey | None = None, *, authenticate: bool = True
) -> Manifest:
    """The checked manifest of the set in ``folder``.

    Args:
        folder: the set's folder.
        key, authenticate: as :func:`~.set_documents.parse_manifest`.

    Raises:
        IntegrityError: the folder does not exist, or there is no manifest (the set was
            never committed), or it is not a regular file (a FIFO, a device: refused before
            a byte is read), or (with ``authenticate``) the set does not authenticate with
            ``key``.
        CheckpointError: the manifest is malformed (the subclass says how), or its step is
            not the folder's.
    """
    return read_manifest_bytes(folder, key, authenticate=authenticate)[0]


def read_manifest_bytes(
    folder: str | os.PathLike, key: SetKey | None = None, *, authenticate: bool = True
) -> tuple[Manifest, bytes]:
    """:func:`read_manifest`, and the very bytes it parsed (what a signed set's MAC was
    checked over: passed on, they need no second check).

    Raises:
        As :func:`read_manifest`.
    """
    folder = os.fspath(folder)
    path = os.path.join(folder, MANIFEST_FILE)
    try:
        data = _read_bounded(path, MAX_MANIFEST_BYTES, "manifest")
    except FileNotFoundError:
        if not os.path.lexists(folder):
            raise IntegrityError(
                "no such checkpoint set: the folder does not exist",
                check="present",
                path=folder,
            ) from None
        raise IntegrityError(
            "the set has no manifest: it was never committed",
            check="present",
            path=folder,
            field="manifest",
        ) from None
    try:
        manifest = parse_manifest(data, MAX_MANIFEST_BYTES, key, authenticate=authenticate)
    except CheckpointError as exc:
        raise exc.with_path(path) from None
    match = FOLDER_PATTERN.fullmatch(os.path.basename(os.path.abspath(folder)))
    if match is not None and int(match.group(1)) != manifest.step:
        # A signed manifest is authentic here: it was copied from another step's set.
        error = CheckpointError if manifest.key_id is None else IntegrityError
        kwargs = {} if manifest.key_id is None else {"check": "step"}
        raise error(
            f"the manifest is of step {manifest.step}, the folder of step {int(match.group(1))}",
            path=path,
            field="step",
            actual=manifest.step,
            expected=int(match.group(1)),
            **kwargs,
        )
    return manifest, data


def committed_steps(directory: str | os.PathLike) -> list[int]:
    """The steps of the committed sets in ``directory`` (a ``step-…`` folder whose manifest
    parses; a signed one is not authenticated here), ascending. A missing directory has
    none; entries that are not sets are named in a warning (:func:`candidate_steps`)."""
    steps = []
    for step in candidate_steps(directory):
        try:
            read_manifest(set_path(directory, step), authenticate=False)
        except (CheckpointError, OSError):
            continue
        steps.append(step)
    return steps


def scan_sets(directory: str | os.PathLike) -> tuple[list[int], list[tuple[str, str]]]:
    """Every ``step-…`` folder of ``directory``, committed or not, and the entries named like
    one that are not (a step above 2**64 - 1, a regular file, a FIFO): someone put them there.

    Args:
        directory: a checkpoint directory.

    Returns:
        The folders' steps, ascending (none for a missing directory), and each stray entry's
        name and what it is, by name.

    Raises:
        OSError: the directory cannot be listed (other than missing).
    """
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        return [], []
    steps, strays = [], []
    for entry in sorted(entries, key=lambda e: e.name):
        match = FOLDER_PATTERN.fullmatch(entry.name)
        if match is None:
            continue
        step = int(match.group(1))
        if step > STEP_MAX:
            strays.append((entry.name, "its step is above 2**64 - 1"))
            continue
        try:
            # A symlink is judged by what it points to: that is what a reader would open.
            is_folder = entry.is_dir()
            kind = "a folder" if is_folder else file_kind(entry.stat().st_mode)
        except OSError as exc:  # vanished, or a dangling symlink
            is_folder, kind = False, f"unreadable ({exc.strerror or exc})"
        if not is_folder:
            strays.append((entry.name, f"it is {kind}, not a folder"))
            continue
        steps.append(step)
    return steps, strays


def candidate_steps(directory: str | os.PathLike) -> list[int]:
    """Every ``step-…`` folder, committed or not, ascending (a folder without a manifest is
    named in a warning too: someone made or damaged it). An entry named like a set that is
    not one (:func:`scan_sets`) is passed over with a :class:`SkippedCheckpointWarning`
    naming it, never fatal."""
    steps, strays = scan_sets(directory)
    for name, why in strays:
        warnings.warn(
            f"{os.path.join(os.fspath(directory), name)} is not a checkpoint set ({why}); skipped",
            SkippedCheckpointWarning,
            stacklevel=2,
        )
    return steps


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
