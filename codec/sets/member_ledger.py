"""What a set's writer records of each member it wrote — file, family, version, and the
digesting writer that counted and hashed its bytes — shared by the local writer
(:class:`~.set_commit.SetWriter`) and the object-storage one
(:class:`~.remote_set_writer.RemoteSetWriter`), whose manifests record the same."""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..sniffing import head_family
from .set_digests import DigestingWriter
from .set_document_writing import build_manifest
from .set_documents import MemberRecord
from .set_folders import library_name
from .set_manifest_v2 import build_manifest_v2
from .set_manifest_v3 import build_manifest_v3

__all__ = ["MemberLedger", "WrittenMember"]


@dataclass
class WrittenMember:
    """A member as written: its file, family (``None``: named from its first bytes),
    version and the writer that digested it."""

    file: str
    family: str | None
    version: int
    writer: DigestingWriter


class MemberLedger(abc.ABC):
    """The members a set's writer has written so far, by role, and the manifests built from
    them: a writer (local or remote) provides ``step``, ``key`` and ``_commit_manifest``,
    which writes a manifest's bytes as its commit point."""

    members: dict[str, WrittenMember]
    step: int
    key: Any

    @abc.abstractmethod
    def _commit_manifest(self, data: bytes) -> Any:
        """Write ``data`` as the manifest, the set's commit point (locally: then the rename;
        on object storage: a create-only put), and return where the set is."""

    def commit(self, state: Sequence[tuple[str, Sequence[int]]], world_size: int = 1) -> Any:
        """Write the manifest: the set is committed.

        Args:
            state: the model's ``(name, shape)`` in file order.
            world_size: how many processes saved the set.

        Returns:
            The set's folder (a URL, for object storage).

        Raises:
            FileExistsError: a set of this step was committed meanwhile (no ``overwrite``).
            OSError: from the file system or store; nothing is committed (locally, an error
                after the new set is in place — the folder's ``fsync`` — leaves it committed).
        """
        data = build_manifest(
            self.step, library_name(), self.records(), state, world_size, self.key
        )
        return self._commit_manifest(data)

    def commit_v2(
        self,
        structure: dict[str, Any],
        details: dict[str, dict[str, Any]],
        world_size: int = 1,
    ) -> Any:
        """:meth:`commit` with a version-2 manifest (:mod:`.set_manifest_v2`).

        Args:
            structure: role → ``(kind, keys)`` or ``None``.
            details: member role → the version-2 fields of its record (``tensors`` and
                ``tied`` of a model, ``models`` and ``groups`` of an optimizer).
            world_size: how many processes saved the set.

        Raises:
            As :meth:`commit`.
        """
        records = {
            role: replace(record, **details.get(role, {}))
            for role, record in self.records().items()
        }
        data = build_manifest_v2(
            self.step, library_name(), records, structure, world_size, self.key
        )
        return self._commit_manifest(data)

    def commit_state_tree(self, tensors: Sequence[tuple[str, Sequence[int]]]) -> Any:
        """:meth:`commit` with a version-3 manifest (a set of one state tree,
        :mod:`.set_manifest_v3`): members ``state`` and ``training_state``.

        Args:
            tensors: the tree member's tensors ``(name, shape)``, in file order.

        Raises:
            As :meth:`commit`.
        """
        records = self.records()
        tree = records["state"]
        records["state"] = replace(tree, tensors=tuple((n, tuple(s)) for n, s in tensors), tied={})
        data = build_manifest_v3(self.step, library_name(), records, 1, self.key)
        return self._commit_manifest(data)

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
