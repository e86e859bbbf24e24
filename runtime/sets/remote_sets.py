"""Checkpoint sets on object storage, torch side: restoring a remote set (verified while it
is copied to a local staging folder, then restored from there all or nothing, as a local
set), the newest remote set that restores, and a remote directory's retention.

Writing goes through :func:`~.set_writing.open_set_writer`, which picks the remote writer
for a URL; the codec's :mod:`tlckpt.codec.sets.remote_set_writer` holds the protocol.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any

from ...codec.errors import CheckpointError
from ...codec.sets.remote_leases import remove_remote_set
from ...codec.sets.remote_overwrite import settle
from ...codec.sets.remote_set_reading import (
    remote_candidate_steps,
    remote_committed_steps,
    staged_set,
)
from ...codec.sets.remote_store import Store, join_url, open_store, split_url
from ...codec.sets.set_folders import SkippedCheckpointWarning, retention_victims
from ...codec.sets.set_keys import as_key
from ...formats.checkpoint_set import folder_name
from .set_restoring import Restored, Targets, restore_set

__all__ = ["remote_set_url", "restore_remote", "restore_remote_latest", "retain_remote"]


def remote_set_url(directory: str, step: int) -> str:
    """The URL of ``step``'s set under the directory URL ``directory``."""
    return join_url(directory, folder_name(step))


def restore_remote(
    url: str, targets: Targets, *, key: Any = None, storage_options: dict[str, Any] | None = None
) -> Restored:
    """Restore the remote set at ``url`` (an overwrite of it that a killed save left
    unfinished is rolled forward first): every member streamed by ranged reads, hashed as
    it arrives, compared with the manifest, into a local staging folder; then restored from
    it as a local set (verified again as the loads read it; nothing live changes before).

    Raises:
        IntegrityError, CheckpointError: the set does not verify or does not fit the
            objects; nothing live has changed.
        OSError: from the store or the local disk; nothing live has changed.
    """
    parent, name = split_url(url.rstrip("/"))
    # An overwrite of this set that a killed save committed (its intent) is finished
    # first; a store that fails here fails the staging next, with its own error.
    with contextlib.suppress(CheckpointError, OSError):
        settle(open_store(parent, storage_options), key=as_key(key), only=name)
    with staged_set(url, key=key, storage_options=storage_options) as local:
        return restore_set(local, targets, key=key)


def restore_remote_latest(
    root: Store, targets: Targets, *, key: Any = None, storage_options: dict[str, Any] | None = None
) -> Restored:
    """Restore the newest remote set under ``root`` that verifies, passing over (with a
    :class:`SkippedCheckpointWarning` naming it and why) every newer one that does not.

    Raises:
        CheckpointError: none verifies; or the newest that verifies does not fit the
            objects (an older one would not fit either).
    """
    for step in reversed(remote_candidate_steps(root)):
        url = root.url_of(folder_name(step))
        try:
            staging = staged_set(url, key=key, storage_options=storage_options)
            local = staging.__enter__()
        except (CheckpointError, OSError) as exc:
            check = getattr(exc, "check", None) or type(exc).__name__
            warnings.warn(
                f"checkpoint set of step {step} skipped: {exc} (check: {check})",
                SkippedCheckpointWarning,
                stacklevel=2,
            )
            continue
        try:
            return restore_set(local, targets, key=key)
        finally:
            staging.__exit__(None, None, None)
    raise CheckpointError(f"no checkpoint set in {root.url} verifies", path=root.url)


def retain_remote(
    root: Store, committed: int, keep_last: int | None, keep_every: int | None
) -> None:
    """Remove the remote sets the retention policy drops after ``committed`` (each one's
    manifest first).

    Raises:
        OSError: from the store.
    """
    steps = remote_committed_steps(root)
    for step in retention_victims(steps, keep_last, keep_every, committed):
        try:
            remove_remote_set(root, folder_name(step))
        except FileNotFoundError:
            continue  # removed meanwhile by another process
