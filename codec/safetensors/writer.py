"""Writing safetensors files: the header, then each tensor's bytes with one
``write(memoryview)``, atomically and durably, with digests taken while streaming.

For the same tensors and metadata the bytes equal ``safetensors.serialize_file``'s (the
metadata's keys aside, which the reference writes in its hash map's arbitrary order and this
writer sorts). Tensors come one at a time: a :class:`TensorData` may produce its buffer on
demand, so a device tensor is copied to the host only when it is written.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...formats.safetensors import DTYPE_BY_NAME, DTYPES
from ..errors import CheckpointError, names_the_file
from ..fileio.atomic import output
from ..fileio.source import PathOrFile
from ..fileio.transfer import plain_fd
from ..fileio.writeback import Writeback
from .header import build_header

__all__ = ["TensorData", "numpy_dtype_name", "write_safetensors"]

#: numpy dtype → safetensors dtype name, for arrays given as they are.
_OF_NUMPY = {np.dtype(d.numpy): d.name for d in DTYPES if d.numpy is not None}


def numpy_dtype_name(dtype: np.dtype) -> str:
    """The safetensors dtype of numpy arrays of ``dtype``.

    Raises:
        CheckpointError: numpy ``dtype`` has no safetensors equivalent.
    """
    name = _OF_NUMPY.get(np.dtype(dtype).newbyteorder("<"))
    if name is None:
        raise CheckpointError(f"numpy {dtype} has no safetensors dtype", actual=str(dtype))
    return name


@dataclass(frozen=True)
class TensorData:
    """A tensor to write: its dtype, its shape (as the header states it) and its bytes.

    Attributes:
        dtype: the safetensors dtype name (``"BF16"``).
        shape: its dims.
        data: a C-contiguous buffer of its little-endian bytes, or a callable returning one
            (called once, when the tensor is written; the buffer is released after).
    """

    dtype: str
    shape: Sequence[int]
    data: Any

    @classmethod
    def of_array(cls, array: np.ndarray) -> TensorData:
        """A numpy array, written as its dtype's safetensors dtype."""
        return cls(numpy_dtype_name(array.dtype), array.shape, array)


def _checked(name: str, value: Any) -> TensorData:
    if isinstance(value, np.ndarray):
        value = TensorData.of_array(value)
    if not isinstance(value, TensorData):
        raise CheckpointError(
            f"tensor {name!r} is a {type(value).__name__}, not an array or TensorData",
            field=name,
            actual=type(value).__name__,
        )
    if value.dtype not in DTYPE_BY_NAME:
        raise CheckpointError(f"unknown safetensors dtype {value.dtype!r}", field=name)
    return value


def _bytes_of(name: str, item: TensorData, nbytes: int) -> memoryview:
    data = item.data() if callable(item.data) else item.data
    if isinstance(data, np.ndarray):
        if not data.flags.c_contiguous:
            raise CheckpointError(f"tensor {name!r} is not C-contiguous", field=name)
        if data.dtype.byteorder == ">":
            raise CheckpointError(f"tensor {name!r} is big-endian", field=name)
        data = data.reshape(-1).view(np.uint8)
    view = memoryview(data)
    if not view.c_contiguous:
        raise CheckpointError(f"tensor {name!r} is not C-contiguous", field=name)
    view = view.cast("B") if view.nbytes else memoryview(b"")
    if view.nbytes != nbytes:
        raise CheckpointError(
            f"tensor {name!r} gives {view.nbytes} bytes; {item.dtype} of shape"
            f" {list(item.shape)} has {nbytes}",
            field=name,
            actual=view.nbytes,
            expected=nbytes,
        )
    return view


@names_the_file()
def write_safetensors(
    path: PathOrFile,
    tensors: Mapping[str, TensorData | np.ndarray],
    *,
    metadata: Mapping[str, str] | None = None,
    digests: Sequence[Any] = (),
    durable: bool = True,
    on_write: Callable[[str], None] | None = None,
) -> None:
    """Write ``tensors`` as a safetensors file, one tensor at a time.

    The header (every name, dtype and shape, and the metadata) is checked and built before
    the first byte is written; a failure later (a buffer of the wrong size, an interrupt,
    a full disk) leaves the previous file at ``path`` as it was.

    Args:
        path: destination path (written atomically) or a binary file object, written
            sequentially and never sought (so a set member's
            :class:`~tlckpt.codec.set_digests.DigestingWriter` takes it as it is).
        tensors: name → numpy array (of a dtype numpy and safetensors share) or
            :class:`TensorData`.
        metadata: the ``__metadata__`` strings, or ``None`` for none.
        digests: hash objects (``hashlib``, ``blake3``: anything with ``update``) fed every
            byte written, in order.
        durable: fsync the file and its folder (see :func:`~tlckpt.codec.atomic.output`);
            for a path, the disk is asked to start writing each window of bytes as soon as
            it is written (:class:`~tlckpt.codec.fileio.writeback.Writeback`), so that the
            ``fsync`` has little left to wait for.
        on_write: called with each name before its bytes are written (progress).

    Raises:
        CheckpointError: an input the layout cannot hold, or a buffer whose size is not its
            dtype and shape's; nothing is replaced.
        OSError: from the file system.

    Example:
        >>> write_safetensors("w.safetensors", {"w": np.zeros(3, "<f4")})  # doctest: +SKIP
    """
    items = {name: _checked(name, value) for name, value in tensors.items()}
    header, placed = build_header(
        {name: (item.dtype, item.shape) for name, item in items.items()}, metadata
    )
    own_file = isinstance(path, (str, os.PathLike))
    with output(path, durable=durable) as f:
        writeback = Writeback(plain_fd(f) if durable and own_file else None)
        f.write(header)
        for digest in digests:
            digest.update(header)
        for name, begin, end in placed:
            if on_write is not None:
                on_write(name)
            view = _bytes_of(name, items[name], end - begin)
            if view.nbytes:
                f.write(view)
                writeback.wrote(view.nbytes)
                for digest in digests:
                    digest.update(view)
            del view  # the buffer (a host copy of a device tensor) goes now
