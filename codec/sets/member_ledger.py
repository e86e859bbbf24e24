"""What a set's writer records of each member it wrote — file, family, version, and the
digesting writer that counted and hashed its bytes — shared by the local writer
(:class:`~.set_commit.SetWriter`) and the object-storage one
(:class:`~.remote_set_writer.RemoteSetWriter`), whose manifests record the same."""

from __future__ import annotations

from dataclasses import dataclass

from ..sniffing import head_family
from .set_digests import DigestingWriter
from .set_documents import MemberRecord

__all__ = ["MemberLedger", "WrittenMember"]


@dataclass
class WrittenMember:
    """A member as written: its file, family (``None``: named from its first bytes),
    version and the writer that digested it."""

    file: str
    family: str | None
    version: int
    writer: DigestingWriter


class MemberLedger:
    """The members a set's writer has written so far, by role."""

    members: dict[str, WrittenMember]

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
