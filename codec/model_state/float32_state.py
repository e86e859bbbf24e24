"""Streamed float32 model state (``TLSF32B``), read through the specs: checked, scanned,
its payloads moved; the writers are :mod:`.float32_state_writer`'s (exported here too)."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np
from construct import Container

from ...formats.float32_state import TENSOR_COUNT, TENSOR_DTYPE, TENSORS
from ...formats.framing import FLOAT32_STATE_MAGIC
from ...formats.primitives import product
from ..errors import (
    SchemaMismatchError,
    differs,
    names_the_file,
)
from ..fileio.gcpause import gc_paused
from ..fileio.mapped import FileMapping
from ..fileio.source import FileStamp, PathOrFile, open_source
from ..fileio.staging import same_bytes
from ..fileio.transfer import Extents, address_of, read_extents
from ..paths import Path, field_name
from ..spec.batches import RecordBatch
from ..spec.framed import check_trailing, read_framing
from ..spec.plan import fast_path
from ..spec.schema_check import check_shape_field
from ..spec.walker import Visitor, parse
from ..values.payload_sinks import PayloadSink
from .state_template import check_headers, record_values, shape_tuples, template_for

__all__ = [
    "read_float32_state",
    "validate_float32_state",
    "read_float32_payloads",
    "read_float32_extents",
    "float32_payloads_equal",
    "StateLayout",
    "scan_float32_state",
    "scan_float32_sizes",
    "is_float32_state",
]

_TENSOR_DTYPE = np.dtype(TENSOR_DTYPE)
#: Path lengths of a tensor record, ``(*TENSORS, i)``, and of its fields.
_RECORD_DEPTH = len(TENSORS) + 1
_FIELD_DEPTH = len(TENSORS) + 2


class _StateReader(Visitor):
    def __init__(
        self, shapes: Sequence[tuple[int, ...]] | None, sink: PayloadSink | None, skip: bool
    ):
        self.shapes = shapes
        self.sink = sink
        self.skip = skip
        self.values: list[Any] = []
        self.found: list[tuple[int, ...]] = []
        self.offsets: list[int] = []
        self.sizes: list[int] = []  # payload bytes, as the spec sizes them (skipped only)
        self.templates: dict[tuple[int, ...], dict[str, Any]] = {}
        self.version = 0  # set from the framing before the parse

    def on_field(self, path: Path, value: Any, offset: int, ctx: Container) -> None:
        # Depths first (a cheap test on every field), then the declared path itself.
        depth = len(path)
        if depth == _FIELD_DEPTH:
            if self.shapes is not None and path[:-2] == TENSORS:  # a tensor record's field
                index = path[-2]
                check_shape_field(path[-1], value, self.shapes[index], offset, "tensor", path)
        elif depth == _RECORD_DEPTH and path[:-1] == TENSORS:  # a whole tensor record
            self.found.append(tuple(value.dims))
        elif path == TENSOR_COUNT and self.shapes is not None and value != len(self.shapes):
            message = f"tensor count {value} in the file, {len(self.shapes)} expected"
            raise differs(SchemaMismatchError, message, offset, path, value, len(self.shapes))

    def batches(self, path: Path) -> bool:
        # Scans (no destination, payloads skipped) take runs of alike tensors at once.
        return self.shapes is None and self.skip

    def on_records(self, path: Path, batch: RecordBatch) -> bool:
        if "dims" in batch.constants:
            self.found.extend([tuple(batch.constants["dims"])] * batch.count)
        else:
            self.found.extend(batch.values("dims", tuple))
        self.offsets.extend(batch.payload_offsets("payload").tolist())
        self.sizes.extend(batch.payload_bytes())
        return True

    def record_template(self, path: Path, index: int) -> dict[str, Any] | None:
        if self.shapes is None or index >= len(self.shapes):
            return None
        shape = self.shapes[index]
        known = self.templates.get(shape)
        if known is None:
            known = self.templates[shape] = record_values(shape)
        return known

    def payload_buffer(
        self, path: Path, count: int, dtype: np.dtype, ctx: Container, offset: int
    ) -> Any:
        if self.skip:
            self.offsets.append(offset)
            self.sizes.append(count * dtype.itemsize)
            return None
        if self.sink is not None:
            buffer = self.sink.buffer(path[-2], path[-1], count, dtype)
            if buffer is None:  # the sink skips this tensor: keep the list aligned
                self.values.append(None)
            return buffer
        try:
            return np.empty(tuple(ctx.dims), dtype=dtype)
        except ValueError as exc:  # e.g. (2**63, 0): a shape numpy cannot describe
            raise SchemaMismatchError(
                f"tensor {path[-2]}: shape {tuple(ctx.dims)} cannot be held in memory: {exc}",
                field=field_name(path[:-1]),
            ) from None

    def payload_done(self, path: Path, buffer: Any, ctx: Container) -> Any:
        value = self.sink.done(path[-2], path[-1], buffer) if self.sink is not None else buffer
        self.values.append(value)
        return None  # kept in self.values; the walker need not hold it


def _read(
    path: PathOrFile, shapes: Sequence[Sequence[int]] | None, sink: Any, skip: bool
) -> tuple[_StateReader, FileStamp]:
    """The parse, and the file's stamp taken before its first byte was read."""
    expected = None if shapes is None else [tuple(map(int, s)) for s in shapes]
    reader = _StateReader(expected, sink, skip)
    with open_source(path) as src:
        spec = read_framing(src, expect=FLOAT32_STATE_MAGIC)
        reader.version = spec.version
        parse(src, spec.struct, reader)
        check_trailing(src)
    return reader, src.stamp


