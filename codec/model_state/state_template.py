"""A ``TLSF32B`` file as a destination expects it: every byte outside the payloads, in advance.

With a destination, a model-state file holds nothing the reader does not already know except
its payloads: the framing of the version written, the tensor count, and each record's header
(rank, dims, element count) follow from the destination's shapes. :func:`template_for`
packs them once per layout, from the spec's own compiled plan (no field is restated here),
and caches the result; :func:`check_headers` reads every header region of a file in a few
vectored calls and compares all of them with one comparison.

Equal bytes mean the walker would decode exactly the destination's values, every one of
which passes the spec's checks: the file is the one the walker accepts, with its payloads
where the template says. Any difference (or another size) proves nothing by itself: the
caller then walks the file, which raises the exact error with its offset.
"""

from __future__ import annotations

import struct
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from construct import Container
from construct.core import evaluate

from ...formats import registry
from ...formats.float32_state import WRITTEN_VERSION
from ...formats.framing import FLOAT32_STATE_MAGIC
from ...formats.primitives import product
from ..fileio.source import Source
from ..fileio.transfer import Extents, address_of, read_extents
from ..spec.plan import PayloadStep, Records, Run, U64Array, compile_struct, header_format

__all__ = [
    "StateTemplate",
    "record_values",
    "template_for",
    "shape_tuples",
    "check_headers",
    "CACHED_LAYOUTS",
]

#: Layouts whose templates are kept (a training job loads one or two).
CACHED_LAYOUTS = 8


def record_values(shape: tuple[int, ...]) -> dict[str, Any]:
    """The header values of a tensor record of ``shape`` (what the destination expects)."""
    return {"rank": len(shape), "dims": shape, "element_count": product(shape)}


@dataclass(frozen=True)
class StateTemplate:
    """The expected bytes of a ``TLSF32B`` file for a list of shapes.

    Offsets are relative to the file's first byte.

    Attributes:
        shapes: the destination's shapes.
        size: the file's size in bytes.
        headers: every region that is not a payload, concatenated, in file order: region
            ``k`` is record ``k``'s header, the first one preceded by the file's head
            (framing, tensor count); a file of no tensors is its head alone.
        header_offsets, header_lengths: where each of those regions lies.
        payload_offsets, payload_lengths: where each tensor's payload lies, its size.
    """

    shapes: tuple[tuple[int, ...], ...]
    size: int
    headers: bytes
    header_offsets: np.ndarray
    header_lengths: np.ndarray
    payload_offsets: np.ndarray
    payload_lengths: np.ndarray

    def header_starts(self) -> np.ndarray:
        """Where each header region starts in :attr:`headers`."""
        return np.concatenate(([0], np.cumsum(self.header_lengths)[:-1])).astype(np.int64)


