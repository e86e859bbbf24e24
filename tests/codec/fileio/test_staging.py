"""``same_bytes``: compared as 8-byte words with a byte-wise tail, chunk by chunk."""

from __future__ import annotations

import numpy as np
import pytest

from tlckpt.codec.fileio import staging


@pytest.mark.parametrize("length", [0, 1, 7, 8, 9, 63, 4099])
@pytest.mark.parametrize("start", [0, 1, 3])
def test_every_single_byte_difference_is_seen(
    length: int, start: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(staging, "COMPARE_CHUNK_BYTES", 1024)  # several chunks, odd tails
    base = np.random.default_rng(length).integers(0, 256, start + length, dtype=np.uint8)
    x = base[start:]  # slices at odd offsets: unaligned words
    y = base.copy()[start:]
    assert staging.same_bytes(x, y)
    for at in range(length):
        y[at] ^= 0x10
        assert not staging.same_bytes(x, y), at
        y[at] ^= 0x10


def test_lengths_must_agree() -> None:
    assert not staging.same_bytes(np.zeros(8, np.uint8), np.zeros(9, np.uint8))
