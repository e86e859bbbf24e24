"""Streaming parse of a spec, field by field, through its compiled plan: the readers' half.

A spec is an ordinary construct ``Struct``. :func:`parse` executes the plan :mod:`.plan`
derives from it instead of handing the whole file to construct, so that

* payloads (:class:`~tlckpt.formats.primitives.Payload`) stream between the file and caller
  buffers with ``readinto`` / ``write(memoryview)`` and never pass through construct;
* arrays of records are visited one record at a time and not accumulated;
* before any array or payload whose length comes from the file, its minimum byte size is
  checked against the bytes actually left;
* every field's byte offset and spec path is known, so errors are precise, and a visitor can
  check each value against the destination the moment it is read;
* runs of fixed scalar fields are decoded with one precompiled ``struct`` call; whenever a
  run fails (a check, or too few bytes), it is re-parsed with construct's interpreted parser
  to produce the exact error;
* a visitor that skips an array's payloads may take its records in batches: runs of records
  that lay out alike, checked at once from an in-memory chunk (:mod:`.batches`); every other
  record, and every record of a batch the visitor declines, is walked as above.

Under :func:`interpreted` neither precompiled structs nor batches are used. The writers' half,
:func:`build`, is :mod:`.builder` (re-exported here).
"""

from __future__ import annotations

import io
import struct
from typing import Any, Protocol, runtime_checkable

import numpy as np
from construct import ConstructError, Container, Struct
from construct.core import evaluate

from ..errors import CheckpointError, MalformedError, from_construct
from ..fileio.gcpause import gc_paused
from ..fileio.source import Source
from ..paths import Path, field_name
from .batches import ChunkWindow, RecordBatch, batchable, scan_batch
from .header_scan import Headers, scan_decoded
from .plan import (
    Branch,
    Nested,
    PayloadStep,
    Records,
    Run,
    U64Array,
    checks_pass,
    child_context,
    compile_struct,
    fast_path,
    fixed_size,
    header_format,
)

__all__ = ["Visitor", "VisitorProtocol", "parse"]

#: Fewest alike records handed to a visitor as one batch; shorter runs are walked.
MIN_BATCH = 16
#: Most records walked one at a time between two attempts at a batch.
MAX_PAUSE = 1024


@runtime_checkable
class VisitorProtocol(Protocol):
    """The hooks :func:`parse` calls, with the exact signatures it calls them with.

    :class:`Visitor` is the default implementation (its docstrings say when each hook is
    called); a visitor subclasses it. The walker passes every argument by position; the
    parameter names here are the contract all visitors share. Tests check that the walker
    calls no other visitor method and that every visitor class of the package and of the
    fuzzing harness has these signatures, so that a hook that drifts fails loudly instead of
    raising a ``TypeError`` deep inside a parse.
    """

    def on_field(self, path: Path, value: Any, offset: int, ctx: Container) -> None:
        """Called after each named field (at any depth) is decoded; raise to reject."""
        ...

    def payload_buffer(
        self, path: Path, count: int, dtype: np.dtype, ctx: Container, offset: int
    ) -> Any | None:
        """A writable C-contiguous buffer for the payload at byte ``offset``, or ``None``."""
        ...

    def payload_done(self, path: Path, buffer: Any, ctx: Container) -> Any:
        """Called once ``buffer`` is filled; the result is stored as the field's value."""
        ...

    def record_template(self, path: Path, index: int) -> dict[str, Any] | None:
        """The values record ``index`` of the array at ``path`` must have, or ``None``."""
        ...

    def batches(self, path: Path) -> bool:
        """Whether the array of records at ``path`` may reach ``on_records`` in batches."""
        ...

    def on_records(self, path: Path, batch: RecordBatch) -> bool:
        """Take ``batch.count`` records of the array at ``path`` at once; ``True`` if taken."""
        ...


class Visitor(VisitorProtocol):
    """Hooks the walker calls while parsing; subclass to check and collect.

    The default implementation of :class:`VisitorProtocol`: it accepts everything and
    allocates a fresh numpy array per payload.
    """

    def on_field(self, path: Path, value: Any, offset: int, ctx: Container) -> None:
        """Called after each named field (at any depth) is decoded; raise to reject."""

    def payload_buffer(
        self, path: Path, count: int, dtype: np.dtype, ctx: Container, offset: int
    ) -> Any | None:
        """A writable C-contiguous buffer of ``count`` ``dtype`` elements, or ``None`` to skip
        the payload (its size has already been checked against the bytes left). ``offset``
        is the payload's position in the file."""
        return np.empty(count, dtype=dtype)

    def payload_done(self, path: Path, buffer: Any, ctx: Container) -> Any:
        """Called once ``buffer`` is filled; the result is stored as the field's value."""
        return buffer

    def record_template(self, path: Path, index: int) -> dict[str, Any] | None:
        """The values a record's header fields must have, when the destination says so.

        If given, the walker compares the file's header bytes with these values packed by the
        spec's own plan, and on a match takes them without decoding or visiting each field
        (``on_field`` is not called for them; the record's own ``on_field`` still is). On a
        mismatch it decodes the header field by field as usual, so errors stay exact. Values
        must satisfy the spec's checks (the destination's own shapes do).
        """
        return None

    def batches(self, path: Path) -> bool:
        """Whether the array of records at ``path`` may reach :meth:`on_records` in batches.

        Only for visitors that skip that array's payloads: a batch's payloads are not read,
        and ``payload_buffer`` is not asked about them. The walker then keeps no value per
        record for that array (its value is the record count, as for streamed arrays).
        """
        return False

    def on_records(self, path: Path, batch: RecordBatch) -> bool:
        """Take ``batch.count`` records of the array at ``path`` at once; ``True`` if taken.

        The batch's records passed every check of the spec. Check them against the
        visitor's own rules in bulk and return ``True`` to take them: neither ``on_field``
        nor ``payload_buffer`` is then called for them. Return ``False``, having changed
        nothing, to have them walked one at a time instead — the way to the exact error of
        a record that breaks a rule.
        """
        return False


