"""A file that ends inside a known magic is reported where the magic starts (byte 0), with
the magic's bytes wanted and the file's bytes there — by every reader and by ``inspect``."""

from __future__ import annotations

from pathlib import Path

import pytest

from tlckpt.codec import (
    TruncatedError,
    inspect,
    scan_adam,
    scan_float32_state,
    scan_optimizer_state,
    sniff_family,
)

READERS = [
    (b"TLCKOPT", scan_optimizer_state),
    (b"TLADAMF", scan_adam),
    (b"TLSF32B", scan_float32_state),
]


@pytest.mark.parametrize(("magic", "reader"), READERS, ids=lambda r: getattr(r, "__name__", r))
@pytest.mark.parametrize("length", range(1, 7))
def test_a_file_ending_inside_the_magic(
    tmp_path: Path, magic: bytes, reader: object, length: int
) -> None:
    path = tmp_path / "short.bin"
    path.write_bytes(magic[:length])
    for read in (reader, inspect, sniff_family):
        with pytest.raises(TruncatedError) as info:
            read(path)  # type: ignore[operator]
        error = info.value
        assert (error.offset, error.field) == (0, "magic"), (read, str(error))
        assert (error.expected, error.actual) == (7, length), (read, str(error))
        assert f"needs 7 bytes, only {length} left" in str(error)
