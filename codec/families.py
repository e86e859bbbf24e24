"""Which family a file is, decided from its first bytes; one wording for the wrong family.

A binary family is told by its registered magic (``TLADAMF``, ``TLSF32B``); exact-bits JSON by
the first significant byte of the document. Readers, ``inspect`` and the command line all
decide from at most :data:`HEAD_BYTES` bytes, so a file of the wrong kind is refused before
the rest of it is read, and a file of one family handed to a reader (or a destination) of
another is named the same way everywhere (:func:`families_differ`).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..formats import registry
from .errors import UnsupportedFormatError

__all__ = [
    "HEAD_BYTES",
    "JSON_FAMILY",
    "JSON_WHITESPACE",
    "UTF8_BOM",
    "families_differ",
    "family_title",
    "magic_family",
]

#: The family name of exact-bits JSON model state (it has no magic).
JSON_FAMILY = "state_bits"

#: Bytes looked at to decide a file's family: every magic, and the leading JSON whitespace a
#: document may have before its first significant byte. A document with more leading
#: whitespace than this is not refused from its head: it is read, under its bound, and judged
#: whole.
HEAD_BYTES = 4096

#: The four bytes JSON counts as whitespace (RFC 8259).
JSON_WHITESPACE = b" \t\n\r"

#: A UTF-8 byte order mark, which RFC 8259 does not allow a JSON text to start with.
UTF8_BOM = b"\xef\xbb\xbf"

#: What each family holds, for messages.
_CONTENTS = {
    "adam": "Adam/AdamW optimizer state",
    "float32_state": "float32 model state",
    JSON_FAMILY: "model state",
}


def magic_family(head: bytes) -> str | None:
    """The family whose registered magic ``head`` starts with, or ``None``."""
    for magic, family in registry.FAMILIES.items():
        if head.startswith(magic):
            return family
    return None


def family_title(family: str) -> str:
    """The family as a noun phrase: ``"a TLSF32B file (float32 model state)"``."""
    if family == JSON_FAMILY:
        name = "an exact-bits JSON file"
    else:
        magic = next((m for m, f in registry.FAMILIES.items() if f == family), None)
        name = f"a {magic.decode('ascii', 'replace') if magic else family} file"
    contents = _CONTENTS.get(family)
    return f"{name} ({contents})" if contents else name


def families_differ(
    found: str, expected: str | Sequence[str], destination: str | None = None
) -> UnsupportedFormatError:
    """The error for a file of family ``found`` where ``expected`` (one or several) was wanted.

    Args:
        found: the file's family, from its first bytes.
        expected: the family (or families) the reader or destination takes.
        destination: where the expectation came from (a reference file), for the message.

    Returns:
        An :class:`UnsupportedFormatError` saying the families differ; the caller raises it.
    """
    wanted = [expected] if isinstance(expected, str) else list(expected)
    others = " or ".join(family_title(f) for f in wanted)
    source = "" if destination is None else f" as the destination ({destination}) requires"
    return UnsupportedFormatError(
        f"the families differ: this is {family_title(found)}, not {others}{source}",
        field="magic",
        actual=found,
        expected=wanted[0] if len(wanted) == 1 else tuple(wanted),
    )
