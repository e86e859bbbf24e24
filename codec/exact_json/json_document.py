"""Reading an exact-bits JSON document's bytes within bounds, and refusing duplicate keys.

A JSON document is parsed whole, so how much of a file a reader takes into memory is decided
before it reads it:

* **From the first bytes** (:func:`check_start`): at most
  :data:`~tlckpt.codec.sniffing.HEAD_BYTES` are looked at. A binary magic names the family
  the file is; a first significant byte other than ``{`` cannot start the document. Either
  way the file is refused without reading the rest.
* **From the destination** (:func:`largest_document`): a reader that knows the shapes and the
  encoding it expects refuses a file larger than the largest valid encoding of them, from the
  file's size alone. The allowances below are generous: TorchLean's pretty printer (each
  word on its own indented line, about a dozen bytes besides its digits) and ours (``", "``)
  take a fraction of them.
* **From a cap** (:data:`DEFAULT_MAX_JSON_BYTES`): a reader without a destination
  (``inspect``, ``validate``, ``convert``) refuses a file above ``max_json_bytes``.

Duplicate keys: a JSON object that names ``format``, ``state``, ``shape`` or ``values`` twice
is read differently by different readers (orjson and Python's ``json`` keep the last, others
the first or refuse), so it is refused (:func:`duplicate_key_error`).
"""

from __future__ import annotations

import itertools
import math
import operator
import re
from collections.abc import Iterator, Sequence
from typing import Any

import orjson

from ...formats.state_bits import (
    DOCUMENT_SKETCH,
    ENTRY_KEYS,
    FORMAT_KEY,
    SHAPE_KEY,
    STATE_KEY,
    TOP_KEYS,
    VALUES_KEY,
    ScalarFormat,
)
from ..errors import FileTooLargeError, MalformedError
from ..families import families_differ
from ..fileio.source import Source
from ..sniffing import HEAD_BYTES, JSON_FAMILY, JSON_WHITESPACE, UTF8_BOM, magic_family

__all__ = [
    "DEFAULT_MAX_JSON_BYTES",
    "DIM_ALLOWANCE",
    "DOCUMENT_ALLOWANCE",
    "READ_CHUNK",
    "TENSOR_ALLOWANCE",
    "WORD_ALLOWANCE",
    "check_start",
    "duplicate_key_error",
    "duplicate_key_anywhere",
    "parse_embedded_json",
    "keys_counted_once",
    "largest_document",
    "read_document",
]

#: The largest exact-bits JSON file read without a destination (``inspect``, ``validate``,
#: ``convert``): 4 GiB. safetensors caps its JSON *header* at 100 MB; a JSON state file holds
#: the payload too (about 11 bytes per float32 value), so the cap must let real models
#: through: 4 GiB is some 390 million float32 values. A reader holds the document and its
#: words in memory, so more than that calls for a binary format, a destination (which bounds
#: the read by itself) or a larger ``max_json_bytes``.
DEFAULT_MAX_JSON_BYTES = 4 << 30

#: Bytes allowed per word besides its digits: separator, newline and indentation.
WORD_ALLOWANCE = 32
#: Bytes allowed per dimension of a shape besides its digits (at most 20).
DIM_ALLOWANCE = 32
#: Bytes allowed per tensor: braces, the ``shape`` and ``values`` keys, indentation, and a
#: small unknown member (a name, say).
TENSOR_ALLOWANCE = 1024
#: Bytes allowed per document: the format tag, keys, leading and trailing whitespace, and
#: unknown top-level members.
DOCUMENT_ALLOWANCE = 1 << 20

#: Bytes of a JSON document read per call (each checked for NUL bytes before the next).
READ_CHUNK = 64 << 20

_DIM_DIGITS = 20  # len(str(2**64 - 1)): a larger dimension is no JSON integer orjson keeps
#: How a JSON value that is not an object starts.
_OTHER_VALUE = re.compile(rb'[\["\-0-9]|true|false|null')


def largest_document(shapes: Sequence[tuple[int, ...]], fmt: ScalarFormat) -> int:
    """The largest valid encoding, in bytes, of tensors of ``shapes`` in ``fmt``.

    Every word is counted with the digits of ``2**width - 1`` and :data:`WORD_ALLOWANCE`
    (a complex value: two words and one more allowance for its brackets), every dimension
    with 20 digits and :data:`DIM_ALLOWANCE`, every tensor with :data:`TENSOR_ALLOWANCE` and
    the document with :data:`DOCUMENT_ALLOWANCE`.
    """
    word = len(str((1 << fmt.width) - 1)) + WORD_ALLOWANCE
    value = 2 * word + WORD_ALLOWANCE if fmt.pair else word
    elements = sum(map(math.prod, shapes))
    dims = sum(map(len, shapes))
    return (
        DOCUMENT_ALLOWANCE
        + len(shapes) * TENSOR_ALLOWANCE
        + dims * (_DIM_DIGITS + DIM_ALLOWANCE)
        + elements * value
    )


