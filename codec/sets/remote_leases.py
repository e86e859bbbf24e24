"""Leases of remote saves, and the cleaner that removes what killed saves left.

A remote save takes a *lease* before it uploads anything: the object
``step-<20 digits>/.tlckpt-lease`` under the set's own prefix, created only if absent and
rewritten every third of :data:`LEASE_SECONDS` while the save lives. A killed save's objects
are recognised by their prefix (a ``step-…`` prefix) and its lease: one that was not
rewritten for its whole duration, by the store's own clock (the lease object's
last-modified time against that of the cleaner's own lease, written just before: never the
local clock, never a multipart upload's ``Initiated`` time, which moto reports as 2010 for
every upload). A live save's objects and uploads are never touched.

:func:`clean_orphans` (run by every remote save once it has committed, holding its own
lease) removes, in each ``step-…`` prefix whose lease is dead or absent: every object of a
prefix without a manifest (a killed save, or a killed removal), the dead lease of a committed
set, and every incomplete multipart upload; and every object and upload of an overwrite's
private prefix (``step-….overwrite-<token>``, :mod:`~.remote_overwrite`) whose set's lease
is dead and whose intent does not name it. :func:`remove_remote_set` removes a set's
pending overwrite's intent and then its manifest first, so that a removal killed midway
leaves an uncommitted prefix for the cleaner, never a committed set with missing members.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import threading
import time
import uuid

from ...formats.checkpoint_set import FOLDER_PATTERN, MANIFEST_FILE
from .remote_store import Store

__all__ = [
    "LEASE_FILE",
    "LEASE_SECONDS",
    "Lease",
    "lease_alive",
    "clean_orphans",
    "remove_remote_set",
    "INTENT_SUFFIX",
    "PENDING_PATTERN",
    "intended_pending",
]

#: The lease object's name in a set's prefix.
LEASE_FILE = ".tlckpt-lease"
#: How long a lease lives without being rewritten (seconds). A killed save's objects are
#: removed by the first save that commits this long after it died.
LEASE_SECONDS = 60.0
#: The coarsest clock a store dates objects by (S3's ``Last-Modified`` is to the second):
#: a lease is alive this much longer, so that truncated dates never judge it dead early.
CLOCK_RESOLUTION = 1.0
#: The most bytes of a lease read (it is a short JSON document).
_LEASE_BYTES = 4096
#: An overwrite's intent, beside the set: ``step-<20 digits>.overwrite`` (an object at the
#: directory's level, so that one listing finds every pending overwrite).
INTENT_SUFFIX = ".overwrite"
#: The private prefix an overwrite uploads its new set under, beside the set it replaces:
#: ``step-<20 digits>.overwrite-<token>``; never a set to listing or ``latest()``.
PENDING_PATTERN = re.compile(rf"({FOLDER_PATTERN.pattern})\.overwrite-([0-9a-f]{{32}})")


class Lease:
    """This save's lease on one set prefix (see the module docstring).

    Args:
        store: the set's prefix.
        seconds: how long the lease lives unless rewritten.
    """

    def __init__(self, store: Store, seconds: float = LEASE_SECONDS):
        self.store = store
        self.seconds = float(seconds)
        self.data = json.dumps(
            {
                "token": uuid.uuid4().hex,
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "seconds": self.seconds,
            }
        ).encode()
        self.renewed = 0.0  # time.monotonic() of the last write that succeeded
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def take(self) -> None:
        """Create the lease; a dead one (its save was killed) is taken over.

        Raises:
            FileExistsError: another save of this set is alive.
            OSError: from the store.
        """
        try:
            self.store.create(LEASE_FILE, self.data)
        except FileExistsError:
            if lease_alive(self.store, None):
                raise FileExistsError(
                    f"another save of {self.store.url} is in flight (its lease is alive)"
                ) from None
            self.store.delete([LEASE_FILE])
            self.store.create(LEASE_FILE, self.data)  # a second taker wins or we raise
        self.renewed = time.monotonic()
        self._thread = threading.Thread(target=self._renew, name="tlckpt-lease", daemon=True)
        self._thread.start()

    def _renew(self) -> None:
        while not self._stop.wait(self.seconds / 3):
            try:
                self.store.put(LEASE_FILE, self.data)
                self.renewed = time.monotonic()
            except Exception as exc:  # kept for check(): the save must not commit blind
                self.error = exc

    def check(self) -> None:
        """Raise unless the lease was rewritten recently enough that no cleaner may have
        judged it dead (two thirds of its life).

        Raises:
            OSError: it was not.
        """
        if time.monotonic() - self.renewed > self.seconds * 2 / 3:
            raise OSError(
                f"the lease on {self.store.url} could not be renewed in time"
                f" ({self.error or 'no answer'}); the save is not committed"
            )

    def now(self) -> float | None:
        """The store's clock now (this lease's last-modified time, rewritten just now)."""
        self.store.put(LEASE_FILE, self.data)
        self.renewed = time.monotonic()
        return self.store.modified(LEASE_FILE)

    def release(self) -> None:
        """Stop renewing and remove the lease."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.store.delete([LEASE_FILE])


