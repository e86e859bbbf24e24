"""The safetensors header: parsed and checked rule by rule, or built the reference's way.

Parsing takes the header's bytes and the size of the data region after it and either returns
a :class:`Header` whose entries tile that region exactly, or raises a
:class:`~tlckpt.codec.errors.CheckpointError` subclass naming the rule, the entry and the
header's offset. Everything the reference reader accepts is accepted (unpadded or pretty
headers, entries in any order, ``__metadata__`` anywhere or ``null``, zero-size tensors at
one offset); beyond it, duplicate names and members other than ``dtype``/``shape``/
``data_offsets`` are refused, since readers disagree on them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from ...formats.primitives import U64_MAX, pack_u64, product
from ...formats.safetensors import (
    ALIGNMENT,
    DATA_OFFSETS_KEY,
    DTYPE_BY_NAME,
    DTYPE_KEY,
    DTYPE_RANK,
    ENTRY_KEYS,
    HEADER_LENGTH_SIZE,
    HEADER_LIMIT,
    HEADER_START,
    METADATA_KEY,
    PADDING,
    SHAPE_KEY,
    SafetensorsDtype,
)
from ..errors import (
    CheckpointError,
    ConfigError,
    FileTooLargeError,
    MalformedError,
    SchemaMismatchError,
    TrailingDataError,
    TruncatedError,
)
from ..exact_json.json_document import duplicate_key_anywhere

__all__ = [
    "Header",
    "TensorEntry",
    "build_header",
    "byte_length",
    "check_header_length",
    "layout_order",
    "parse_header",
]

_KEYS = frozenset(ENTRY_KEYS)


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of a header.

    Attributes:
        name: its name.
        dtype: its element type.
        shape: its dims.
        begin, end: its bytes, relative to the start of the data region.
    """

    name: str
    dtype: SafetensorsDtype
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def nbytes(self) -> int:
        """Bytes of its data."""
        return self.end - self.begin

    @property
    def elements(self) -> int:
        """Its element count."""
        return product(self.shape)


@dataclass(frozen=True)
class Header:
    """A checked header.

    Attributes:
        entries: every tensor by name, in the header's order.
        metadata: the ``__metadata__`` mapping, or ``None`` when the header has none.
        header_length: bytes of the header (padding included).
        data_size: bytes of the data region.
    """

    entries: dict[str, TensorEntry]
    metadata: dict[str, str] | None
    header_length: int
    data_size: int

    @property
    def data_start(self) -> int:
        """Offset of the data region from the start of the file."""
        return HEADER_LENGTH_SIZE + self.header_length

    def entry(self, name: str) -> TensorEntry:
        """The entry called ``name``.

        Raises:
            SchemaMismatchError: the file has no tensor of that name.
        """
        found = self.entries.get(name)
        if found is None:
            raise SchemaMismatchError(
                f"no tensor named {name!r} in this file", field=name, actual=None, expected=name
            )
        return found


def byte_length(dtype: SafetensorsDtype, shape: Sequence[int]) -> int | None:
    """Bytes of a tensor of ``dtype`` and ``shape``: ``None`` when its bits are not a whole
    number of bytes (a sub-byte dtype); the count is capped like :func:`product`."""
    bits = product(shape) * dtype.bits
    return None if bits % 8 else bits // 8


def _bad(message: str, field: str, actual: Any = None, expected: Any = None) -> MalformedError:
    return MalformedError(
        message, offset=HEADER_LENGTH_SIZE, field=field, actual=actual, expected=expected
    )


def _not_a(what: str, value: Any, wanted: str, field: str) -> MalformedError:
    """``what`` must be ``wanted`` (``"an object"``, ``"a string"``), and ``value`` is not."""
    kind = type(value).__name__
    return _bad(f"{what} must be {wanted}, not {kind}", field, kind, wanted.split()[1])


def _is_u64(value: Any) -> bool:
    return type(value) is int and 0 <= value <= U64_MAX


def _metadata(value: Any) -> dict[str, str] | None:
    if value is None:  # the reference reads null as "no metadata"
        return None
    if type(value) is not dict:
        raise _not_a(METADATA_KEY, value, "an object of strings", METADATA_KEY)
    for key, text in value.items():
        if type(text) is not str:
            raise _not_a(f"{METADATA_KEY}[{key!r}]", text, "a string", f"{METADATA_KEY}[{key!r}]")
    return value