def check_start(src: Source) -> None:
    """Refuse, from its first bytes alone, a file that cannot be an exact-bits JSON document.

    Reads at most :data:`~tlckpt.codec.sniffing.HEAD_BYTES` and leaves the position where it
    was. A document whose leading whitespace runs past them is left to the full read.

    Raises:
        UnsupportedFormatError: the file starts with the magic of a binary family.
        MalformedError: it is empty, starts with a byte order mark or with anything but JSON
            whitespace and ``{`` (a JSON value that is not an object, or no JSON at all).
    """
    head = src.peek(HEAD_BYTES)
    found = magic_family(head)
    if found is not None:
        raise families_differ(found, JSON_FAMILY)
    if head.startswith(UTF8_BOM):
        raise MalformedError(
            "not JSON: the document starts with a UTF-8 byte order mark",
            field="document",
            actual=head[:8],
        )
    text = head.lstrip(JSON_WHITESPACE)
    if not text:
        if len(head) < src.remaining:
            return  # more leading whitespace than the head: judged by the full read
        raise MalformedError(
            "not JSON: the document is empty" + (" (whitespace only)" if head else ""),
            field="document",
        )
    if text[0] == ord("{"):
        return
    if _OTHER_VALUE.match(text):
        raise MalformedError(
            f"top level is not a JSON object: the document starts with {text[:16]!r}, "
            f"expected an object {DOCUMENT_SKETCH}",
            field="document",
            actual=text[:16],
            expected="object",
        )
    raise MalformedError(
        f"not JSON: the document starts with {text[:16]!r}", field="document", actual=text[:16]
    )


def read_document(src: Source, limit: int, bound: str) -> bytes | bytearray:
    """The bytes of the JSON document from the current position to the end of the file.

    The first bytes decide first (:func:`check_start`); then the size, before anything else
    is read. The document is then read :data:`READ_CHUNK` bytes at a time, and refused at
    the first NUL byte, which no JSON text holds (in a string it would be escaped): the
    hole of a sparse file is refused as soon as it is reached, not after it has been read
    whole.

    Args:
        src: the file.
        limit: the most bytes the document may have.
        bound: what ``limit`` is, for the message ("the JSON read cap", ...).

    Raises:
        FileTooLargeError: the document has more than ``limit`` bytes.
        UnsupportedFormatError, MalformedError: from :func:`check_start`; a NUL byte.
        TruncatedError: the file shrank while it was read.
    """
    check_start(src)
    size = src.remaining
    if size > limit:
        raise FileTooLargeError(
            f"{size:,} bytes, more than {bound} ({limit:,} bytes); not read",
            field="document",
            actual=size,
            expected=f"at most {limit} bytes",
        )
    data = src.read(min(READ_CHUNK, size), "JSON document")
    _refuse_nul(data, 0, size)
    if len(data) == size:
        return data  # one read, no copy: documents up to READ_CHUNK bytes
    grown = bytearray(data)  # grows in place: large blocks are remapped, not copied
    del data
    while len(grown) < size:
        piece = src.read(min(READ_CHUNK, size - len(grown)), "JSON document")
        _refuse_nul(piece, len(grown), size)
        grown += piece
    return grown


def _refuse_nul(piece: bytes, at: int, size: int) -> None:
    nul = piece.find(0)
    if nul >= 0:
        raise MalformedError(
            f"not JSON: a NUL byte at position {at + nul} of {size:,}"
            " (a sparse or zero-filled region?)",
            field="document",
            actual="NUL",
        )


# --------------------------------------------------------------------------- duplicate keys

#: The members that mean something, by the object that holds them.
_TOP_KEYS = frozenset(TOP_KEYS)
_ENTRY_KEYS = frozenset(ENTRY_KEYS)

#: A string literal, with the colon after it when it is a member name; or a bracket.
_TOKEN = re.compile(rb'("[^"\\]*(?:\\.[^"\\]*)*")(?:[ \t\n\r]*(:))?|[\[\]{}]')
_TOP, _STATE, _ENTRY, _OTHER = range(4)


def keys_counted_once(text: bytes, document: Any) -> bool:
    """Whether counting key texts proves that no meaningful key of ``document`` is doubled.

    ``text`` is the document's JSON without a backslash (so every key is spelled plainly): a
    key that ``document`` holds once appears at least once as ``"key"``, a doubled one at
    least twice, so equal counts rule duplicates out. ``False`` means "count again, exactly".
    """
    if type(document) is not dict:
        return True  # no member of a non-object document means anything
    state = document.get(STATE_KEY)
    entries = state if type(state) is list else []
    if not set(map(type, entries)) <= {dict}:
        entries = [e for e in entries if type(e) is dict]
    for key, present in (
        (FORMAT_KEY, FORMAT_KEY in document),
        (STATE_KEY, STATE_KEY in document),
        (SHAPE_KEY, sum(map(operator.contains, entries, itertools.repeat(SHAPE_KEY)))),
        (VALUES_KEY, sum(map(operator.contains, entries, itertools.repeat(VALUES_KEY)))),
    ):
        if text.count(b'"%s"' % key.encode()) != present:
            return False
    return True


