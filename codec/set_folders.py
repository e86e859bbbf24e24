"""Checkpoint-set folders by name: the step's folder, listing the committed sets, reading a
set's manifest, and the retention policy (numpy-free, torch-free).
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..formats.checkpoint_set import (
    FOLDER_PATTERN,
    MANIFEST_FILE,
    MAX_MANIFEST_BYTES,
    STEP_MAX,
    folder_name,
)
from . import set_manifest_v2  # noqa: F401  (registers the version-2 manifest reader)
from .errors import CheckpointError, FileTooLargeError, IntegrityError
from .set_documents import Manifest, parse_manifest
from .set_keys import SetKey

__all__ = [
    "library_name",
    "check_step",
    "set_path",
    "read_manifest",
    "read_manifest_bytes",
    "committed_steps",
    "candidate_steps",
    "retention_victims",
]


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


def read_manifest(
    folder: str | os.PathLike, key: SetKey | None = None, *, authenticate: bool = True
) -> Manifest:
    """The checked manifest of the set in ``folder``.

    Args:
        folder: the set's folder.
        key, authenticate: as :func:`~.set_documents.parse_manifest`.

    Raises:
        IntegrityError: there is no manifest (the set was never committed), or (with
            ``authenticate``) the set does not authenticate with ``key``.
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
    none."""
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
            read_manifest(os.path.join(directory, name), authenticate=False)
        except (CheckpointError, OSError):
            continue
        steps.append(int(match.group(1)))
    return steps


def candidate_steps(directory: str | os.PathLike) -> list[int]:
    """Every ``step-…`` folder, committed or not (a folder without a manifest is named in a
    warning too: someone made or damaged it)."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted(int(m.group(1)) for m in map(FOLDER_PATTERN.fullmatch, names) if m)


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
