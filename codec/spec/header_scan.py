"""Records of changing layouts scanned in batches: each header looked up by its bytes.

:func:`~.batches.scan_batch` takes runs of records laid out alike. A file whose records change
shape from one to the next (a model's tensors, in order) has no such runs, but few distinct
headers: here each record of an in-memory chunk is identified by a dictionary lookup of its
header's bytes among the headers already decoded in the array (by
:func:`~.batches.decode_layout`, the same decoding and checks as the run scanner), and only
a header never met before is decoded. The batch goes to the visitor's ``on_records`` like a
run, as a :class:`~.batches.RecordBatch` of ``layouts`` and per-record ``kinds``.

Why a lookup is exact: a header's parse is a deterministic prefix parse whose bytes consumed,
counts and checks are functions of its own fields and of the array's parent fields (which do
not change within the array); :func:`~.batches.decode_layout` refuses any record whose
decoding reads its index or a payload. So a record whose leading bytes equal a known valid
header of ``n`` bytes decodes to that header; and since no valid header is a proper prefix of
another (the parse of the longer one would stop at the shorter one's end), at most one known
header matches.
"""

from __future__ import annotations

import numpy as np
from construct import Container

from . import batches
from .batches import MAX_STRIDE, ChunkWindow, RecordBatch, RecordLayout, decode_layout
from .plan import Records

__all__ = ["Headers", "scan_decoded"]


class Headers:
    """The distinct record headers decoded so far in one array, found by their exact bytes."""

    def __init__(self) -> None:
        self.layouts: list[RecordLayout] = []
        self.strides: list[int] = []
        #: ``(header size, {header bytes: index in layouts})``, one entry per header size.
        self.tables: list[tuple[int, dict[bytes, int]]] = []

    def add(self, buf: bytes, p: int, layout: RecordLayout) -> int:
        """Note the header of ``layout`` found at ``buf[p:]``; returns its index."""
        kind = len(self.layouts)
        self.layouts.append(layout)
        self.strides.append(layout.stride)
        key = buf[p : p + layout.header]
        for size, table in self.tables:
            if size == layout.header:
                table[key] = kind
                break
        else:
            self.tables.append((layout.header, {key: kind}))
        return kind


def scan_decoded(
    window: ChunkWindow,
    step: Records,
    parent: Container,
    first: int,
    left: int,
    headers: Headers,
) -> RecordBatch | None:
    """Records from ``first`` on (at most ``left`` of them, within one chunk), each found
    among ``headers`` by its header bytes or decoded, as far as every record decodes and
    fits the chunk; ``None`` if the first does not.

    Does not move the source's tracked position (the file's own position may move).
    """
    pos = window.src.pos
    # The first record decoded from a page first: a large record (a tensor's payload) is
    # walked, its payload sought over, instead of read with a chunk (``open_checkpoint`` of
    # a file of large tensors would read a chunk per record; issue #21: <= 1 MiB).
    head, q = window.view(pos, MAX_STRIDE)
    layout = decode_layout(step, head, q, parent, first)
    if layout is None or layout.stride > MAX_STRIDE:
        return None
    buf, p = window.view(pos, batches.CHUNK_BYTES)  # read at call time (tests shrink it)
    start, end = p, len(buf)
    kinds: list[int] = []
    strides, tables = headers.strides, headers.tables
    append = kinds.append
    n = 0
    while n < left:
        # The hot loop: one slice and one dictionary lookup per header size met so far.
        for size, table in tables:
            kind = table.get(buf[p : p + size])
            if kind is not None:
                break
        else:
            layout = decode_layout(step, buf, p, parent, first + n)
            if layout is None or layout.stride > MAX_STRIDE:
                break
            kind = headers.add(buf, p, layout)
        stride = strides[kind]
        if p + stride > end:
            break
        append(kind)
        p += stride
        n += 1
    if not kinds:
        return None
    which = np.array(kinds, dtype=np.intp)
    sizes = np.array(strides, dtype=np.int64)[which]
    starts = np.empty(n, dtype=np.int64)
    starts[0] = window.base + start
    np.cumsum(sizes[:-1], out=starts[1:])
    starts[1:] += starts[0]
    layouts = tuple(headers.layouts)
    return RecordBatch(
        first, n, int(starts[0]), 0, {}, {}, layouts[kinds[0]].payloads, layouts, which, starts
    )
