"""Reading safetensors files within bounds: the header, then tensors into callers' buffers.

No read is larger than the bytes the file has left: the header length is checked against
the limit and the file's size before the header is read, and each tensor's bytes were
checked to lie inside the data region when the header was parsed.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...formats.primitives import unpack_u64
from ...formats.safetensors import HEADER_LENGTH_SIZE
from ..errors import ConfigError, names_the_file
from ..fileio.source import PathOrFile, Source, open_source
from .header import Header, TensorEntry, check_header_length, parse_header

__all__ = [
    "read_header",
    "read_metadata",
    "read_safetensors",
    "read_array",
    "read_tensor_into",
    "storage_dtype",
    "typed_view",
]


def read_header(src: Source) -> Header:
    """Read and check the header of the safetensors file at ``src``'s position.

    Raises:
        TruncatedError: fewer than 8 bytes, or a header longer than the file.
        FileTooLargeError: a header length above the 100 MB limit.
        MalformedError / ConfigError / SchemaMismatchError / TrailingDataError: see
            :func:`~.header.parse_header`.
    """
    length = unpack_u64(src.read(HEADER_LENGTH_SIZE, "header_length"))
    check_header_length(length, src.remaining)
    raw = src.read(length, "header")
    return parse_header(raw, src.remaining)


def read_tensor_into(src: Source, header: Header, entry: TensorEntry, buffer: Any) -> None:
    """Fill ``buffer`` (a writable C-contiguous buffer of exactly ``entry.nbytes`` bytes)
    with the tensor's bytes, read straight from the file.

    Raises:
        ValueError: the buffer's size differs (a caller's error, not the file's).
        TruncatedError: the file shrank since its header was read.
    """
    view = memoryview(buffer)
    if view.nbytes != entry.nbytes:
        raise ValueError(f"{entry.name!r} has {entry.nbytes} bytes; the buffer {view.nbytes}")
    src.seek(src.start + header.data_start + entry.begin)
    src.readinto(view, f"header[{entry.name!r}]")


def storage_dtype(entry: TensorEntry) -> np.dtype:
    """The numpy dtype holding ``entry``'s raw words (raw bytes for the sub-byte kinds)."""
    return np.dtype(entry.dtype.storage or "u1")


def read_array(src: Source, header: Header, entry: TensorEntry) -> np.ndarray:
    """Tensor ``entry``'s raw words in a fresh array (its shape; flat bytes for sub-byte kinds)."""
    dtype = storage_dtype(entry)
    if entry.dtype.storage is None:
        array = np.empty(entry.nbytes, dtype=dtype)
    else:
        array = np.empty(entry.shape, dtype=dtype)
    read_tensor_into(src, header, entry, array)
    return array


@names_the_file()
def read_safetensors(path: PathOrFile) -> tuple[Header, dict[str, np.ndarray]]:
    """Read a whole safetensors file: its checked header and every tensor's raw words.

    Args:
        path: a path, or a seekable binary file object read from its position.

    Returns:
        The header, and name → array in header order. Each array has the tensor's shape and
        a numpy dtype of its width holding the raw words (``uint16`` for BF16 and F16's
        bits, ``uint8`` for the float8 kinds; see ``SafetensorsDtype.storage``); sub-byte
        kinds (F4, F6) come as flat ``uint8`` arrays of their bytes.

    Raises:
        CheckpointError: a subclass naming what is wrong (see :func:`read_header`).
        FileChangedError: the file changed while it was read.
    """
    with open_source(path) as src:
        header = read_header(src)
        arrays = {name: read_array(src, header, e) for name, e in header.entries.items()}
    return header, arrays


@names_the_file()
def read_metadata(path: PathOrFile) -> dict[str, str]:
    """The ``__metadata__`` of a safetensors file (``{}`` when it has none); only the header
    is read, and checked whole.

    Raises:
        CheckpointError: a subclass naming what is wrong with the header.
    """
    with open_source(path) as src:
        header = read_header(src)
    return dict(header.metadata or {})


def typed_view(array: np.ndarray, entry: TensorEntry) -> np.ndarray:
    """``array`` (raw words) viewed as the numpy dtype of its values.

    Raises:
        ConfigError: numpy has no dtype for ``entry``'s values (BF16, the float8 and
            sub-byte kinds): use the raw words, or torch.
    """
    if entry.dtype.numpy is None:
        raise ConfigError(
            f"numpy has no dtype for {entry.dtype.name}; read its raw words instead",
            field=entry.name,
            actual=entry.dtype.name,
        )
    return array.view(np.dtype(entry.dtype.numpy))