def _entry(name: str, value: Any) -> TensorEntry:
    where = f"header[{name!r}]"
    if type(value) is not dict:
        raise _not_a(f"tensor {name!r}", value, "an object", where)
    if value.keys() != _KEYS:
        raise _bad(
            f"tensor {name!r} has members {sorted(value)}; expected exactly {list(ENTRY_KEYS)}",
            where,
            actual=sorted(value),
            expected=list(ENTRY_KEYS),
        )
    word = value[DTYPE_KEY]
    dtype = DTYPE_BY_NAME.get(word) if type(word) is str else None
    if dtype is None:
        raise ConfigError(
            f"tensor {name!r} has dtype {word!r}, which is no safetensors dtype",
            offset=HEADER_LENGTH_SIZE,
            field=f"{where}.{DTYPE_KEY}",
            actual=word,
            expected=sorted(DTYPE_BY_NAME),
        )
    shape = value[SHAPE_KEY]
    if type(shape) is not list or not all(map(_is_u64, shape)):
        raise _bad(
            f"tensor {name!r} has shape {shape!r}; a shape is a list of non-negative integers",
            f"{where}.{SHAPE_KEY}",
            actual=shape if type(shape) is not list else shape[:8],
            expected="list of u64",
        )
    offsets = value[DATA_OFFSETS_KEY]
    if type(offsets) is not list or len(offsets) != 2 or not all(map(_is_u64, offsets)):
        raise _bad(
            f"tensor {name!r} has data_offsets {offsets!r}; expected [begin, end]",
            f"{where}.{DATA_OFFSETS_KEY}",
            actual=offsets if type(offsets) is not list else offsets[:3],
            expected="[begin, end]",
        )
    begin, end = offsets
    nbytes = byte_length(dtype, shape)
    if nbytes is None:
        raise SchemaMismatchError(
            f"tensor {name!r}: {product(shape)} elements of {dtype.name} are not a whole"
            " number of bytes",
            offset=HEADER_LENGTH_SIZE,
            field=f"{where}.{SHAPE_KEY}",
            actual=shape[:8],
            expected=f"a multiple of 8 bits ({dtype.bits} per element)",
        )
    if end < begin or end - begin != nbytes:
        raise SchemaMismatchError(
            f"tensor {name!r}: data_offsets [{begin}, {end}] hold {end - begin} bytes;"
            f" {dtype.name} of shape {shape[:8]} needs {nbytes}",
            offset=HEADER_LENGTH_SIZE,
            field=f"{where}.{DATA_OFFSETS_KEY}",
            actual=end - begin,
            expected=nbytes,
        )
    return TensorEntry(name, dtype, tuple(shape), begin, end)


def _check_tiling(entries: Iterable[TensorEntry], data_size: int) -> None:
    """Sorted by offsets, the entries must tile ``[0, data_size)`` exactly, as the reference
    requires (no gap, no overlap, nothing after the last)."""
    at = 0
    for entry in sorted(entries, key=lambda e: (e.begin, e.end)):
        if entry.begin != at:
            what = "overlaps the tensor before it" if entry.begin < at else "leaves a gap"
            raise SchemaMismatchError(
                f"tensor {entry.name!r} begins at data byte {entry.begin} and {what}; each"
                f" tensor must begin where the previous ends ({at})",
                offset=HEADER_LENGTH_SIZE,
                field=f"header[{entry.name!r}].{DATA_OFFSETS_KEY}",
                actual=entry.begin,
                expected=at,
            )
        at = entry.end
    if at > data_size:
        raise TruncatedError(
            f"the tensors need {at} bytes of data; the file has {data_size}",
            field="data",
            actual=data_size,
            expected=at,
        )
    if at < data_size:
        raise TrailingDataError(
            f"{data_size - at} bytes after the last tensor's data",
            field="data",
            actual=data_size,
            expected=at,
        )


def _colons_accounted(raw: bytes, document: dict, metadata: dict[str, str] | None) -> bool:
    """Whether every ``:`` of ``raw`` (a header without a backslash, already checked entry by
    entry) is a key's separator or a character of a string the parsed ``document`` holds —
    which proves no object names a key twice: orjson keeps one of two equal keys, so a
    doubled key leaves at least its own separator unaccounted for. Costs one ``count`` of
    the bytes instead of a token scan (a header may have 100 MB)."""
    expected = len(document) + sum(name.count(":") for name in document)
    expected += len(ENTRY_KEYS) * (len(document) - (METADATA_KEY in document))
    if metadata:
        expected += len(metadata) + sum(k.count(":") + v.count(":") for k, v in metadata.items())
    return raw.count(b":") == expected


def parse_header(raw: bytes, data_size: int) -> Header:
    """Check a header and the tensors' placement in the data region.

    Args:
        raw: the header's bytes (as many as the header-length field says).
        data_size: bytes of the file after the header.

    Returns:
        The :class:`Header`.

    Raises:
        MalformedError: not UTF-8 JSON, not an object, a duplicate name, a member of the
            wrong type or an entry with other members.
        ConfigError: an unknown dtype.
        SchemaMismatchError: a byte length that is not the dtype's width times the element
            count, or tensors that overlap or leave a gap.
        TruncatedError / TrailingDataError: the data region is shorter or longer than the
            tensors need.
    """
    if raw[:1] != HEADER_START:
        raise _bad(
            f"a safetensors header starts with {HEADER_START!r}, this one with {raw[:1]!r}",
            "header",
            actual=raw[:1],
            expected=HEADER_START,
        )
    try:
        document = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:  # also non-UTF-8 bytes and nesting past 1024
        raise _bad(f"the header is not UTF-8 JSON: {exc}", "header") from None
    if type(document) is not dict:
        raise _bad("the header is not a JSON object", "header", actual=type(document).__name__)
    metadata = None
    entries: dict[str, TensorEntry] = {}
    for name, value in document.items():
        if name == METADATA_KEY:
            metadata = _metadata(value)
        else:
            entries[name] = _entry(name, value)
    if b"\\" in raw or not _colons_accounted(raw, document, metadata):
        duplicate = duplicate_key_anywhere(raw)
        if duplicate is not None:
            raise _bad(
                f"the header names {duplicate!r} twice: safetensors readers disagree on which"
                " one counts",
                f"header[{duplicate!r}]",
                actual=f"{duplicate} twice",
                expected="each name once",
            )
    _check_tiling(entries.values(), data_size)
    return Header(entries, metadata, len(raw), data_size)


