"""§5 of FORMAT.md: the scalar encodings of exact-bits JSON model state.

Every encoding is derived from its parameters (exponent bits, fraction bits, bias and the
special-value convention), never listed as a tag by hand: the tag, the word width and the
numpy dtype all follow from them. The two native IEEE formats keep the tags TorchLean had
before configured formats existed, so old files stay readable.

The JSON document itself::

    {"format": "<tag>", "state": [{"shape": [d, ...], "values": [w, ...]}, ...]}
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import ClassVar

__all__ = [
    "FORMAT_KEY",
    "STATE_KEY",
    "SHAPE_KEY",
    "VALUES_KEY",
    "TOP_KEYS",
    "ENTRY_KEYS",
    "DOCUMENT_SKETCH",
    "ENTRY_SKETCH",
    "DocumentLayout",
    "PRETTY",
    "COMPACT",
    "SPECIAL_VALUE_CONVENTIONS",
    "BinaryFormat",
    "ComplexFormat",
    "ScalarFormat",
    "ENCODINGS",
    "encoding_by_name",
    "parse_tag",
]

#: How a configured binary format spends its top exponent (see FORMAT.md §5).
SPECIAL_VALUE_CONVENTIONS = ("ieee", "finite-max-nan", "finite-unsigned-zero", "finite")

# --------------------------------------------------------------------------- the document

#: The top-level object's members: the encoding's tag, and the tensors in state order.
FORMAT_KEY = "format"
STATE_KEY = "state"
#: A tensor's members: its shape (non-negative integers) and its values, one word each
#: (``0 <= w < 2**width``; a complex value is the pair ``[re_word, im_word]``).
SHAPE_KEY = "shape"
VALUES_KEY = "values"
#: The members that mean something, by the object holding them. Each may appear once: JSON
#: readers disagree on which of two counts (orjson and Python keep the last, others the
#: first), so a document naming one twice is refused.
TOP_KEYS = (FORMAT_KEY, STATE_KEY)
ENTRY_KEYS = (SHAPE_KEY, VALUES_KEY)
#: The document and one tensor as messages sketch them.
DOCUMENT_SKETCH = f'{{"{FORMAT_KEY}": ..., "{STATE_KEY}": [...]}}'
ENTRY_SKETCH = f'{{"{SHAPE_KEY}": [...], "{VALUES_KEY}": [...]}}'


def _key(name: str) -> bytes:
    return json.dumps(name).encode()


@dataclass(frozen=True)
class DocumentLayout:
    """The bytes a writer puts around the tag and each tensor's shape and values.

    A document is ``start + tag + state``, then per tensor ``entry`` (``separator`` before
    all but the first), the shape (dims joined by ``dim_separator`` in brackets), ``values``,
    the words, ``end_entry``; then ``end`` (``end_empty`` when there is no tensor).
    """

    start: bytes
    state: bytes
    entry: bytes
    values: bytes
    end_entry: bytes
    separator: bytes
    dim_separator: bytes
    end: bytes
    end_empty: bytes


def _layout(
    space: bytes, indent: bytes, entry_indent: bytes, close: bytes, close_empty: bytes
) -> DocumentLayout:
    """A layout from its whitespace: after each colon and comma (``space``), before each
    member of the top-level object (``indent``) and before each tensor (``entry_indent``)."""
    colon, comma = b":" + space, b"," + space
    return DocumentLayout(
        start=b"{" + indent + _key(FORMAT_KEY) + colon,
        state=b"," + indent + _key(STATE_KEY) + colon + b"[",
        entry=entry_indent + b"{" + _key(SHAPE_KEY) + colon,
        values=comma + _key(VALUES_KEY) + colon,
        end_entry=b"}",
        separator=b",",
        dim_separator=comma,
        end=close,
        end_empty=close_empty,
    )


#: Indented, one line per tensor (TorchLean's own files differ only in whitespace).
PRETTY = _layout(b" ", b"\n  ", b"\n    ", b"\n  ]\n}\n", b"]\n}\n")
#: No whitespace at all.
COMPACT = _layout(b"", b"", b"", b"]}", b"]}")

# --------------------------------------------------------------------------- the encodings

_WORD_DTYPES = ((8, "<u1"), (16, "<u2"), (32, "<u4"), (64, "<u8"))
# Parameters are bounded in length: a tag comes from an untrusted file, and ``int()`` of a
# huge digit string is slow or (past 4300 digits) a ValueError. 20 digits hold any u64.
_BINARY_TAG = re.compile(
    r"torchlean_state_binary_(\d{1,20})_(\d{1,20})_(\d{1,20})_("
    + "|".join(SPECIAL_VALUE_CONVENTIONS)
    + r")_v1"
)
_COMPLEX_TAG = re.compile(r"torchlean_state_complex_v1\((.*)\)")
#: Deepest complex-of-complex nesting a tag may spell (no real format nests at all).
_MAX_TAG_DEPTH = 4


class _Words:
    """What every scalar format derives the same way from its word and native dtypes."""

    #: Whether a value is a ``[re, im]`` pair of words.
    pair: ClassVar[bool] = False
    native_dtype: str | None
    word_dtype: str

    @property
    def array_dtype(self) -> str:
        """The dtype of arrays handed to and returned by the codec: the native dtype, or
        the words (for a complex format, with a trailing axis of 2: re, im)."""
        return self.native_dtype or self.word_dtype


@dataclass(frozen=True)
class BinaryFormat(_Words):
    """A binary floating-point format: sign, ``exponent_bits``, ``fraction_bits``.

    Attributes:
        exponent_bits, fraction_bits, bias, convention: the parameters the tag is made of.
        legacy_tag: the tag of a native format written before configured formats existed.
        native_dtype: the numpy dtype holding these values, where numpy has one.
    """

    exponent_bits: int
    fraction_bits: int
    bias: int
    convention: str = "ieee"
    legacy_tag: str | None = None
    native_dtype: str | None = None

    def __post_init__(self) -> None:
        if self.convention not in SPECIAL_VALUE_CONVENTIONS:
            raise ValueError(f"unknown special-value convention {self.convention!r}")
        if self.exponent_bits < 1 or self.fraction_bits < 0 or self.bias < 0:
            raise ValueError("exponent bits must be >= 1, fraction bits and bias >= 0")

    @property
    def width(self) -> int:
        """Bits in one storage word: sign + exponent + fraction."""
        return 1 + self.exponent_bits + self.fraction_bits

    @property
    def tag(self) -> str:
        """The JSON ``format`` tag."""
        if self.legacy_tag is not None:
            return self.legacy_tag
        return (
            f"torchlean_state_binary_{self.exponent_bits}_{self.fraction_bits}_"
            f"{self.bias}_{self.convention}_v1"
        )

    @property
    def word_dtype(self) -> str:
        """Smallest unsigned numpy dtype holding one word."""
        for bits, dtype in _WORD_DTYPES:
            if self.width <= bits:
                return dtype
        raise ValueError(f"{self.width}-bit words do not fit in 64 bits")


@dataclass(frozen=True)
class ComplexFormat(_Words):
    """Complex values: ``[re_word, im_word]`` pairs in the ``inner`` encoding."""

    pair: ClassVar[bool] = True
    inner: BinaryFormat
    native_dtype: str | None = None

    @property
    def width(self) -> int:
        return self.inner.width

    @property
    def tag(self) -> str:
        return f"torchlean_state_complex_v1({self.inner.tag})"

    @property
    def word_dtype(self) -> str:
        return self.inner.word_dtype


ScalarFormat = BinaryFormat | ComplexFormat

_FLOAT64 = BinaryFormat(11, 52, 1023, "ieee", "torchlean_state_bits_v1", "<f8")
_FLOAT32 = BinaryFormat(8, 23, 127, "ieee", "torchlean_state_float32_bits_v1", "<f4")
_FLOAT16 = BinaryFormat(5, 10, 15, "ieee", native_dtype="<f2")

#: Short names users (and torch dtypes) meet, by their parameters.
ENCODINGS: dict[str, ScalarFormat] = {
    "float64": _FLOAT64,
    "float32": _FLOAT32,
    "float16": _FLOAT16,
    "bfloat16": BinaryFormat(8, 7, 127, "ieee"),
    "float8_e5m2": BinaryFormat(5, 2, 15, "ieee"),
    "float8_e4m3fn": BinaryFormat(4, 3, 7, "finite-max-nan"),
    "float8_e4m3fnuz": BinaryFormat(4, 3, 8, "finite-unsigned-zero"),
    "float8_e5m2fnuz": BinaryFormat(5, 2, 16, "finite-unsigned-zero"),
    "complex32": ComplexFormat(_FLOAT16),
    "complex64": ComplexFormat(_FLOAT32, "<c8"),
    "complex128": ComplexFormat(_FLOAT64, "<c16"),
}

_BY_TAG = {fmt.tag: fmt for fmt in ENCODINGS.values()}


def parse_tag(tag: str, _depth: int = 0) -> ScalarFormat | None:
    """The format a ``format`` tag names, or ``None`` if it names none we can hold."""
    if tag in _BY_TAG:
        return _BY_TAG[tag]
    match = _BINARY_TAG.fullmatch(tag)
    if match:
        e, f, b = (int(g) for g in match.groups()[:3])
        if e < 1 or 1 + e + f > 64:
            return None
        fmt = BinaryFormat(e, f, b, match.group(4))
        # One format, one spelling: "binary_05_..." is not the tag of binary_5_...
        return fmt if fmt.tag == tag else None
    match = _COMPLEX_TAG.fullmatch(tag)
    if match and _depth < _MAX_TAG_DEPTH:
        inner = parse_tag(match.group(1), _depth + 1)
        if isinstance(inner, BinaryFormat):
            return ComplexFormat(inner)  # its tag is canonical because the inner one is
    return None


def encoding_by_name(name: str) -> ScalarFormat | None:
    """A short name (``"bfloat16"``) or a full tag → its format; ``None`` if unknown."""
    return ENCODINGS.get(name) or parse_tag(name)
