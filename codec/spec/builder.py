"""Streaming build of a spec, field by field, through its compiled plan: the writers' half.

:func:`build` executes the plan :mod:`.plan` derives from a spec, so that

* payloads stream from the caller's arrays with ``write(memoryview)``, never copied unless
  strided, and arrays of records may be generators (one record made, written and dropped at
  a time);
* runs of fixed scalar fields are packed with one precompiled ``struct`` call after their
  ``Const``/``Valid`` checks; whenever a run fails, it is built again with construct's
  interpreter into a scratch buffer, which raises the exact error;
* the header bytes of a record are built once per distinct header and reused.

Under :func:`~tlckpt.codec.spec.plan.interpreted` every field goes through construct.
"""

from __future__ import annotations

import io
import struct
from typing import Any, BinaryIO

import numpy as np
from construct import ConstructError, Container, Struct
from construct.core import evaluate

from ..errors import CheckpointError, from_construct
from ..fileio.gcpause import gc_paused
from ..paths import Path, field_name
from . import plan
from .plan import (
    Branch,
    CheckKind,
    Leaf,
    Nested,
    PayloadStep,
    Records,
    Run,
    U64Array,
    compile_struct,
    fast_path,
)

__all__ = ["build", "Reserved"]

_CONST = CheckKind.CONST  # a module global: cheaper to reach than the enum's attribute


class Reserved:
    """A payload's place, in lieu of its values: ``count`` elements of ``dtype``.

    Built into a layout stream (:mod:`.layout`), it advances the position by the payload's
    bytes and tells the stream where they go, writing nothing.
    """

    __slots__ = ("count", "dtype")

    def __init__(self, count: int, dtype: Any):
        self.count = int(count)
        self.dtype = np.dtype(dtype)


def _builds_from_none(step: Any) -> bool:
    """Whether a field may be left out by the caller (``Default``, ``Const``, ``Computed``)."""
    if isinstance(step, Leaf):
        return bool(step.subcon.flagbuildnone)
    if isinstance(step, Nested):
        return bool(step.struct.flagbuildnone)
    return False


class _Builder:
    def __init__(self, stream: BinaryIO):
        self.stream = stream
        self.out = stream
        self.pos = 0
        self.fast = fast_path()
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
        ctx = plan.child_context(st, parent, parsing=False)
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
                if kind is _CONST and value is None:
                    value = arg
            if value is None or not plan.checks_pass(step.checks[k], value, ctx):
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
            # Records without payloads are what later ``this`` lambdas may read (as
            # construct's own builder gives them): the caller's list, or one made here.
            kept = None if step.streamed or isinstance(obj, (list, tuple)) else []
            n = 0
            for n, item in enumerate(obj, 1):
                if n > count:
                    break
                ctx._index = n - 1
                if cached:
                    self.record(step, item, ctx, (*path, n - 1))
                else:
                    self.value(step.item, item, ctx, (*path, n - 1))
                if kept is not None:
                    kept.append(item)
            if n != count:
                raise CheckpointError(
                    f"{field_name(path)}: {count} records announced, {n} given",
                    field=field_name(path),
                )
            if step.streamed:
                return count
            return obj if kept is None else kept
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
        if type(array) is Reserved:
            return self.reserve(array, count, dtype, path)
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

    def reserve(self, slot: Reserved, count: int, dtype: np.dtype, path: Path) -> Reserved:
        """Leave room for a payload the caller writes later (a layout): its bytes are counted,
        not written; the stream is told where they go."""
        what = field_name(path)
        if slot.count != count or np.dtype(slot.dtype) != dtype:
            raise CheckpointError(
                f"{what} takes {count} {dtype} elements, {slot.count} {slot.dtype} reserved",
                field=what,
            )
        reserve = getattr(self.out, "reserve", None)
        if reserve is None:
            raise CheckpointError(f"{what}: a reserved payload needs a layout stream", field=what)
        nbytes = count * dtype.itemsize
        reserve(path, self.pos, nbytes)
        self.pos += nbytes
        return slot

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