def check_header_length(length: int, remaining: int) -> None:
    """Refuse a header length above :data:`HEADER_LIMIT` or beyond the end of the file,
    before the header is read (``remaining``: bytes after the length field)."""
    if length > HEADER_LIMIT:
        raise FileTooLargeError(
            f"the header length is {length} bytes; safetensors headers are at most {HEADER_LIMIT}",
            offset=0,
            field="header_length",
            actual=length,
            expected=f"<= {HEADER_LIMIT}",
        )
    if length > remaining:
        raise TruncatedError(
            f"the header length is {length} bytes; only {remaining} follow",
            offset=0,
            field="header_length",
            actual=remaining,
            expected=length,
        )


def layout_order(items: Iterable[tuple[str, str]]) -> list[str]:
    """The names of ``(name, dtype)`` pairs in the order the reference writer lays them out:
    by dtype, the later in :data:`~tlckpt.formats.safetensors.DTYPES` first, then by name
    (code-point order, which is UTF-8 byte order)."""
    return [name for name, _ in sorted(items, key=lambda item: (-DTYPE_RANK[item[1]], item[0]))]


def build_header(
    entries: Mapping[str, tuple[str, Sequence[int]]], metadata: Mapping[str, str] | None
) -> tuple[bytes, list[tuple[str, int, int]]]:
    """The header the reference writer makes for tensors of these dtypes and shapes.

    Args:
        entries: name → ``(dtype name, shape)``.
        metadata: string → string, or ``None`` for no ``__metadata__`` member (its keys are
            written sorted: the reference's order is its hash map's, i.e. arbitrary).

    Returns:
        The header's bytes, length field included and padded so the data region starts at a
        multiple of 8; and ``(name, begin, end)`` for each tensor in layout order.

    Raises:
        CheckpointError: an unknown dtype, a shape that is not a whole number of bytes, a
            name or metadata text JSON cannot hold, or a header above the limit.
    """
    document: dict[str, Any] = {}
    if metadata is not None:
        for key, text in metadata.items():
            if type(key) is not str or type(text) is not str:
                raise CheckpointError(
                    f"metadata must map strings to strings; {key!r} → {type(text).__name__}",
                    field=f"{METADATA_KEY}[{key!r}]",
                    actual=type(text).__name__,
                    expected="str",
                )
        document[METADATA_KEY] = {k: metadata[k] for k in sorted(metadata)}
    for name, (word, _) in entries.items():
        if type(name) is not str:
            raise CheckpointError(
                f"tensor names are strings, not {type(name).__name__}", field=repr(name)
            )
        if name == METADATA_KEY:
            raise CheckpointError(f"{METADATA_KEY!r} cannot name a tensor", field=name)
        if word not in DTYPE_BY_NAME:
            raise CheckpointError(f"unknown safetensors dtype {word!r}", field=name, actual=word)
    placed: list[tuple[str, int, int]] = []
    at = 0
    for name in layout_order((n, word) for n, (word, _) in entries.items()):
        word, shape = entries[name]
        dims = [int(d) for d in shape]
        nbytes = byte_length(DTYPE_BY_NAME[word], dims)
        if nbytes is None:
            raise CheckpointError(
                f"tensor {name!r}: {product(dims)} elements of {word} are not whole bytes",
                field=name,
                actual=dims,
            )
        document[name] = {DTYPE_KEY: word, SHAPE_KEY: dims, DATA_OFFSETS_KEY: [at, at + nbytes]}
        placed.append((name, at, at + nbytes))
        at += nbytes
    try:
        text = orjson.dumps(document)
    except (TypeError, orjson.JSONEncodeError) as exc:  # a lone surrogate, an int past u64
        raise CheckpointError(f"the header cannot be written as JSON: {exc}") from None
    text += PADDING * (-len(text) % ALIGNMENT)
    if len(text) > HEADER_LIMIT:
        raise CheckpointError(
            f"the header would be {len(text)} bytes; safetensors headers are at most"
            f" {HEADER_LIMIT}",
            field="header",
            actual=len(text),
            expected=f"<= {HEADER_LIMIT}",
        )
    return pack_u64(len(text)) + text, placed
