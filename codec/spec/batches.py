"""Arrays of small records scanned in batches: the fast path of readers that skip payloads.

A reader that checks a file without reading its payloads (``inspect``, ``scan_adam``,
``scan_float32_state``) spends its time on per-record overhead when the file holds very many
small records (10⁶ empty tensors: 16 s record by record). Here a *run* of consecutive
records that lay out alike is decoded at once from an in-memory chunk of the file, with
numpy, using nothing but the compiled plan of the record's spec:

1. The run's first record is decoded with the plan's precompiled structs. Its array and
   payload counts give its size (the *stride*); its checks run as the walker runs them. Every
   count, dtype and check is evaluated on a context that notes which fields it reads.
2. Those fields, and every checked field, are *bound*: the run extends over the following
   records — rows of a numpy array at that stride — as long as their bound bytes equal the
   first record's. The spec's counts and checks are functions of the fields they read, so
   equal inputs give the same sizes and the same verdicts: every record of the run has the
   first one's layout and passes the same checks. The other fields are *free*: they reach
   the visitor as numpy columns, one value per record.
3. The visitor checks the batch against its own rules in bulk, or declines it. A declined
   batch, a record that does not decode, a count or check that reads the record's index, a
   record larger than :data:`MAX_STRIDE` or a run shorter than the walker's minimum goes
   through the walker's record-at-a-time path, which raises the exact error (and, for a
   failing run of fixed fields, re-diagnoses it with construct's interpreter).

Payload bytes inside a chunk are read with it but never looked at; the chunk size keeps that
bounded (a run's records are at most :data:`MAX_STRIDE` bytes, about a page, so a chunk
costs no more reading than seeking from header to header would).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from construct import Container
from construct.core import evaluate

from ..fileio.source import Source
from .plan import Nested, PayloadStep, Records, Run, checks_pass, child_context

__all__ = [
    "CHUNK_BYTES",
    "MAX_STRIDE",
    "RecordBatch",
    "RecordLayout",
    "ChunkWindow",
    "decode_layout",
    "batchable",
    "scan_batch",
]

#: Bytes of the file read into memory at once while scanning a run of records.
CHUNK_BYTES = 1 << 20
#: Largest record (header and payloads) scanned in batches; larger ones are visited one at a
#: time, seeking over their payloads.
MAX_STRIDE = 4096


@dataclass(frozen=True)
class RecordBatch:
    """``count`` consecutive records of one array whose payloads were skipped.

    Either laid out alike (``stride`` bytes each, fields split into ``constants`` and
    ``columns``), or — ``stride == 0`` — each decoded on its own by
    :func:`~.header_scan.scan_decoded` (``layouts``: the distinct record layouts met,
    ``kinds``: each record's index in ``layouts``, ``starts``: each record's position).

    Attributes:
        first: index of the first record in the array.
        count: number of records.
        offset: byte position of the first record.
        stride: bytes per record when every record of the batch has the same size, else 0.
        constants: header fields with one value for the whole batch (the checked ones and
            those any count or check depends on), as the walker would decode them.
        columns: the other header fields: one numpy value per record (a row of ``n`` values
            for an array field). Read-only views of the scanned chunk: copy what you keep.
        payloads: ``(field, offset in the record, element count, dtype)`` per payload (of
            the first record, for a batch of records decoded one by one).
        layouts: the distinct decoded headers (records decoded one by one), else ``None``.
        kinds: each record's index in ``layouts`` (records decoded one by one), else ``None``.
        starts: each record's absolute position (records decoded one by one), else ``None``.
    """

    first: int
    count: int
    offset: int
    stride: int
    constants: Mapping[str, Any]
    columns: Mapping[str, np.ndarray]
    payloads: tuple[tuple[str, int, int, np.dtype], ...]
    layouts: tuple[RecordLayout, ...] | None = None
    kinds: np.ndarray | None = None
    starts: np.ndarray | None = None

    def values(self, name: str, convert: Callable[[Any], Any] | None = None) -> list[Any]:
        """Field ``name`` of every record, as Python values (arrays as lists), each passed
        through ``convert`` if given (once per distinct value where records share one)."""
        if self.layouts is not None and self.kinds is not None:
            per = [row.values[name] for row in self.layouts]
            return _expand([convert(v) for v in per] if convert else per, self.kinds)
        if name in self.columns:
            got = self.columns[name].tolist()
            return list(map(convert, got)) if convert else got
        value = self.constants[name]
        return [convert(value) if convert else value] * self.count

    def payload_offsets(self, name: str) -> np.ndarray:
        """Absolute byte position of payload ``name`` in every record."""
        if self.layouts is not None and self.kinds is not None and self.starts is not None:
            at = np.array([row.payload_at(name) for row in self.layouts], dtype=np.int64)
            return self.starts + at[self.kinds]
        for field, at, _count, _dtype in self.payloads:
            if field == name:
                return self.offset + at + self.stride * np.arange(self.count, dtype=np.int64)
        raise KeyError(name)

    def payload_bytes(self) -> list[int]:
        """The bytes of every record's payloads together, as the spec sizes them."""
        if self.layouts is not None and self.kinds is not None:
            per = np.array([row.payload_bytes for row in self.layouts], dtype=np.int64)
            return per[self.kinds].tolist()
        nbytes = sum(n * dtype.itemsize for _, _, n, dtype in self.payloads)
        return [nbytes] * self.count


