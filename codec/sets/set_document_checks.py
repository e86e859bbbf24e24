"""Checks shared by a checkpoint set's JSON documents: parsing one within its bound, each key
once; its ``format`` and ``version``; exact keys; integer and string fields. Every rejection
is a :class:`~.errors.CheckpointError` subclass naming the field.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from ...formats import checkpoint_set as layout
from ..errors import (
    FileTooLargeError,
    MalformedError,
    UnsupportedFormatError,
    UnsupportedVersionError,
)
from ..exact_json.json_document import duplicate_key_anywhere

__all__ = [
    "parse_json_document",
    "check_format",
    "exact_keys",
    "integer_field",
    "string_field",
    "short",
]


def parse_json_document(data: bytes, what: str, limit: int) -> dict[str, Any]:
    """Parse one of the set's documents: bounded, orjson, an object, each key once.

    Raises:
        FileTooLargeError: more than ``limit`` bytes.
        MalformedError: not JSON, not an object, or a key twice in some object.
    """
    if len(data) > limit:
        raise FileTooLargeError(
            f"the {what} has {len(data):,} bytes, more than the {limit:,} a {what} may have",
            field=what,
            actual=len(data),
            expected=f"at most {limit} bytes",
        )
    try:
        document = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise MalformedError(f"the {what} is not JSON: {exc}", field=what) from None
    if type(document) is not dict:
        raise MalformedError(
            f"the {what} must be a JSON object, not {type(document).__name__}", field=what
        )
    duplicate = duplicate_key_anywhere(data)
    if duplicate is not None:
        raise MalformedError(
            f"the {what} names the key {duplicate!r} twice in one object: JSON readers"
            " disagree on which one counts",
            field=what,
            actual=f"{duplicate} twice",
            expected="each key once",
        )
    return document


def exact_keys(document: dict[str, Any], keys: Sequence[str], what: str) -> None:
    """Check that ``document`` has exactly ``keys``: none missing, none unknown.

    Raises:
        MalformedError: a key is missing or unknown (both listed).
    """
    missing = [k for k in keys if k not in document]
    unknown = [k for k in document if k not in keys]
    if missing or unknown:
        raise MalformedError(
            f"the {what} "
            + "; ".join(
                part
                for part in (
                    f"lacks {', '.join(map(repr, missing))}" if missing else "",
                    f"has unknown keys {', '.join(repr(k[:40]) for k in unknown[:5])}"
                    if unknown
                    else "",
                )
                if part
            ),
            field=what,
            actual=sorted(document)[:16],
            expected=list(keys),
        )


def integer_field(value: Any, field: str, low: int, high: int) -> int:
    """``value`` if it is an integer in ``[low, high]``.

    Raises:
        MalformedError: it is not (``field`` named).
    """
    if type(value) is not int or not low <= value <= high:
        raise MalformedError(
            f"{field} must be an integer in [{low}, {high}], got {short(value)}",
            field=field,
            actual=short(value),
            expected=f"integer in [{low}, {high}]",
        )
    return value


def string_field(value: Any, field: str, limit: int | None = None) -> str:
    """``value`` if it is a string of at most ``limit`` bytes in UTF-8 (default: the
    table's ``LIMITS.name_bytes``).

    Raises:
        MalformedError: it is not (``field`` named).
    """
    if limit is None:
        limit = layout.LIMITS.name_bytes
    if type(value) is not str or len(value.encode("utf-8", "surrogatepass")) > limit:
        raise MalformedError(
            f"{field} must be a string of at most {limit} bytes, got {short(value)}",
            field=field,
            actual=short(value),
        )
    return value


def short(value: Any) -> str:
    """``repr(value)``, cut to 60 characters (for messages about hostile values)."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_format(
    document: dict[str, Any], tag: str, version: int, what: str, where: str = ""
) -> None:
    """Check a document's ``format`` tag and ``version``.

    Args:
        document: the parsed document.
        tag: the ``format`` it must have.
        version: the ``version`` it must have.
        what: the document's kind, for the messages.
        where: the document's own field path, with a trailing dot, for a document held in
            a field (an optimizer tree's, in a safetensors header's metadata).

    Raises:
        UnsupportedFormatError: ``format`` is not ``tag``.
        UnsupportedVersionError: ``version`` is not ``version``.
    """
    if document.get("format") != tag:
        raise UnsupportedFormatError(
            f"not a {what}: format is {short(document.get('format'))}, expected {tag!r}",
            field=f"{where}format",
            actual=short(document.get("format")),
            expected=tag,
        )
    found = document.get("version")
    if found != version or type(found) is not int:
        raise UnsupportedVersionError(
            f"{what} version {short(found)} is not known; known versions: {version}",
            field=f"{where}version",
            actual=short(found),
            expected=version,
        )