def _build(shapes: tuple[tuple[int, ...], ...]) -> StateTemplate | None:
    """The template of the written version's spec, or ``None`` for a spec of another shape
    (then every file is walked)."""
    spec = registry.lookup(FLOAT32_STATE_MAGIC, WRITTEN_VERSION)
    if spec is None:  # pragma: no cover - registered at import
        return None
    steps = compile_struct(spec.struct)
    lead = 0
    while lead < len(steps) and type(steps[lead]) in (Run, U64Array):
        lead += 1
    if lead != len(steps) - 1 or type(steps[lead]) is not Records:
        return None
    records: Records = steps[lead]
    tail = records.item.steps[records.prefix :] if records.prefix else ()
    if not records.simple_tail or not all(type(t) is PayloadStep for t in tail):
        return None
    # The head's one free field is the record count, as the count expression reads it.
    free = [
        name
        for step in steps[:lead]
        if type(step) is Run
        for name, checks in zip(step.names, step.checks)
        if name and not any(kind.value == "const" for kind, _ in checks)
    ]
    if len(free) != 1 or type(steps[0]) is not Run:
        return None
    values = {free[0]: len(shapes)}
    try:
        if evaluate(records.count, Container(values)) != len(shapes):
            return None
        fmt, flat = header_format(steps[:lead], values)
        head = struct.pack(fmt, *flat)
        by_shape: dict[tuple[int, ...], tuple[bytes, int]] = {}
        for shape in set(shapes):
            known = record_values(shape)
            fmt, flat = header_format(records.item.steps[: records.prefix], known)
            ctx = Container(known)
            nbytes = 0
            for step in tail:
                count, dtype = step.payload.resolve(ctx)
                nbytes += count * dtype.itemsize
            by_shape[shape] = (struct.pack(fmt, *flat), nbytes)
    except (KeyError, TypeError, AttributeError, OverflowError, struct.error):
        return None  # a value the spec cannot hold: the walker says what is wrong
    parts = [by_shape[s] for s in shapes]
    # Header region k is record k's header (the first one preceded by the file's head),
    # followed by payload k; a file of no tensors is its head alone.
    regions = [h for h, _ in parts] or [b""]
    regions[0] = head + regions[0]
    header_lengths = np.array([len(h) for h in regions], dtype=np.int64)
    payload_lengths = np.array([n for _, n in parts], dtype=np.int64)
    sizes = np.zeros(2 * len(regions), dtype=np.int64)
    sizes[0::2] = header_lengths
    sizes[1 : 2 * len(parts) : 2] = payload_lengths
    starts = np.concatenate(([0], np.cumsum(sizes)))
    return StateTemplate(
        shapes=shapes,
        size=int(starts[-1]),
        headers=b"".join(regions),
        header_offsets=starts[0:-1:2],
        header_lengths=header_lengths,
        payload_offsets=starts[1 : 2 * len(parts) : 2],
        payload_lengths=payload_lengths,
    )


def shape_tuples(shapes: Sequence[Sequence[int]]) -> list[tuple[int, ...]]:
    """``shapes`` as tuples of ints: tuples (``torch.Size`` among them) are taken as they
    are, their dims are ints already; others are converted.

    Decided once per distinct type of shape (a model of 10^5 tensors has one or two), not
    per shape.
    """
    if all(issubclass(kind, tuple) for kind in set(map(type, shapes))):
        return list(shapes)
    return [s if isinstance(s, tuple) else tuple(map(int, s)) for s in shapes]


_CACHE: OrderedDict[tuple, StateTemplate | None] = OrderedDict()
_LOCK = threading.Lock()


def template_for(shapes: Sequence[tuple[int, ...]]) -> StateTemplate | None:
    """The (cached) template of a ``TLSF32B`` file for ``shapes``; ``None`` when the spec
    cannot be templated (every file is then walked)."""
    key = tuple(shapes)
    with _LOCK:
        hit = _CACHE.get(key, _CACHE)
        if hit is not _CACHE:
            _CACHE.move_to_end(key)
            return hit  # type: ignore[return-value]
    template = _build(key)
    with _LOCK:
        _CACHE[key] = template
        while len(_CACHE) > CACHED_LAYOUTS:
            _CACHE.popitem(last=False)
    return template


def check_headers(src: Source, template: StateTemplate) -> bool:
    """Whether the file behind ``src`` is exactly as long as ``template`` says and holds
    its header bytes; reads every header region (and small payloads between them, into
    scratch memory, so that runs of headers take one call), never a large payload.

    The file's position is left where it was.

    Raises:
        TruncatedError: the file shrank while it was read.
        OSError: from the file system.
    """
    if src.size - src.start != template.size:
        return False
    scratch = np.empty(len(template.headers), dtype=np.uint8)
    # The header regions alone: the reader reads small payloads between them too (into
    # scratch memory of its own) so that runs of small records take one call each.
    addresses = address_of(scratch) + template.header_starts().astype(np.uint64)
    extents = Extents.build(
        addresses, template.header_lengths, template.header_offsets + src.start, [scratch]
    )
    try:
        read_extents(src.file, extents, "record header")
    finally:
        src.seek(src.pos)  # a file object read piece by piece moved: put it back
    return scratch.tobytes() == template.headers