def _expand(per: list[Any], kinds: np.ndarray) -> list[Any]:
    """``[per[k] for k in kinds]``, by one numpy gather (the values are shared, not copied)."""
    table = np.empty(len(per), dtype=object)
    for k, value in enumerate(per):  # element by element: lists must stay single objects
        table[k] = value
    return table[kinds].tolist()


class _Reads(Container):
    """A context that notes the keys read from it (by ``this`` paths, lambdas and checks)."""

    __slots__ = ["__recursion_lock__", "reads"]

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        object.__setattr__(self, "reads", set())

    def __getitem__(self, key: Any) -> Any:
        self.reads.add(key)
        return super().__getitem__(key)

    def get(self, key: Any, default: Any = None) -> Any:
        self.reads.add(key)
        return super().get(key, default)

    def __contains__(self, key: Any) -> bool:
        self.reads.add(key)
        return super().__contains__(key)


def _reads_everything(name: str) -> Any:
    """``Container``'s method ``name``, noting that its caller looks at every key."""
    method = getattr(Container, name)

    def noted(self: _Reads, *args: Any) -> Any:
        self.reads.add(_EVERYTHING)
        return method(self, *args)

    noted.__name__ = name
    return noted


for _name in ("keys", "values", "items", "__iter__"):
    setattr(_Reads, _name, _reads_everything(_name))


_EVERYTHING = object()  # a function looked at every key: nothing can be free


@dataclass(frozen=True)
class _Field:
    name: str | None
    at: int  # offset in the record
    size: int
    dtype: Any  # numpy format of the field (None where numpy has none)
    checked: bool


@dataclass(frozen=True)
class RecordLayout:
    """A decoded record header: the layout the first record of a run sets for the rest."""

    stride: int
    fields: tuple[_Field, ...]
    values: dict[str, Any]
    bound: frozenset[str]
    payloads: tuple[tuple[str, int, int, np.dtype], ...]
    header: int = 0  # bytes before the first payload
    payload_bytes: int = 0

    def payload_at(self, name: str) -> int:
        """Where payload ``name`` starts in the record."""
        for field, at, _count, _dtype in self.payloads:
            if field == name:
                return at
        raise KeyError(name)


def _numpy_format(order: str, code: str) -> Any:
    try:
        if code.endswith("s"):
            return np.dtype(f"V{int(code[:-1] or 1)}")
        return np.dtype(order + code)
    except (TypeError, ValueError):
        return None


def batchable(step: Records) -> bool:
    """Whether records of ``step`` can be scanned in batches: a header of fixed fields and
    number arrays, then nothing but payloads."""
    item = step.item
    if not isinstance(item, Nested) or not step.prefix:
        return False
    head, tail = item.steps[: step.prefix], item.steps[step.prefix :]
    return any(isinstance(s, Run) for s in head) and all(isinstance(s, PayloadStep) for s in tail)


