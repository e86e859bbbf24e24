"""The exact-bits JSON encoding table of ``tlckpt.formats.state_bits`` (FORMAT.md §5): its
tags, dtypes and widths spelled out by hand, tags derived from the parameters and parsed
back, and the tags it refuses."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tlckpt.formats import (
    ENCODINGS,
    BinaryFormat,
    ComplexFormat,
    encoding_by_name,
    parse_tag,
)
from tlckpt.formats.state_bits import SPECIAL_VALUE_CONVENTIONS

# ------------------------------------------------------------ exact-bits JSON encodings

_PREFIX, _SUFFIX = "torchlean_state_", "_v1"

#: FORMAT.md §5, spelled out by hand here (the code derives them).
_EXPECTED_TAGS = {
    "float64": "torchlean_state_bits_v1",
    "float32": "torchlean_state_float32_bits_v1",
    "float16": "torchlean_state_binary_5_10_15_ieee_v1",
    "bfloat16": "torchlean_state_binary_8_7_127_ieee_v1",
    "float8_e5m2": "torchlean_state_binary_5_2_15_ieee_v1",
    "float8_e4m3fn": "torchlean_state_binary_4_3_7_finite-max-nan_v1",
    "float8_e4m3fnuz": "torchlean_state_binary_4_3_8_finite-unsigned-zero_v1",
    "float8_e5m2fnuz": "torchlean_state_binary_5_2_16_finite-unsigned-zero_v1",
    "complex32": "torchlean_state_complex_v1(torchlean_state_binary_5_10_15_ieee_v1)",
    "complex64": "torchlean_state_complex_v1(torchlean_state_float32_bits_v1)",
    "complex128": "torchlean_state_complex_v1(torchlean_state_bits_v1)",
}

#: API.md: the arrays handed to / returned by the codec per encoding, and the word width.
_EXPECTED_ARRAYS = {
    "float64": ("<f8", 64, False),
    "float32": ("<f4", 32, False),
    "float16": ("<f2", 16, False),
    "bfloat16": ("<u2", 16, False),
    "float8_e5m2": ("<u1", 8, False),
    "float8_e4m3fn": ("<u1", 8, False),
    "float8_e4m3fnuz": ("<u1", 8, False),
    "float8_e5m2fnuz": ("<u1", 8, False),
    "complex32": ("<u2", 16, True),
    "complex64": ("<c8", 32, True),
    "complex128": ("<c16", 64, True),
}


def test_encoding_table_covers_the_api_short_names() -> None:
    assert set(ENCODINGS) == set(_EXPECTED_TAGS)


@pytest.mark.parametrize("name", sorted(_EXPECTED_TAGS))
def test_encoding_tags(name: str) -> None:
    fmt = ENCODINGS[name]
    assert fmt.tag == _EXPECTED_TAGS[name]
    assert encoding_by_name(name) is fmt
    assert encoding_by_name(fmt.tag) == fmt
    assert parse_tag(fmt.tag) == fmt


@pytest.mark.parametrize("name", sorted(_EXPECTED_ARRAYS))
def test_encoding_dtypes_and_widths(name: str) -> None:
    fmt = ENCODINGS[name]
    dtype, width, pair = _EXPECTED_ARRAYS[name]
    assert np.dtype(fmt.array_dtype) == np.dtype(dtype)
    assert fmt.width == width
    assert fmt.pair is pair
    assert np.dtype(fmt.word_dtype).itemsize * 8 == max(8, width)


@pytest.mark.parametrize(
    "name", [n for n in sorted(_EXPECTED_TAGS) if isinstance(ENCODINGS[n], BinaryFormat)]
)
def test_binary_tags_are_derived_from_parameters(name: str) -> None:
    fmt = ENCODINGS[name]
    generic = (
        f"{_PREFIX}binary_{fmt.exponent_bits}_{fmt.fraction_bits}_{fmt.bias}_"
        f"{fmt.convention}{_SUFFIX}"
    )
    if name in ("float64", "float32"):
        # The legacy native tags stay; the parameters are still those of binary64/32.
        assert (fmt.exponent_bits, fmt.fraction_bits, fmt.bias) in ((11, 52, 1023), (8, 23, 127))
        assert fmt.tag != generic
    else:
        assert fmt.tag == generic


def test_complex_encodings_wrap_their_real_format() -> None:
    assert ENCODINGS["complex32"].inner == ENCODINGS["float16"]
    assert ENCODINGS["complex64"].inner == ENCODINGS["float32"]
    assert ENCODINGS["complex128"].inner == ENCODINGS["float64"]


@st.composite
def _binary_formats(draw: st.DrawFn) -> BinaryFormat:
    e = draw(st.integers(1, 30))
    f = draw(st.integers(0, 63 - e))
    return BinaryFormat(
        e, f, draw(st.integers(0, 2**64)), draw(st.sampled_from(SPECIAL_VALUE_CONVENTIONS))
    )


@settings(max_examples=200, deadline=None)
@given(_binary_formats())
def test_parse_tag_round_trips(fmt: BinaryFormat) -> None:
    parsed = parse_tag(fmt.tag)
    assert parsed is not None
    assert parsed.tag == fmt.tag
    key = (parsed.exponent_bits, parsed.fraction_bits, parsed.bias, parsed.convention)
    assert key == (fmt.exponent_bits, fmt.fraction_bits, fmt.bias, fmt.convention)
    cplx = parse_tag(ComplexFormat(fmt).tag)
    assert isinstance(cplx, ComplexFormat)
    assert cplx.tag == ComplexFormat(fmt).tag
    assert cplx.inner.tag == fmt.tag


@pytest.mark.parametrize(
    "tag",
    [
        "",
        "torchlean_state_bits_v2",
        "torchlean_state_binary_5_10_15_ieee",
        "torchlean_state_binary_5_10_15_ieee_v2",
        "torchlean_state_binary_05_10_15_ieee_v1",  # one format, one spelling
        "torchlean_state_binary_5_10_015_ieee_v1",
        "torchlean_state_binary_0_10_15_ieee_v1",  # no exponent bits
        "torchlean_state_binary_32_32_15_ieee_v1",  # 65-bit words
        "torchlean_state_binary_5_10_15_IEEE_v1",
        "torchlean_state_binary_5_10_15_fnuz_v1",
        "torchlean_state_binary_5_10_-15_ieee_v1",
        "torchlean_state_binary_" + "9" * 25 + "_1_1_ieee_v1",
        "torchlean_state_complex_v1(torchlean_state_complex_v1(torchlean_state_bits_v1))",
        "torchlean_state_complex_v1()",
        "torchlean_state_complex_v1(torchlean_state_bits_v1",
        " torchlean_state_bits_v1",
        "torchlean_state_bits_v1 ",
    ],
)
def test_parse_tag_rejects(tag: str) -> None:
    assert parse_tag(tag) is None
    assert encoding_by_name(tag) is None


def test_parse_tag_rejects_deep_nesting_fast() -> None:
    tag = "torchlean_state_complex_v1(" * 10_000 + "torchlean_state_bits_v1" + ")" * 10_000
    assert parse_tag(tag) is None


def test_tags_are_json_safe_ascii() -> None:
    for fmt in ENCODINGS.values():
        assert re.fullmatch(r"[a-z0-9_().-]+", fmt.tag), fmt.tag


def test_unknown_short_name() -> None:
    assert encoding_by_name("float128") is None
    assert encoding_by_name("int8") is None
