"""What the readers of both optimizer families (``TLADAMF`` and ``TLCKOPT``) share.

Both walk a file whose top level holds a header, TorchLean's schema blocks and an array of
entries, each entry keyed by its slot ``id`` and carrying that slot's element ``count`` and
moment payloads. :class:`OptimizerReader` sends the schema blocks' fields to the shared schema
check, the entries' fields and the header's to the family's own rules, holds every entry's
``count`` to its slot, and puts each payload where the caller asked. The readers are
:mod:`.adam` and :mod:`.tlckpt_optimizer`.
"""

from __future__ import annotations

import abc
from typing import Any

import numpy as np
from construct import Container

from ...formats import registry
from ..errors import EntryError, differs
from ..paths import Path
from ..spec.schema_check import SCHEMA_BLOCKS, SchemaVisitorMixin
from ..spec.walker import Visitor
from ..values.payload_sinks import PayloadSink
from ..values.schema import ParameterSchema

__all__ = ["OptimizerReader"]


class OptimizerReader(SchemaVisitorMixin, Visitor, abc.ABC):
    """A visitor that checks an optimizer file field by field, as it is decoded.

    A family's reader names its entries array (``entries_field``, a top-level field name),
    calls :meth:`init_reader` from its ``__init__``, and implements :meth:`header_field` and
    :meth:`entry_field`.

    Attributes:
        version: the file's version.
        sink: where payloads go (``None``: fresh numpy arrays).
        skip_payloads: whether payloads are skipped, not read (``inspect``, ``validate``).
        random_counter: the stored counter, once read (``None``: none).
        payload_bytes: bytes of each entry's payloads as the spec sized them, by slot (when
            payloads are skipped).
        payload_offsets: each payload's position in the file, by slot and field (when
            payloads are skipped: a load reading them by position afterwards).
    """

    entries_field: str

    def init_reader(
        self,
        spec: registry.FileSpec,
        schema: ParameterSchema | None,
        sink: PayloadSink | None,
        skip_payloads: bool,
    ) -> None:
        """Set the state every optimizer reader keeps (``schema``: the destination's, or
        ``None`` to check the file against its own stored schema)."""
        self.version = spec.version
        self.sink = sink
        self.skip_payloads = skip_payloads
        self.random_counter: int | None = None
        self.payload_bytes: dict[int, int] = {}
        self.payload_offsets: dict[tuple[int, str], int] = {}
        self.init_schema_check(schema)

    def on_field(self, path: Path, value: Any, offset: int, ctx: Container) -> None:
        head = path[0]
        if head in SCHEMA_BLOCKS:
            self.check_schema_field(path, value, offset, ctx)
        elif head == self.entries_field:
            self.entry_field(path, value, offset, ctx)
        else:
            self.header_field(path, value, offset, ctx)

    @abc.abstractmethod
    def header_field(self, path: Path, value: Any, offset: int, ctx: Container) -> None:
        """A field outside the schema blocks and the entries, at any depth; raise to reject."""

    @abc.abstractmethod
    def entry_field(self, path: Path, value: Any, offset: int, ctx: Container) -> None:
        """The entries array, a whole entry, or one of an entry's fields; raise to reject."""

    def check_entry_count(self, path: Path, value: int, offset: int, ctx: Container) -> None:
        """Hold an entry's ``count`` to the element count of its slot (``ctx.id``, checked).

        Raises:
            EntryError: the counts differ.
        """
        want = self.schema.element_count(ctx.id)
        if value != want:
            message = f"entry for slot {ctx.id} has {value} elements, the slot has {want}"
            raise differs(EntryError, message, offset, path, value, want)

    def payload_buffer(
        self, path: Path, count: int, dtype: np.dtype, ctx: Container, offset: int
    ) -> Any:
        if self.skip_payloads:
            slot = int(ctx.id)
            self.payload_bytes[slot] = self.payload_bytes.get(slot, 0) + count * dtype.itemsize
            self.payload_offsets[(slot, path[-1])] = offset
            return None
        if self.sink is not None:
            return self.sink.buffer(int(ctx.id), path[-1], count, dtype)
        return np.empty(count, dtype=dtype)

    def payload_done(self, path: Path, buffer: Any, ctx: Container) -> Any:
        if self.sink is not None:
            return self.sink.done(int(ctx.id), path[-1], buffer)
        return buffer
