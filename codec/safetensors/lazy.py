"""An open safetensors file read tensor by tensor: the header at open, each tensor's bytes
only when asked for, checked each time not to have changed since the header was read."""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np

from ..errors import CheckpointError
from ..fileio.source import PathOrFile, Source, open_source
from .header import Header, TensorEntry
from .reader import read_array, read_header, read_tensor_into

__all__ = ["SafetensorsReader"]


class SafetensorsReader:
    """A safetensors file held open: names, dtypes, shapes and metadata from its header;
    tensors read one at a time. A context manager (closing the file).

    Args:
        path: a path (opened here) or a seekable binary file object (read from its
            position, left open).

    Raises:
        CheckpointError: the header is not valid (see
            :func:`~tlckpt.codec.safetensors.reader.read_header`); the file is closed.
    """

    def __init__(self, path: PathOrFile):
        with contextlib.ExitStack() as stack:  # closed here if the header is refused
            self._src: Source = stack.enter_context(open_source(path))
            self.header: Header = read_header(self._src)
            self._stack = stack.pop_all()
        self._stamp = self._src.stamp

    @property
    def name(self) -> Any:
        """The file's name, where known."""
        return self._src.name

    def entry(self, name: str) -> TensorEntry:
        """The header entry of tensor ``name`` (``SchemaMismatchError`` if there is none)."""
        return self.header.entry(name)

    def _check(self) -> None:
        try:
            self._src.check_unchanged(self._stamp, "before reading a tensor")
        except CheckpointError as exc:
            raise exc.with_path(self._src.name) from None

    def read_into(self, name: str, buffer: Any) -> None:
        """Fill ``buffer`` (``entry(name).nbytes`` writable bytes) with tensor ``name``.

        Raises:
            SchemaMismatchError: no such tensor.
            FileChangedError / TruncatedError: the file changed since it was opened.
        """
        entry = self.entry(name)
        self._check()
        try:
            read_tensor_into(self._src, self.header, entry, buffer)
        except CheckpointError as exc:
            raise exc.with_path(self._src.name) from None
        self._check()

    def array(self, name: str) -> np.ndarray:
        """Tensor ``name``'s raw words (see :func:`~.reader.read_safetensors`)."""
        entry = self.entry(name)
        self._check()
        try:
            array = read_array(self._src, self.header, entry)
        except CheckpointError as exc:
            raise exc.with_path(self._src.name) from None
        self._check()
        return array

    def close(self) -> None:
        """Close the file (if this object opened it)."""
        self._stack.close()

    def __enter__(self) -> SafetensorsReader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
