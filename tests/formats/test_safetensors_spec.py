"""The safetensors spec agrees with the installed reference package (0.8.0): its dtype table,
its layout order, and the parse of its fixed prefix."""

from __future__ import annotations

import io
import struct

import pytest
from construct import ConstructError

from tlckpt.formats.primitives import InvalidField
from tlckpt.formats.safetensors import DTYPE_BY_NAME, DTYPES, HEADER_LIMIT, SAFETENSORS_PREFIX

torch = pytest.importorskip("torch")
st = pytest.importorskip("safetensors.torch")


def _header(data: bytes) -> bytes:
    (n,) = struct.unpack_from("<Q", data)
    return data[8 : 8 + n]


def test_every_dtype_torch_has_matches_the_reference_word_and_width() -> None:
    seen = set()
    for d in DTYPES:
        if d.torch is None or not hasattr(torch, d.torch):
            continue
        dtype = getattr(torch, d.torch)
        data = st.save({"x": torch.zeros(8, dtype=torch.uint8).view(dtype)})
        header = _header(data).decode()
        assert f'"dtype":"{d.name}"' in header
        assert d.bits * (2 if d.name == "F4" else 1) == 8 * dtype.itemsize
        seen.add(d.name)
    assert {"F64", "BF16", "F8_E4M3", "F8_E5M2", "F8_E8M0", "C64", "U64", "BOOL"} <= seen


def test_the_layout_order_is_the_reference_s() -> None:
    tensors = {
        f"t{i}_{d.name}": torch.zeros(8, dtype=torch.uint8).view(getattr(torch, d.torch))
        for i, d in enumerate(reversed(DTYPES))
        if d.torch and hasattr(torch, d.torch)
    }
    header = _header(st.save(tensors)).decode()
    positions = sorted((header.index(f'"{name}"'), name) for name in tensors)
    words = [name.split("_", 1)[1] for _, name in positions]
    ranks = [list(DTYPE_BY_NAME).index(w) for w in words]
    assert ranks == sorted(ranks, reverse=True)


def test_the_prefix_parses_and_checks_its_limit() -> None:
    data = st.save({"x": torch.zeros(3)})
    parsed = SAFETENSORS_PREFIX.parse(data)
    assert parsed.header == _header(data)
    with pytest.raises(InvalidField):
        SAFETENSORS_PREFIX.parse(struct.pack("<Q", HEADER_LIMIT + 1) + b"{}")
    with pytest.raises(ConstructError):
        SAFETENSORS_PREFIX.parse_stream(io.BytesIO(struct.pack("<Q", 10) + b"{}"))