@names_the_file()
def read_float32_state(
    path: PathOrFile, shapes: Sequence[Sequence[int]], *, sink: PayloadSink | None = None
) -> list[Any]:
    """Read a ``TLSF32B`` file whose tensors must have exactly ``shapes``.

    Args:
        path: file path, or a seekable binary file object (read from its position).
        shapes: the destination's tensor shapes, in state order.
        sink: where payloads go (default: a fresh float32 array of each shape).

    Returns:
        One array per tensor (or what ``sink.done`` returned), in file order.

    Raises:
        CheckpointError: a subclass naming the tensor, offset and file vs expected values.
        OSError: from the file system.
    """
    return _read(path, shapes, sink, skip=False)[0].values


@dataclass(frozen=True)
class StateLayout:
    """Where a validated ``TLSF32B`` file keeps its payloads.

    Attributes:
        shapes: the tensor shapes, in file order.
        offsets: each payload's absolute byte position in the file object that was checked.
        stamp: the file's stamp taken before the check read its first byte; the payload
            pass verifies the file still matches it.
        sizes: each payload's size in bytes.
    """

    shapes: tuple[tuple[int, ...], ...]
    offsets: tuple[int, ...]
    stamp: FileStamp
    sizes: tuple[int, ...] = ()

    @functools.cached_property
    def offset_array(self) -> np.ndarray:
        """:attr:`offsets` as an int64 array."""
        return np.asarray(self.offsets, dtype=np.int64)

    @functools.cached_property
    def size_array(self) -> np.ndarray:
        """:attr:`sizes` as an int64 array."""
        return np.asarray(self.sizes, dtype=np.int64)


def _validate_by_template(path: PathOrFile, shapes: list[tuple[int, ...]]) -> StateLayout | None:
    """The layout of a file that holds exactly the header bytes the destination's template
    expects (see :mod:`.state_template`); ``None`` when it does not (or the spec cannot be
    templated): the walker then says what is wrong."""
    template = template_for(shapes)
    if template is None:
        return None
    with open_source(path) as src:
        if not check_headers(src, template):
            return None
    offsets = template.payload_offsets + src.start
    layout = StateLayout(
        template.shapes,
        tuple(offsets.tolist()),
        src.stamp,
        tuple(template.payload_lengths.tolist()),
    )
    layout.__dict__["offset_array"] = offsets  # what the cached properties would compute
    layout.__dict__["size_array"] = template.payload_lengths
    return layout


@names_the_file()
def validate_float32_state(path: PathOrFile, shapes: Sequence[Sequence[int]]) -> StateLayout:
    """Check a whole ``TLSF32B`` file against ``shapes`` without copying any payload.

    The first pass of a two-pass load: every header, size and the end of the file are
    checked; payload bytes are skipped. The header bytes are first compared with the
    template the destination's shapes give (all at once); a file that differs is walked
    field by field, which raises the exact error.

    Returns:
        The payloads' positions, for :func:`read_float32_payloads` on the same open file.

    Raises:
        CheckpointError: a subclass naming the tensor, offset and file vs expected values;
            :class:`FileChangedError` if the file changed while it was checked.
        OSError: from the file system.
    """
    expected = shape_tuples(shapes)
    if fast_path():
        layout = _validate_by_template(path, expected)
        if layout is not None:
            return layout
    reader, stamp = _read(path, expected, None, skip=True)
    return StateLayout(tuple(reader.found), tuple(reader.offsets), stamp, tuple(reader.sizes))


