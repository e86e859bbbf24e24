"""Keys of signed checkpoint sets (:mod:`tlckpt.formats.checkpoint_set`): checking the
caller's key, reading a key file, and the hashes made from a key (torch-free).

The key itself is never kept once the three derived values are made, never shown
(:class:`SetKey`'s ``repr`` names the key id only) and never pickled.
"""

from __future__ import annotations

import os
from typing import Any

import blake3
import xxhash

from ...formats.checkpoint_set import (
    KEY_BYTES,
    KEY_ID_CONTEXT,
    KEY_ID_HEX_DIGITS,
    MANIFEST_KEY_CONTEXT,
    MEMBER_KEY_CONTEXT,
)
from ..errors import CheckpointError
from ..fileio.source import open_regular

__all__ = ["SetKey", "as_key", "read_key_file", "member_hash"]

#: A key file's largest valid size: 64 hex digits and a newline.
_MAX_KEY_FILE_BYTES = 2 * KEY_BYTES + 1


def _derive(key: bytes, context: str) -> bytes:
    return blake3.blake3(key, derive_key_context=context).digest()


class SetKey:
    """The values derived from a caller's 32-byte key (see the format's docstring).

    Args:
        key: the 32 bytes.

    Attributes:
        key_id: the key's id, 16 hex digits (names the key, reveals nothing of it).
    """

    __slots__ = ("_manifest", "_member", "key_id")

    def __init__(self, key: bytes):
        self._member = _derive(key, MEMBER_KEY_CONTEXT)
        self._manifest = _derive(key, MANIFEST_KEY_CONTEXT)
        self.key_id = _derive(key, KEY_ID_CONTEXT).hex()[:KEY_ID_HEX_DIGITS]

    def member_hash(self) -> Any:
        """A new keyed hash of a member's bytes (BLAKE3 keyed mode with the member key; its
        threads hash large buffers in parallel, with the GIL released)."""
        return blake3.blake3(key=self._member, max_threads=blake3.blake3.AUTO)

    def mac(self, data: bytes) -> str:
        """The manifest MAC of ``data``: 64 lowercase hex digits."""
        return blake3.blake3(data, key=self._manifest).hexdigest()

    def __repr__(self) -> str:
        return f"SetKey(key_id={self.key_id!r})"

    def __reduce__(self) -> Any:
        raise TypeError("a SetKey holds key material and is not pickled")


def as_key(key: Any) -> SetKey | None:
    """The :class:`SetKey` of a caller's ``key=`` (``None`` stays ``None``).

    Args:
        key: ``None``, 32 bytes (``bytes``, ``bytearray`` or a ``memoryview`` of bytes), or
            a :class:`SetKey`.

    Raises:
        CheckpointError: any other type or length (the message gives neither the key nor
            any of its bytes).
    """
    if key is None or isinstance(key, SetKey):
        return key
    if not isinstance(key, (bytes, bytearray, memoryview)):
        raise CheckpointError(
            f"key must be {KEY_BYTES} bytes, not a {type(key).__name__} (a key file is read"
            " with tlckpt.read_key_file)",
            field="key",
            actual=type(key).__name__,
            expected=f"{KEY_BYTES} bytes",
        )
    data = memoryview(key).tobytes()  # its bytes in logical order, whatever its layout
    if len(data) != KEY_BYTES:
        raise CheckpointError(
            f"key must be {KEY_BYTES} bytes, got {len(data)}",
            field="key",
            actual=f"{len(data)} bytes",
            expected=f"{KEY_BYTES} bytes",
        )
    return SetKey(data)


_HEX_DIGITS = frozenset(b"0123456789abcdefABCDEF")


def read_key_file(path: str | os.PathLike) -> bytes:
    """The key held in the file at ``path``: exactly 32 raw bytes, or 64 hex digits and an
    optional newline.

    Args:
        path: the key file (a regular file; it is opened without blocking, so a FIFO is
            refused rather than waited on).

    Returns:
        The 32 bytes of the key.

    Raises:
        CheckpointError: not a regular file, or not of either form (the message gives the
            file's length, never its bytes).
        OSError: the file cannot be opened or read.
    """

    def not_regular(name: str, kind: str) -> CheckpointError:
        return CheckpointError(
            f"the key file is not a regular file ({kind})", path=name, field="key file"
        )

    with open_regular(path, not_regular) as f:
        data = f.read(_MAX_KEY_FILE_BYTES + 1)  # one byte more shows a longer file
    if len(data) == KEY_BYTES:
        return data
    digits = data[:-1] if data.endswith(b"\n") else data
    if len(digits) == 2 * KEY_BYTES and set(digits) <= _HEX_DIGITS:
        return bytes.fromhex(digits.decode("ascii"))
    size = f"more than {_MAX_KEY_FILE_BYTES}" if len(data) > _MAX_KEY_FILE_BYTES else len(data)
    raise CheckpointError(
        f"the key file holds {size} bytes that are not a key: a key file holds exactly"
        f" {KEY_BYTES} raw bytes, or {2 * KEY_BYTES} hex digits and an optional newline",
        path=path,
        field="key file",
        actual=f"{size} bytes",
        expected=f"{KEY_BYTES} raw bytes or {2 * KEY_BYTES} hex digits",
    )


def member_hash(key: SetKey | None) -> Any:
    """A new hash of a member's bytes: ``xxh3_128`` for an unsigned set, the keyed BLAKE3
    of ``key`` for a signed one."""
    return xxhash.xxh3_128() if key is None else key.member_hash()
