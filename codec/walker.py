"""Streaming parse and build of a spec, field by field, through its compiled plan.

A spec is an ordinary construct ``Struct``. :func:`parse` and :func:`build` execute the plan
:mod:`.plan` derives from it instead of handing the whole file to construct, so that

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

Under :func:`interpreted` neither precompiled structs nor batches are used.
"""

from __future__ import annotations

import contextlib
import contextvars
import io
import struct
from collections.abc import Iterator
from typing import Any, BinaryIO, Protocol, runtime_checkable

import numpy as np
from construct import ConstructError, Container, Struct
from construct.core import evaluate

from .batches import ChunkWindow, RecordBatch, batchable, scan_batch
from .errors import CheckpointError, MalformedError, from_construct
from .gcpause import gc_paused
from .paths import Path, field_name
from .plan import (
    Branch,
    Leaf,
    Nested,
    PayloadStep,
    Records,
    Run,
    U64Array,
    checks_pass,
    child_context,
    compile_struct,
    fixed_size,
    header_format,
)
from .source import Source

__all__ = ["Path", "Visitor", "VisitorProtocol", "parse", "build", "field_name", "interpreted"]

#: Fewest alike records handed to a visitor as one batch; shorter runs are walked.
MIN_BATCH = 16
#: Most records walked one at a time between two attempts at a batch.
MAX_PAUSE = 1024

# Whether runs of fixed fields use the precompiled struct path (the default) or construct's
# interpreted parser field by field. Tests switch it off to show that both agree.
_FAST_PATH: contextvars.ContextVar[bool] = contextvars.ContextVar("tlckpt_fast_path", default=True)


@contextlib.contextmanager
def interpreted() -> Iterator[None]:
    """Within this block, parse and build every field through construct's interpreter."""
    token = _FAST_PATH.set(False)
    try:
        yield
    finally:
        _FAST_PATH.reset(token)