def _batch_end(batch: RecordBatch) -> int:
    """The position right after a batch's last record."""
    if batch.layouts is not None and batch.kinds is not None and batch.starts is not None:
        return int(batch.starts[-1]) + batch.layouts[batch.kinds[-1]].stride
    return batch.offset + batch.count * batch.stride


def _count(value: Any, path: Path, offset: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise MalformedError(
            f"invalid count {value!r}", offset=offset, field=field_name(path), actual=value
        )
    return value


class _Parser:
    def __init__(self, source: Source, visitor: Visitor):
        self.src = source
        self.visitor = visitor
        self.on_field = visitor.on_field
        self.fast = fast_path()
        # Packed headers by template object: visitors hand out one dict per distinct header.
        self.headers: dict[int, tuple[dict, bytes | None]] = {}

    def struct(
        self,
        st: Struct,
        steps: tuple,
        parent: Container,
        path: Path,
        known: dict[str, Any] | None = None,
        start: int = 0,
    ) -> Container:
        ctx = child_context(st, parent, parsing=True)
        obj = Container()
        if known:
            obj.update(known)
            ctx.update(known)
        on_field = self.on_field
        src = self.src
        for step in steps[start:] if start else steps:
            if type(step) is Run:
                if self.fast:
                    self.run(step, ctx, obj, path)
                else:
                    self.interpret(step, 0, ctx, obj, path)
                continue
            offset = src.pos
            name = step.name
            sub = (*path, name) if name else path
            value = self.value(step, ctx, sub)
            if name:
                obj[name] = value
                ctx[name] = value
                on_field(sub, value, offset, ctx)
        return obj

    def run(self, step: Run, ctx: Container, obj: Container, path: Path) -> None:
        src = self.src
        start = src.pos
        if step.codec.size > src.remaining:
            self.diagnose(step, 0, start, ctx, obj, path)
        values = step.codec.unpack(src.read(step.codec.size, path))
        offset = start
        for k, value in enumerate(values):
            if step.checks[k] and not checks_pass(step.checks[k], value, ctx):
                src.seek(offset)
                self.diagnose(step, k, offset, ctx, obj, path)
            name = step.names[k]
            if name:
                obj[name] = value
                ctx[name] = value
                self.on_field((*path, name), value, offset, ctx)
            offset += step.sizes[k]

    def header_matches(self, item: Nested, prefix: int, known: dict[str, Any]) -> bool:
        """Whether the next bytes are exactly the header ``known`` packs to; rewinds if not."""
        cached = self.headers.get(id(known))
        if cached is not None and cached[0] is known:
            expected = cached[1]
        else:
            fmt, flat = header_format(item.steps[:prefix], known)
            try:
                expected = struct.pack(fmt, *flat)
            except struct.error:
                expected = None
            self.headers[id(known)] = (known, expected)
        src = self.src
        if expected is None or len(expected) > src.remaining:
            return False
        start = src.pos
        if src.read(len(expected), "record header") == expected:
            return True
        src.seek(start)
        return False

    def diagnose(
        self, step: Run, first: int, offset: int, ctx: Container, obj: Container, path: Path
    ) -> None:
        """Re-parse a failed run from field ``first`` with construct; raises the exact error."""
        self.interpret(step, first, ctx, obj, path)
        raise CheckpointError(  # pragma: no cover - the two parsers disagree: a bug here
            f"internal error: fast and interpreted parsers disagree at byte {offset}",
            offset=offset,
            field=field_name(path),
        )

    def interpret(self, step: Run, first: int, ctx: Container, obj: Container, path: Path) -> None:
        """Parse a run's fields from ``first`` on, one by one, with construct itself."""
        for k in range(first, len(step.names)):
            name = step.names[k]
            sub = (*path, name) if name else path
            at = self.src.pos
            value = self.leaf(step.subcons[k], ctx, sub)
            if name:
                obj[name] = value
                ctx[name] = value
                self.on_field(sub, value, at, ctx)

    def value(self, step: Any, ctx: Container, path: Path) -> Any:
        t = type(step)
        src = self.src
        if t is Nested:
            return self.struct(step.struct, step.steps, ctx, path)
        if t is U64Array:
            count = _count(evaluate(step.count, ctx), path, src.pos)
            data = src.read(count * step.itemsize, path)
            return list(struct.unpack(f"{step.order}{count}{step.code}", data))
        if t is Records:
            count = _count(evaluate(step.count, ctx), path, src.pos)
            src.need(count * step.min_size, path)
            if self.fast and count >= MIN_BATCH and self.visitor.batches(path) and batchable(step):
                return self.batched(step, count, ctx, path)
            template = self.visitor.record_template if step.prefix and self.fast else None
            out = []
            for i in range(count):
                value = self.record(step, i, ctx, path, template)
                if not step.streamed:
                    out.append(value)
            return count if step.streamed else out
        if t is PayloadStep:
            return self.payload(step, ctx, path)
        if t is Branch:
            chosen = step.then if evaluate(step.cond, ctx) else step.otherwise
            return self.value(chosen, ctx, path)
        return self.leaf(step.subcon, ctx, path)

    def record(
        self, step: Records, i: int, ctx: Container, path: Path, template: Any = None
    ) -> Any:
        """Record ``i`` of an array, at the source's position; visited, and returned."""
        src = self.src
        item = step.item
        ctx._index = i
        offset = src.pos
        sub = (*path, i)
        known = template(path, i) if template is not None else None
        if known is not None and self.header_matches(item, step.prefix, known):
            if step.simple_tail:
                # Header known and checked; the rest is payloads that need only it.
                value = Container(known)
                for tail in item.steps[step.prefix :]:
                    value[tail.name] = self.payload(tail, value, (*sub, tail.name))
            else:
                value = self.struct(item.struct, item.steps, ctx, sub, known, step.prefix)
        else:
            value = self.value(item, ctx, sub)
        self.on_field(sub, value, offset, ctx)
        return value

    def batched(self, step: Records, count: int, ctx: Container, path: Path) -> int:
        """An array whose visitor takes batches: runs of records alike go to
        ``on_records`` at once, every other record (and every record of a declined batch)
        is walked as usual, so errors are those of the record-at-a-time path."""
        src, visitor = self.src, self.visitor
        window = ChunkWindow(src)
        headers = Headers()
        i = pause = misses = 0
        while i < count:
            if not pause:
                start = src.pos
                batch = scan_batch(window, step, ctx, i, count - i)
                if batch is None or batch.count < MIN_BATCH:
                    # No run of alike records here: records decoded one by one, from the
                    # chunk, most of them found by their header bytes.
                    batch = scan_decoded(window, step, ctx, i, count - i, headers) or batch
                src.seek(start)
                if (
                    batch is not None
                    and batch.count >= MIN_BATCH
                    and visitor.on_records(path, batch)
                ):
                    src.seek(_batch_end(batch))
                    i += batch.count
                    misses = 0
                    continue
                # Walk what the batch held (a declined batch gets its exact error that way),
                # and try again later, later still after each miss: a file of records that
                # never repeat costs a bounded share of scanning attempts.
                misses += 1
                pause = max(1 if batch is None else batch.count, min(1 << misses, MAX_PAUSE))
            self.record(step, i, ctx, path)
            i += 1
            pause -= 1
        return count

    def payload(self, step: PayloadStep, ctx: Container, path: Path) -> Any:
        src = self.src
        offset = src.pos
        count, dtype = step.payload.resolve(ctx)
        count = _count(count, path, offset)
        nbytes = count * dtype.itemsize
        src.need(nbytes, path)
        buffer = self.visitor.payload_buffer(path, count, dtype, ctx, offset)
        if buffer is None:
            src.skip(nbytes, path)
            return None
        src.readinto(buffer, path)
        return self.visitor.payload_done(path, buffer, ctx)

    def leaf(self, sc: Any, ctx: Container, path: Path) -> Any:
        """The interpreted path: construct decodes the field's exact bytes."""
        offset = self.src.pos
        what = field_name(path)
        size = fixed_size(sc)
        try:
            if size is None:  # no such leaf in the shipped specs; construct bounds its reads
                value = sc._parsereport(self.src.file, ctx, what)
                self.src.pos = self.src.file.tell()
                return value
            data = self.src.read(size, path)
            return sc._parsereport(io.BytesIO(data), ctx, what)
        except ConstructError as exc:
            raise from_construct(exc, offset=offset, field=what) from None


def parse(
    source: Source, spec: Struct, visitor: Visitor | None = None, params: dict | None = None
) -> Container:
    """Parse one file described by ``spec`` from ``source``'s position, streaming payloads.

    Does not check for trailing data (the caller decides what follows).
    """
    root = Container(_parsing=True, _building=False, _sizing=False, _params=Container(params or {}))
    with gc_paused():
        return _Parser(source, visitor or Visitor()).struct(spec, compile_struct(spec), root, ())
