"""Overwriting a committed set on object storage without ever losing the step.

Object stores have no rename, so the local exchange is not available. An overwrite of a
committed set ``step-N`` rolls forward instead:

1. the new set (members, then its manifest) is uploaded under a private prefix beside it,
   ``step-N.overwrite-<token>`` (:data:`~.remote_leases.PENDING_PATTERN`), which listing and
   ``latest()`` never take for a set; the old set is untouched;
2. once every new member is uploaded and confirmed, the *intent* ``step-N.overwrite``
   (an object beside the set, naming the pending prefix) is written: the commit point;
3. :func:`roll_forward` replaces: removes ``step-N``'s manifest (so no half-replaced set is
   ever committed), copies each pending member over ``step-N``'s objects (server-side),
   writes ``step-N``'s manifest, then removes the intent and the pending prefix.

A save killed before the intent leaves the old set whole (the pending objects are orphans
for :func:`~.remote_leases.clean_orphans`). One killed after it leaves the new set whole
under the pending prefix: the next save, manager or restore on the directory rolls it
forward (:func:`settle`), the pending members verified against their manifest first.
Every step is idempotent, so a roll-forward killed midway is finished by the next one; it
runs only under the set's lease, so two never race.
"""

from __future__ import annotations

import contextlib
import json

from ...formats.checkpoint_set import FOLDER_PATTERN, MANIFEST_FILE
from ..errors import CheckpointError
from .remote_leases import (
    INTENT_SUFFIX,
    LEASE_FILE,
    LEASE_SECONDS,
    PENDING_PATTERN,
    Lease,
    intended_pending,
)
from .remote_set_reading import _fetch, read_remote_manifest
from .remote_store import Store
from .set_keys import SetKey

__all__ = ["write_intent", "roll_forward", "settle"]


def write_intent(root: Store, name: str, pending: str) -> None:
    """Write the intent of set ``name``'s overwrite by the set under ``pending`` (every
    member and the manifest of which are in the store): the overwrite's commit point.

    Raises:
        OSError: from the store (then nothing is committed).
    """
    root.put(name + INTENT_SUFFIX, json.dumps({"pending": pending}).encode())


def roll_forward(root: Store, name: str, *, verify: bool = True, key: SetKey | None = None) -> bool:
    """Finish the overwrite of set ``name`` that its intent names, if there is one (the
    caller holds the set's lease).

    Args:
        root: the checkpoint directory's store.
        name: the set's prefix (``step-…``).
        verify: first check the pending set's members against its manifest (sizes and
            digests); the writer that uploaded them a moment ago has checked their sizes.
        key: the key of a signed set (for ``verify``).

    Returns:
        Whether an overwrite was rolled forward.

    Raises:
        CheckpointError: the pending set does not verify (nothing is changed: the set
            ``name`` keeps whatever it holds, and the intent stays for a later try).
        OSError: from the store; what is done stays, the next roll-forward finishes it.
    """
    pending_name = intended_pending(root, name)
    if pending_name is None:
        return False
    pending = root.child(pending_name)
    match = FOLDER_PATTERN.fullmatch(name)
    own = PENDING_PATTERN.fullmatch(pending_name)
    if match is None or own is None or own.group(1) != name:
        # A damaged or hostile intent: never copy another prefix over a set.
        raise CheckpointError(
            f"the overwrite intent of {name} names {pending_name!r}, not a pending set of it",
            path=root.url_of(name + INTENT_SUFFIX),
        )
    if verify:
        _fetch(pending, key, None)
    manifest, data = read_remote_manifest(pending, key, authenticate=verify)
    if manifest.step != int(match.group(1)):
        raise CheckpointError(
            f"the pending overwrite {pending.url} is of step {manifest.step}, not the set {name}'s",
            path=pending.url,
        )
    members = sorted({record.file for record in manifest.members.values()})
    for member in members:
        if "/" in member or member.startswith(".") or member == MANIFEST_FILE:
            raise CheckpointError(
                f"the pending overwrite {pending.url} names no member file: {member!r}",
                path=pending.url_of(MANIFEST_FILE),
            )
    target = root.child(name)
    # The manifest first: from here until the new one is written the step has no
    # committed set (latest() passes it over), never a manifest naming other bytes.
    target.delete([MANIFEST_FILE])
    target.delete([k for k in target.object_keys() if k not in members and k != LEASE_FILE])
    for member in members:
        target.copy_from(pending, member)
        if target.size(member) != pending.size(member):
            raise OSError(f"copying {pending.url_of(member)} to {target.url_of(member)} failed")
    target.put(MANIFEST_FILE, data)
    root.delete([name + INTENT_SUFFIX])
    pending.delete(pending.object_keys())
    root.drop_empty(pending_name)
    return True


def settle(
    root: Store,
    *,
    key: SetKey | None = None,
    lease_seconds: float = LEASE_SECONDS,
    only: str | None = None,
) -> list[str]:
    """Roll forward every overwrite under ``root`` that a killed save left committed (an
    intent) but unfinished, each under its set's lease; one whose lease is alive is its
    own live save's to finish, and is left alone.

    Args:
        root: the checkpoint directory's store.
        key: the key of signed sets (the pending members are verified with it).
        lease_seconds: how long the leases taken here live unless renewed.
        only: settle this set (a ``step-…`` name) alone.

    Returns:
        The sets rolled forward.

    Raises:
        CheckpointError: a pending set does not verify (it stays as it is).
        OSError: from the store.
    """
    done = []
    for intent in root.names():
        name = intent[: -len(INTENT_SUFFIX)]
        if not intent.endswith(INTENT_SUFFIX) or FOLDER_PATTERN.fullmatch(name) is None:
            continue
        if only is not None and name != only:
            continue
        lease = Lease(root.child(name), lease_seconds)
        try:
            lease.take()
        except FileExistsError:
            continue  # a live save of that set: it finishes its own overwrite
        try:
            if roll_forward(root, name, key=key):
                done.append(name)
        finally:
            with contextlib.suppress(OSError):
                lease.release()
    return done