def _keys_and_brackets(data: bytes | bytearray) -> Iterator[tuple[str | None, bytes]]:
    """The object keys and brackets of the valid JSON text ``data``, in order: ``(key,
    b"")`` for a key (decoded, so that ``"\\u0073tep"`` is ``step``), ``(None, bracket)``
    for a bracket; string values are passed over."""
    for match in _TOKEN.finditer(data):
        literal = match.group(1)
        if literal is None:
            yield None, match.group()
        elif match.group(2) is not None:  # a key (a string value has no colon after it)
            yield (orjson.loads(literal) if b"\\" in literal else literal[1:-1].decode()), b""


def duplicate_key_error(data: bytes, document: Any) -> MalformedError | None:
    """The error for the first meaningful key an object of ``data`` holds twice, or ``None``.

    ``data`` is valid JSON and ``document`` what orjson made of it. Meaningful keys are
    ``format`` and ``state`` in the top-level object and ``shape`` and ``values`` in the
    objects of the ``state`` array; keys are compared as JSON strings (``"\\u0076alues"`` is
    ``values``). A cheap count settles plain documents (:func:`keys_counted_once`); others
    are scanned token by token (strings and brackets only).
    """
    if type(document) is not dict:
        return None  # no member of a non-object document means anything
    if b"\\" not in data and keys_counted_once(data, document):
        return None
    # Frames: [role, keys seen, last key, objects among the children]
    stack: list[list[Any]] = []
    for key, bracket in _keys_and_brackets(data):
        if key is not None:
            frame = stack[-1]
            frame[2] = key
            names = _TOP_KEYS if frame[0] == _TOP else _ENTRY_KEYS if frame[0] == _ENTRY else ()
            if key in names:
                if key in frame[1]:
                    return _duplicate(key, frame, stack, document)
                frame[1].add(key)
            continue
        if bracket in (b"]", b"}"):
            stack.pop()
            continue
        parent = stack[-1] if stack else None
        role = _OTHER
        if parent is None:
            role = _TOP if bracket == b"{" else _OTHER
        elif parent[0] == _TOP and bracket == b"[" and parent[2] == STATE_KEY:
            role = _STATE
        elif parent[0] == _STATE and bracket == b"{":
            role = _ENTRY
        if parent is not None and bracket == b"{":
            parent[3] += 1
        stack.append([role, set(), None, 0])
    return None


def _duplicate(key: str, frame: list[Any], stack: list[list[Any]], document: Any) -> MalformedError:
    reason = "JSON readers disagree on which one counts"
    if frame[0] == _TOP:
        return MalformedError(
            f'duplicate key "{key}" in the top-level object: {reason}',
            field=key,
            actual=f"{key} twice",
            expected="each key once",
        )
    # The entry is the k-th object of the state array; its index counts other values too.
    k = stack[-2][3] - 1
    state = document.get(STATE_KEY) if type(document) is dict else None
    objects = [i for i, e in enumerate(state) if type(e) is dict] if type(state) is list else []
    index = objects[k] if k < len(objects) else k
    return MalformedError(
        f'duplicate key "{key}" in state tensor {index}: {reason}',
        field=f"{STATE_KEY}[{index}].{key}",
        actual=f"{key} twice",
        expected="each key once",
    )


def parse_embedded_json(text: str, field: str) -> Any:
    """A JSON document held in a string (a safetensors metadata value), parsed; refused when
    it is not JSON or some object names a key twice (readers disagree on which one counts).

    Args:
        text: the string.
        field: what the message and the error name.

    Returns:
        The parsed JSON values.

    Raises:
        MalformedError: not JSON (or not encodable as UTF-8), or a key named twice.
    """
    try:
        raw = text.encode()
        loaded = orjson.loads(raw)
    except (orjson.JSONDecodeError, UnicodeEncodeError) as exc:
        raise MalformedError(f"{field} is not JSON: {exc}", field=field) from None
    duplicate = duplicate_key_anywhere(raw)
    if duplicate is not None:
        raise MalformedError(f"{field} names {duplicate!r} twice", field=field)
    return loaded


def duplicate_key_anywhere(data: bytes | bytearray) -> str | None:
    """The first key that some object of the valid JSON text ``data`` holds twice, or
    ``None``.

    For documents every key of which means something (a checkpoint set's manifest and
    training state), where :func:`duplicate_key_error`'s per-role view does not apply. Keys
    are compared as JSON strings (``"\\u0073tep"`` is ``step``); one pass over the string
    and bracket tokens.
    """
    stack: list[set[str] | None] = []  # the keys seen by each open object (None: an array)
    for key, bracket in _keys_and_brackets(data):
        if key is None:
            if bracket in (b"]", b"}"):
                stack.pop()
            else:
                stack.append(set() if bracket == b"{" else None)
            continue
        keys = stack[-1]
        if keys is None:  # pragma: no cover - valid JSON has no key inside an array
            continue
        if key in keys:
            return key
        keys.add(key)
    return None
