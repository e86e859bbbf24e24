"""A checkpoint set written to object storage, committed without a rename.

:class:`RemoteSetWriter` offers what :class:`~.set_commit.SetWriter` offers (members,
records, :meth:`~RemoteSetWriter.commit`, ``commit_v2``), for a set URL
``<directory URL>/step-<20 digits>`` (any name works, as locally). The protocol:

1. the save's lease is taken (:class:`~.remote_leases.Lease`): a set prefix has one save
   at a time, and a killed save's objects are recognisable by their prefix and dead lease;
2. each member is uploaded under the set's prefix as it streams
   (:func:`~.remote_upload.upload`: multipart with planned parts on S3), through a
   :class:`~.set_digests.DigestingWriter` — size and digest computed on the way, one pass;
3. every member is confirmed present with its size, the lease confirmed renewed, and the
   manifest written last, only if absent (S3: ``If-None-Match: *``, decided by the store):
   the commit point. A set prefix without a manifest is never a set;
4. the lease is removed, and what killed saves left in the directory is cleaned
   (:func:`~.remote_leases.clean_orphans`).

A failure at any step before 3 aborts the multipart upload in progress, removes the
members uploaded, releases the lease and raises: nothing is committed. An ``overwrite`` of
a committed set uploads the new set beside it and rolls forward from a durable intent
(:mod:`~.remote_overwrite`): killed at any moment, the step keeps the old set or the new.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ...formats.checkpoint_set import MANIFEST_FILE
from ..errors import CheckpointError
from .member_ledger import MemberLedger, WrittenMember
from .remote_leases import LEASE_FILE, LEASE_SECONDS, Lease, clean_orphans
from .remote_overwrite import roll_forward, settle, write_intent
from .remote_store import Store, open_store, split_url
from .remote_upload import upload
from .set_digests import DigestingWriter
from .set_folders import check_step
from .set_keys import as_key

__all__ = ["RemoteOptions", "RemoteSetWriter"]


@dataclass(frozen=True)
class RemoteOptions:
    """How remote sets are reached and leased.

    Attributes:
        storage_options: the fsspec filesystem's options (``None``: the defaults).
        lease_seconds: how long a save's lease lives unless renewed.
    """

    storage_options: dict[str, Any] | None = None
    lease_seconds: float = LEASE_SECONDS


class RemoteSetWriter(MemberLedger):
    """Writes one set to object storage (the protocol in the module docstring). Use it as a
    context manager: leaving the block without a commit removes what was uploaded.

    Args:
        url: the set's URL (``s3://bucket/run/step-…``).
        step: the set's step.
        overwrite: replace a committed set at ``url`` (rolled forward: see the module
            docstring).
        key: sign the set with this 32-byte key; ``None``: unsigned.
        storage_options: the fsspec filesystem's options (endpoint, credentials…).
        lease_seconds: how long the save's lease lives unless renewed
            (:data:`~.remote_leases.LEASE_SECONDS`).

    Raises:
        FileExistsError: a set exists at ``url`` and ``overwrite`` is false, or another
            save of it is in flight.
        CheckpointError: ``key`` is not 32 bytes.
        OSError: from the store.
    """

    def __init__(
        self,
        url: str,
        step: int,
        *,
        overwrite: bool = False,
        key: Any = None,
        storage_options: dict[str, Any] | None = None,
        lease_seconds: float = LEASE_SECONDS,
    ):
        self.key = as_key(key)
        self.step = check_step(step)
        self.overwrite = overwrite
        self.path = url.rstrip("/")
        parent, self.name = split_url(self.path)
        self.root: Store = open_store(parent, storage_options)
        self.set: Store = self.root.child(self.name)
        # Where members go: the set's prefix, or an overwrite's private one beside it.
        self.target: Store = self.set
        self.lease = Lease(self.set, lease_seconds)
        self.members: dict[str, WrittenMember] = {}
        self.committed = False
        self.leased = False

    def _refuse_existing(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.set.info(MANIFEST_FILE)
            raise FileExistsError(
                f"a checkpoint set exists at {self.path} already (pass overwrite=True to"
                " replace it)"
            )

    def __enter__(self) -> RemoteSetWriter:
        if not self.overwrite:
            self._refuse_existing()
        self.lease.take()
        self.leased = True
        try:
            # A killed overwrite of this set is finished first (its lease is now ours).
            roll_forward(self.root, self.name, key=self.key)
            try:
                self._refuse_existing()  # committed between the check and the lease
            except FileExistsError:
                if not self.overwrite:
                    raise
                pending = f"{self.name}.overwrite-{uuid.uuid4().hex}"
                self.target = self.root.child(pending)
            else:
                # What a killed save of this prefix left (its lease is now ours).
                self.set.delete([k for k in self.set.object_keys() if k != LEASE_FILE])
        except BaseException:
            self._release()
            raise
        return self

    @contextlib.contextmanager
    def member(
        self, role: str, file: str, version: int = 0, family: str | None = None
    ) -> Iterator[DigestingWriter]:
        """A digesting writer for member ``file``, uploaded as it streams; on clean exit
        the object is complete and the member recorded.

        Args:
            role, file, version, family: as :meth:`~.set_commit.SetWriter.member`.
        """
        with upload(self.target, file) as sink:
            writer = DigestingWriter(sink, self.key)
            yield writer
        self.members[role] = WrittenMember(file, family, version, writer)

    def _commit_manifest(self, data: bytes) -> str:
        for m in self.members.values():
            size = self.target.size(m.file)  # FileNotFoundError: removed under us
            if size != m.writer.size:
                raise OSError(
                    f"member {self.target.url_of(m.file)} has {size} bytes in the store,"
                    f" {m.writer.size} were uploaded; the save is not committed"
                )
        self.lease.check()
        self.target.create(MANIFEST_FILE, data)
        if self.target is not self.set:
            self.lease.check()
            _, pending = split_url(self.target.url)
            write_intent(self.root, self.name, pending)
            self.committed = True  # the intent is the commit point: never undone
            roll_forward(self.root, self.name, verify=False)
        self.committed = True
        # Housekeeping: the set is committed whatever happens here; what cannot be
        # cleaned now is cleaned by the next save.
        with contextlib.suppress(OSError, CheckpointError):
            clean_orphans(self.root, self.lease.now(), keep=self.name)
            settle(self.root, key=self.key, lease_seconds=self.lease.seconds)
        return self.path

    def _release(self) -> None:
        if self.leased:
            self.leased = False
            self.lease.release()

    def __exit__(self, *exc_info: object) -> None:
        try:
            if not self.committed:
                # Housekeeping only: the error that ended the save is what the caller must
                # see; objects that cannot be removed now go with the next save's cleaner.
                with contextlib.suppress(Exception):
                    self.target.delete([k for k in self.target.object_keys() if k != LEASE_FILE])
        finally:
            with contextlib.suppress(Exception):
                self._release()
            if not self.committed:
                with contextlib.suppress(Exception):
                    self.root.drop_empty(split_url(self.target.url)[1])
                with contextlib.suppress(Exception):
                    self.root.drop_empty(self.name)