def lease_alive(store: Store, now: float | None) -> bool:
    """Whether the lease in the prefix ``store`` is alive: rewritten within its duration
    before ``now`` (the store's clock; ``None``: the store's clock is taken from a probe
    object written next to it). A missing lease is dead; one whose time the store does not
    say is taken as alive (never removed: a weaker store keeps leftovers rather than
    removing a live save's objects). Both dates may be truncated to the store's clock
    resolution, so the lease counts as alive :data:`CLOCK_RESOLUTION` longer."""
    try:
        info = store.info(LEASE_FILE)
        modified = store.modified(LEASE_FILE)
        data = store.read(LEASE_FILE, 0, min(int(info["size"]), _LEASE_BYTES))
    except FileNotFoundError:
        return False
    try:
        seconds = float(json.loads(data)["seconds"])
    except (ValueError, KeyError, TypeError):
        seconds = LEASE_SECONDS
    if modified is None:
        return True
    if now is None:
        probe = f".tlckpt-probe-{uuid.uuid4().hex}"
        store.put(probe, b"")
        try:
            now = store.modified(probe)
        finally:
            store.delete([probe])
        if now is None:
            return True
    return modified + seconds + CLOCK_RESOLUTION >= now


def clean_orphans(root: Store, now: float | None, keep: str | None = None) -> list[str]:
    """Remove what killed saves and removals left under ``root`` (see the module
    docstring); never a prefix whose lease is alive, nor ``keep`` (the caller's own).

    Args:
        root: the checkpoint directory's store.
        now: the store's clock (:meth:`Lease.now`).
        keep: a prefix not to touch.

    Returns:
        The keys removed and the uploads aborted (``key#upload``).

    Raises:
        OSError: from the store.
    """
    done: list[str] = []
    uploads: dict[str, list[tuple[str, str]]] = {}
    for key, upload_id in root.uploads(""):
        uploads.setdefault(key.split("/")[0], []).append((key, upload_id))
    names = {n for n in root.names() if FOLDER_PATTERN.fullmatch(n) or PENDING_PATTERN.fullmatch(n)}
    for prefix in sorted(names | set(uploads)):
        pending = PENDING_PATTERN.fullmatch(prefix)
        owner = pending.group(1) if pending is not None else prefix
        if owner == keep or not FOLDER_PATTERN.fullmatch(owner):
            continue
        if lease_alive(root.child(owner), now):
            continue
        if pending is not None:
            # An overwrite's new set: kept while an intent names it (it is rolled
            # forward from there), else a killed overwrite's leftovers.
            if intended_pending(root, owner) == prefix:
                continue
            _abort_and_delete(root, prefix, uploads.get(prefix, []), done)
            continue
        folder = root.child(prefix)
        for key, upload_id in uploads.get(prefix, []):
            with contextlib.suppress(FileNotFoundError):  # ended meanwhile
                root.abort(key, upload_id)
            done.append(f"{key}#{upload_id}")
        keys = folder.object_keys()
        if MANIFEST_FILE in keys:
            doomed = [k for k in keys if k == LEASE_FILE]
        else:
            doomed = [k for k in keys if k != LEASE_FILE] + [k for k in keys if k == LEASE_FILE]
        folder.delete(doomed)
        root.drop_empty(prefix)
        done.extend(f"{prefix}/{k}" for k in doomed)
    return done


def intended_pending(root: Store, name: str) -> str | None:
    """The pending prefix that the overwrite intent of set ``name`` names (unchecked: see
    :func:`~.remote_overwrite.roll_forward`), or ``None`` if there is no readable intent.

    Raises:
        OSError: from the store.
    """
    try:
        data = root.read(name + INTENT_SUFFIX, 0, _LEASE_BYTES)
    except FileNotFoundError:
        return None
    try:
        return str(json.loads(data)["pending"])
    except (ValueError, KeyError, TypeError):
        return None


def _abort_and_delete(
    root: Store, prefix: str, uploads: list[tuple[str, str]], done: list[str]
) -> None:
    for key, upload_id in uploads:
        with contextlib.suppress(FileNotFoundError):  # ended meanwhile
            root.abort(key, upload_id)
        done.append(f"{key}#{upload_id}")
    keys = root.child(prefix).object_keys()
    root.child(prefix).delete(keys)
    root.drop_empty(prefix)
    done.extend(f"{prefix}/{k}" for k in keys)


def remove_remote_set(root: Store, name: str) -> None:
    """Remove the set ``name`` (a ``step-…`` prefix): its manifest first, then the rest.

    Raises:
        FileNotFoundError: there is no such set (no manifest).
        OSError: from the store.
    """
    folder = root.child(name)
    try:
        folder.info(MANIFEST_FILE)
    except FileNotFoundError:
        raise FileNotFoundError(f"no checkpoint set at {folder.url}") from None
    # A pending overwrite first (its new set is then an orphan for the cleaner): else it
    # would be rolled forward into the set removed here.
    root.delete([name + INTENT_SUFFIX])
    folder.delete([MANIFEST_FILE])
    folder.delete([k for k in folder.object_keys() if k != LEASE_FILE])
    root.drop_empty(name)