def _count(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def decode_layout(
    step: Records, buf: bytes, p: int, parent: Container, index: int
) -> RecordLayout | None:
    """Decode and check the record at ``buf[p:]`` as the walker would; ``None`` whenever the
    walker might decide anything differently for it or for records like it."""
    item = step.item
    up = _Reads(parent)
    up["_index"] = index  # as the walker sets it before each record
    ctx = _Reads(child_context(item.struct, up, parsing=True))
    if ctx["_root"] is parent:  # top-level arrays: the root is the array's own parent
        ctx["_root"] = up
    ctx["_index"] = index
    ctx.reads.clear()
    up.reads.clear()
    depends: set[Any] = set()
    fields: list[_Field] = []
    values: dict[str, Any] = {}
    pos = p
    try:
        for s in item.steps[: step.prefix]:
            if type(s) is Run:
                if pos + s.codec.size > len(buf):
                    return None
                order = s.codec.format[0]
                at = pos
                for k, value in enumerate(s.codec.unpack_from(buf, pos)):
                    name, checks = s.names[k], s.checks[k]
                    if checks:
                        ctx.reads.clear()
                        if not checks_pass(checks, value, ctx):
                            return None
                        depends |= ctx.reads
                    fields.append(
                        _Field(
                            name, at - p, s.sizes[k], _numpy_format(order, s.codes[k]), bool(checks)
                        )
                    )
                    if name:
                        ctx[name] = values[name] = value
                    at += s.sizes[k]
                pos += s.codec.size
            else:  # U64Array: its length comes from the fields before it
                ctx.reads.clear()
                n = _count(evaluate(s.count, ctx))
                depends |= ctx.reads
                if n is None or pos + n * s.itemsize > len(buf):
                    return None
                value = list(struct.unpack_from(f"{s.order}{n}{s.code}", buf, pos))
                fmt = _numpy_format(s.order, s.code)
                fields.append(_Field(s.name, pos - p, n * s.itemsize, (fmt, (n,)), False))
                if s.name:
                    ctx[s.name] = values[s.name] = value
                pos += n * s.itemsize
        payloads = []
        for s in item.steps[step.prefix :]:
            ctx.reads.clear()
            count, dtype = s.payload.resolve(ctx)
            depends |= ctx.reads
            count = _count(count)
            if count is None:
                return None
            payloads.append((s.name, pos - p, count, dtype))
            pos += count * dtype.itemsize
            if s.name:  # skipped payloads are None to the fields after them, as when walked
                ctx[s.name] = None
    except Exception:  # a count, dtype or check that cannot run here: walk it instead
        return None
    names = {f.name for f in fields if f.name}
    if (
        _EVERYTHING in depends
        or _EVERYTHING in up.reads
        or "_index" in depends
        or "_index" in up.reads
        or depends & {name for name, *_ in payloads}
    ):
        return None
    bound = frozenset({f.name for f in fields if f.checked and f.name} | (depends & names))
    header = sum(f.size for f in fields)
    return RecordLayout(
        pos - p, tuple(fields), values, bound, tuple(payloads), header, pos - p - header
    )


class ChunkWindow:
    """Bytes of the file around the records being scanned, refilled a chunk at a time.

    Reading moves the file's position; the walker seeks back before it reads a record itself.
    """

    def __init__(self, src: Source):
        self.src = src
        self.base = 0
        self.data = b""

    def view(self, pos: int, size: int) -> tuple[bytes, int]:
        """The window and ``pos``'s index in it, holding ``size`` bytes from ``pos`` (or all
        that is left of the file; fewer if the file shrank)."""
        size = max(0, min(size, self.src.size - pos))
        if self.base <= pos and pos + size <= self.base + len(self.data):
            return self.data, pos - self.base
        self.src.file.seek(pos)
        self.data = self.src.file.read(size)
        self.base = pos
        return self.data, 0


def _differs(raw: np.ndarray, spans: list[tuple[int, int]]) -> np.ndarray:
    """Rows whose bytes in ``spans`` differ from the first row's."""
    out = np.zeros(len(raw), dtype=bool)
    for a, b in spans:
        block = raw[:, a:b]
        out |= (block != block[0]).any(axis=1)
    return out


def _spans(fields: tuple[_Field, ...], bound: frozenset[str]) -> list[tuple[int, int]]:
    spans: list[tuple[int, int]] = []
    for f in fields:
        if f.size and (f.name is None or f.name in bound):
            if spans and spans[-1][1] == f.at:
                spans[-1] = (spans[-1][0], f.at + f.size)
            else:
                spans.append((f.at, f.at + f.size))
    return spans


def scan_batch(
    window: ChunkWindow, step: Records, parent: Container, first: int, left: int
) -> RecordBatch | None:
    """The longest run of records like record ``first`` (at the source's position), at most
    ``left`` of them and one chunk long; ``None`` if that record must be walked.

    Does not move the source's tracked position (the file's own position may move).
    """
    pos = window.src.pos
    buf, p = window.view(pos, MAX_STRIDE)
    row = decode_layout(step, buf, p, parent, first)
    if row is None or row.stride > MAX_STRIDE:
        return None
    stride = row.stride
    buf, p = window.view(pos, min(left * stride, max(CHUNK_BYTES, stride)))
    rows = min(left, (len(buf) - p) // stride)
    if rows < 1:
        return None
    spans = _spans(row.fields, row.bound)
    if spans and rows > 1:
        raw = np.frombuffer(buf, np.uint8, count=rows * stride, offset=p).reshape(rows, stride)
        changed = np.flatnonzero(_differs(raw, spans))
        if changed.size:
            rows = int(changed[0])
    free = [f for f in row.fields if f.name and f.name not in row.bound]
    columns: dict[str, np.ndarray] = {}
    if free:
        if any(f.dtype is None for f in free):
            return None
        table = np.frombuffer(
            buf,
            np.dtype(
                {
                    "names": [f.name for f in free],
                    "formats": [f.dtype for f in free],
                    "offsets": [f.at for f in free],
                    "itemsize": stride,
                }
            ),
            count=rows,
            offset=p,
        )
        columns = {f.name: table[f.name] for f in free}
    constants = {name: row.values[name] for name in row.bound}
    return RecordBatch(first, rows, pos, stride, constants, columns, row.payloads)