def read_float32_payloads(file: BinaryIO, layout: StateLayout, sink: PayloadSink) -> None:
    """The second pass of a two-pass load: each payload straight into ``sink``'s buffers.

    Headers are not decoded again: ``layout`` comes from :func:`validate_float32_state` on
    this very file object, so only the payloads are read (a ``seek`` and a ``readinto`` per
    tensor). The sink may return ``None`` to skip a tensor.

    The file is checked against the stamp the first pass took before it read anything, once
    before the sink receives its first buffer and once after the last byte is read: a
    completed call means every byte came from the file the first pass checked.

    Raises:
        FileChangedError: the file changed since the first pass began (found before any
            buffer was handed out, or after the last byte).
        TruncatedError: the file shrank under this pass.
        OSError: from the file system.
    """
    with open_source(file, since=layout.stamp) as src, gc_paused():
        for index, (shape, offset) in enumerate(zip(layout.shapes, layout.offsets)):
            count = product(shape)
            buffer = sink.buffer(index, "payload", count, _TENSOR_DTYPE)
            if buffer is None:
                continue
            src.seek(offset)
            src.readinto(buffer, (*TENSORS, index, "payload"))
            sink.done(index, "payload", buffer)


def read_float32_extents(
    file: BinaryIO,
    layout: StateLayout,
    records: Sequence[int] | np.ndarray,
    addresses: Sequence[int] | np.ndarray,
    owners: list[Any],
    progress: Any = None,
    mapping: FileMapping | None = None,
) -> None:
    """The second pass of a two-pass load, in bulk: the payloads of ``records`` straight
    into memory, by address, with a few vectored reads (:func:`~.transfer.read_extents`).

    Args:
        file: the file object :func:`validate_float32_state` checked.
        layout: what it found.
        records: the tensors to read, in increasing order.
        addresses: where each one's payload goes (its :attr:`StateLayout.sizes` bytes).
        owners: the objects owning that memory (held until the reads are done).
        progress, mapping: passed on to :func:`~.transfer.read_extents`.

    Raises:
        FileChangedError: the file changed since the first pass began (found before the
            first byte is read into memory, or after the last).
        TruncatedError: the file shrank under this pass.
        OSError: from the file system.
    """
    index = np.asarray(records, dtype=np.int64)
    offsets = layout.offset_array[index]
    sizes = layout.size_array[index]
    extents = Extents.build(addresses, sizes, offsets, owners)
    with open_source(file, since=layout.stamp) as src:
        read_extents(src.file, extents, (*TENSORS, "payload"), progress, mapping)


#: Bytes of each payload read at once by :func:`float32_payloads_equal`.
_COMPARE_READ_BYTES = 4 << 20


def float32_payloads_equal(
    file: BinaryIO,
    layout: StateLayout,
    first: int,
    second: int,
    mapping: FileMapping | None = None,
) -> bool:
    """Whether the payloads of records ``first`` < ``second`` of a checked file hold the same
    bytes, compared in ``mapping`` (a leased file's, :mod:`~..fileio.mapped`) where its pages
    are in memory, else read a chunk of each at a time (two buffers of 4 MiB at most).

    Raises:
        FileChangedError: the file changed since the first pass began.
        TruncatedError: the file shrank under this pass.
        OSError: from the file system.
    """
    size = int(layout.sizes[first])
    if size != int(layout.sizes[second]):
        return False
    where = (layout.offsets[first], layout.offsets[second])
    if mapping is not None:
        with open_source(file, since=layout.stamp):
            same = mapping.same(where[0], where[1], size)
        if same is not None:
            return same
    a = np.empty(min(size, _COMPARE_READ_BYTES), dtype=np.uint8)
    b = np.empty_like(a)
    with open_source(file, since=layout.stamp) as src:
        for at in range(0, size, len(a)):
            n = min(len(a), size - at)
            extents = Extents.build(
                [address_of(a), address_of(b)], [n, n], [where[0] + at, where[1] + at], [a, b]
            )
            read_extents(src.file, extents, (*TENSORS, "payload"))
            if not same_bytes(a[:n], b[:n]):
                return False
    return True


@names_the_file()
def scan_float32_state(path: PathOrFile) -> list[tuple[int, ...]]:
    """The tensor shapes of a well-formed ``TLSF32B`` file (payloads skipped)."""
    return _read(path, None, None, skip=True)[0].found


def scan_float32_sizes(path: PathOrFile) -> tuple[int, list[tuple[int, ...]], list[int]]:
    """The version, the tensor shapes and each payload's bytes (as the file's spec sizes
    them) of a well-formed ``TLSF32B`` file, for a description of it."""
    reader, _ = _read(path, None, None, skip=True)
    return reader.version, reader.found, reader.sizes


@names_the_file()
def is_float32_state(path: PathOrFile) -> bool:
    """Whether the file starts with the ``TLSF32B`` magic (any version)."""
    with open_source(path) as src:
        head = src.file.read(len(FLOAT32_STATE_MAGIC))
        src.file.seek(src.start)
    return head == FLOAT32_STATE_MAGIC