@runtime_checkable
class VisitorProtocol(Protocol):
    """The hooks :func:`parse` calls, with the exact signatures it calls them with.

    :class:`Visitor` is the default implementation; a visitor subclasses it (or implements
    all four hooks itself). The walker passes every argument by position; the parameter
    names here are the contract all visitors share. A test checks every visitor class of
    the package and of the fuzzing harness against these signatures, so that a hook that
    drifts fails loudly instead of raising a ``TypeError`` deep inside a parse.
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


def _count(value: Any, path: Path, offset: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise MalformedError(
            f"invalid count {value!r}", offset=offset, field=field_name(path), actual=value
        )
    return value


def _builds_from_none(step: Any) -> bool:
    """Whether a field may be left out by the caller (``Default``, ``Const``, ``Computed``)."""
    if isinstance(step, Leaf):
        return bool(step.subcon.flagbuildnone)
    if isinstance(step, Nested):
        return bool(step.struct.flagbuildnone)
    return False


class _Parser:
    def __init__(self, source: Source, visitor: Visitor):
        self.src = source
        self.visitor = visitor
        self.on_field = visitor.on_field
        self.fast = _FAST_PATH.get()
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
        i = pause = misses = 0
        while i < count:
            if not pause:
                start = src.pos
                batch = scan_batch(window, step, ctx, i, count - i)
                src.seek(start)
                if (
                    batch is not None
                    and batch.count >= MIN_BATCH
                    and visitor.on_records(path, batch)
                ):
                    src.seek(start + batch.count * batch.stride)
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


class _Builder:
    def __init__(self, stream: BinaryIO):
        self.stream = stream
        self.out = stream
        self.pos = 0
        self.fast = _FAST_PATH.get()
        # Record headers already built and checked, by their field values: a model's many
        # tensors share few shapes, so most headers are one dict lookup.
        self.headers: dict[tuple, bytes] = {}

    def write(self, data: Any) -> None:
        self.out.write(data)
        self.pos += len(data) if isinstance(data, bytes) else memoryview(data).nbytes

    def struct(
        self, st: Struct, steps: tuple, obj: Any, parent: Container, path: Path, start: int = 0
    ) -> None:
        obj = Container() if obj is None else obj
        ctx = child_context(st, parent, parsing=False)
        ctx.update(obj)
        for step in steps[start:] if start else steps:
            if type(step) is Run:
                self.run(step, obj, ctx, path)
                continue
            name = step.name
            sub = (*path, name) if name else path
            if name in obj:
                value = obj[name]
            elif _builds_from_none(step):
                value = None
            else:
                what = field_name(sub)
                raise CheckpointError(f"no value given for {what}", field=what)
            built = self.value(step, value, ctx, sub)
            if name:
                ctx[name] = built

    def run(self, step: Run, obj: Any, ctx: Container, path: Path) -> None:
        if not self.fast:
            scratch = io.BytesIO()
            self.interpret(step, obj, ctx, path, scratch)
            self.write(scratch.getvalue())
            return
        values = []
        for k, name in enumerate(step.names):
            value = obj.get(name) if name else None
            for kind, arg in step.checks[k]:
                if kind == "const" and value is None:
                    value = arg
            if value is None or not checks_pass(step.checks[k], value, ctx):
                self.diagnose(step, obj, ctx, path)
            if name:
                ctx[name] = value
            values.append(value)
        try:
            data = step.codec.pack(*values)
        except (struct.error, TypeError, OverflowError):
            self.diagnose(step, obj, ctx, path)
        self.write(data)

    def diagnose(self, step: Run, obj: Any, ctx: Container, path: Path) -> None:
        """Build the failed run with construct into a scratch buffer: raises the exact error."""
        self.interpret(step, obj, ctx, path, io.BytesIO())
        raise CheckpointError(  # pragma: no cover - the two builders disagree: a bug here
            f"internal error: fast and interpreted builders disagree at {field_name(path)}"
        )

    def interpret(self, step: Run, obj: Any, ctx: Container, path: Path, out: BinaryIO) -> None:
        """Build a run's fields one by one with construct itself, into ``out``."""
        for name, sc in zip(step.names, step.subcons):
            sub = (*path, name) if name else path
            value = obj.get(name) if name else None
            if value is None and not sc.flagbuildnone:
                what = field_name(sub)
                raise CheckpointError(f"no value given for {what}", field=what)
            built = self.leaf(sc, value, ctx, sub, out)
            if name:
                ctx[name] = built

    def value(self, step: Any, obj: Any, ctx: Container, path: Path) -> Any:
        t = type(step)
        if t is Nested:
            self.struct(step.struct, step.steps, obj, ctx, path)
            return obj
        if t is U64Array:
            count = evaluate(step.count, ctx)
            values = list(obj)
            if len(values) != count:
                raise CheckpointError(
                    f"{field_name(path)} has {len(values)} values, header says {count}",
                    field=field_name(path),
                )
            try:
                self.write(struct.pack(f"{step.order}{count}{step.code}", *values))
            except (struct.error, TypeError, OverflowError) as exc:
                raise CheckpointError(
                    f"cannot write {field_name(path)}: {exc}", field=field_name(path)
                ) from None
            return values
        if t is Records:
            count = evaluate(step.count, ctx)
            cached = self.fast and step.prefix and step.streamed
            n = 0
            for n, item in enumerate(obj, 1):
                if n > count:
                    break
                ctx._index = n - 1
                if cached:
                    self.record(step, item, ctx, (*path, n - 1))
                else:
                    self.value(step.item, item, ctx, (*path, n - 1))
            if n != count:
                raise CheckpointError(
                    f"{field_name(path)}: {count} records announced, {n} given",
                    field=field_name(path),
                )
            return count
        if t is PayloadStep:
            return self.payload(step, obj, ctx, path)
        if t is Branch:
            chosen = step.then if evaluate(step.cond, ctx) else step.otherwise
            return self.value(chosen, obj, ctx, path)
        buf = io.BytesIO()
        built = self.leaf(step.subcon, obj, ctx, path, buf)
        self.write(buf.getvalue())
        return built

    def record(self, step: Records, item: Any, parent: Container, path: Path) -> None:
        """Write one record whose header bytes may already be known from an earlier one."""
        try:
            key = tuple([tuple(item[n]) if array else item[n] for n, array in step.header])
            header = self.headers.get(key)
        except (KeyError, TypeError):  # missing or unhashable values: the slow path says why
            key, header = None, None
        nested = step.item
        if header is None:
            scratch, pos = io.BytesIO(), self.pos
            self.out = scratch
            try:
                self.struct(nested.struct, nested.steps[: step.prefix], item, parent, path)
            finally:
                self.out = self.stream
                self.pos = pos
            header = scratch.getvalue()
            if key is not None:
                self.headers[key] = header
        self.out.write(header)
        self.pos += len(header)
        if step.simple_tail and type(item) is dict:
            # The payloads need nothing but the record's own fields: no context to build.
            try:
                tails = [
                    (tail.name, *tail.payload.resolve(item), item[tail.name])
                    for tail in nested.steps[step.prefix :]
                ]
            except KeyError:  # not all there: the general path below says which
                tails = None
            if tails is not None:
                for name, count, dtype, array in tails:
                    self.payload_array(array, count, dtype, (*path, name))
                return
        self.struct(nested.struct, nested.steps, item, parent, path, start=step.prefix)

    def payload(self, step: PayloadStep, array: Any, ctx: Container, path: Path) -> Any:
        count, dtype = step.payload.resolve(ctx)
        return self.payload_array(array, count, dtype, path)

    def payload_array(self, array: Any, count: int, dtype: np.dtype, path: Path) -> Any:
        """Write one payload from the caller's memory (a copy only if it is strided)."""
        if not isinstance(array, np.ndarray) or array.dtype != dtype or array.size != count:
            got = (
                f"{array.dtype} array of {array.size} elements"
                if isinstance(array, np.ndarray)
                else type(array).__name__
            )
            what = field_name(path)
            raise CheckpointError(
                f"{what} must be a {dtype} array of {count} elements, got {got}", field=what
            )
        if array.size:
            if not array.flags.c_contiguous:
                array = np.ascontiguousarray(array)
            self.write(array.data)  # the array's own memory, any shape
        return array

    def leaf(self, sc: Any, obj: Any, ctx: Container, path: Path, buf: BinaryIO) -> Any:
        what = field_name(path)
        try:
            return sc._build(obj, buf, ctx, what)
        except ConstructError as exc:
            raise from_construct(exc, offset=self.pos, field=what, writing=True) from None
        except (TypeError, ValueError, OverflowError, struct.error) as exc:
            raise CheckpointError(f"cannot write {what}: {exc}", field=what) from None


def build(stream: BinaryIO, spec: Struct, values: Any, params: dict | None = None) -> int:
    """Write ``values`` laid out by ``spec`` to ``stream``; returns the bytes written.

    ``values`` is a mapping of field name to value; arrays of records may be any iterable
    (generators included: one record is produced, written and dropped at a time); payloads are
    numpy arrays of exactly the spec's dtype and element count, written from their memory.
    """
    root = Container(_parsing=False, _building=True, _sizing=False, _params=Container(params or {}))
    builder = _Builder(stream)
    with gc_paused():
        builder.struct(spec, compile_struct(spec), values, root, ())
    return builder.pos
