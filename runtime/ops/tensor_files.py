"""Torch tensors ↔ the safetensors layout: ``save_tensors`` and ``load_tensors``.

The drop-in for ``safetensors.torch.save_file``/``load_file``, on the codec's writer and
reader (:mod:`tlckpt.codec.safetensors`): the same bytes for the same tensors and metadata
(metadata keys sorted), every dtype the layout shares with torch, atomic and durable writes,
hostile-input-safe reads, never pickle. Each tensor goes to the file as its own bytes, one at
a time (a device tensor is copied to the host when its turn comes); each is read straight
into the tensor that is returned.

``read_metadata`` needs no torch: it is :func:`tlckpt.codec.safetensors.read_metadata`.

Where torch and the layout differ: ``float4_e2m1fn_x2`` holds two F4 values per element, so
its header shape has a last dimension twice torch's (as the reference writes it); F6 kinds
have no torch dtype and are refused by the torch readers (their raw bytes are readable with
:func:`tlckpt.codec.safetensors.read_safetensors`). This module assumes a little-endian host.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from ...codec.errors import CheckpointError, ConfigError, names_the_file
from ...codec.fileio.source import PathOrFile, open_source
from ...codec.safetensors import Header, TensorData, TensorEntry, write_safetensors
from ...codec.safetensors.reader import read_header, read_tensor_into
from ...formats.safetensors import DTYPES

__all__ = [
    "save_tensors",
    "load_tensors",
    "dtype_word",
    "tensor_data",
    "torch_dtype",
    "torch_shape",
    "empty_for",
    "read_entry",
]

_WORD_OF_TORCH: dict[torch.dtype, str] = {
    getattr(torch, d.torch): d.name for d in DTYPES if d.torch and hasattr(torch, d.torch)
}
_TORCH_OF_WORD = {word: dtype for dtype, word in _WORD_OF_TORCH.items()}
#: Torch dtypes whose one element holds two of the layout's values (the last dim doubles).
_PAIRED = {getattr(torch, "float4_e2m1fn_x2", None)} - {None}


def dtype_word(dtype: torch.dtype, name: str = "") -> str:
    """The safetensors dtype of torch ``dtype``.

    Raises:
        ConfigError: the layout has no such dtype (complex128, complex32, quantized kinds).
    """
    word = _WORD_OF_TORCH.get(dtype)
    if word is None:
        raise ConfigError(
            f"tensor {name!r} is {dtype}, which the safetensors layout cannot hold (it has"
            f" {', '.join(sorted(_WORD_OF_TORCH.values()))})",
            field=name or None,
            actual=str(dtype),
        )
    return word


def torch_dtype(entry: TensorEntry) -> torch.dtype:
    """The torch dtype of a header entry.

    Raises:
        ConfigError: torch has no dtype for it (F6 kinds).
    """
    dtype = _TORCH_OF_WORD.get(entry.dtype.name)
    if dtype is None:
        raise ConfigError(
            f"tensor {entry.name!r} is {entry.dtype.name}, which torch has no dtype for",
            field=entry.name,
            actual=entry.dtype.name,
        )
    return dtype


def _header_shape(tensor: torch.Tensor, name: str) -> list[int]:
    shape = list(tensor.shape)
    if tensor.dtype in _PAIRED:
        if not shape:
            raise ConfigError(
                f"tensor {name!r}: a zero-dimensional {tensor.dtype} has no last dimension to"
                " hold its value pair",
                field=name,
            )
        shape[-1] *= 2
    return shape


def torch_shape(entry: TensorEntry, dtype: torch.dtype) -> tuple[int, ...]:
    """The torch shape of a header entry read as ``dtype`` (for ``float4_e2m1fn_x2`` the
    last dim halved).

    Raises:
        ConfigError: an F4 shape whose last dim is odd (or absent).
    """
    if dtype not in _PAIRED:
        return entry.shape
    if not entry.shape or entry.shape[-1] % 2:
        raise ConfigError(
            f"tensor {entry.name!r}: {entry.dtype.name} of shape {list(entry.shape)} does not"
            f" split into {dtype} pairs along its last dimension",
            field=entry.name,
            actual=list(entry.shape),
        )
    return (*entry.shape[:-1], entry.shape[-1] // 2)


def _host_bytes(tensor: torch.Tensor) -> np.ndarray:
    host = tensor.detach()
    if host.device.type != "cpu":
        host = host.cpu()
    flat = host.contiguous().reshape(-1)
    # A one-element tensor counts as contiguous whatever its stride (an expanded scalar's is
    # 0), and ``view(uint8)`` needs stride 1: the same memory, restrided.
    return flat.as_strided(flat.shape, (1,)).view(torch.uint8).numpy()


def tensor_data(tensor: Any, name: str) -> TensorData:
    """A tensor as the codec writer takes it: dtype word, header shape, and its bytes made
    on demand (a device tensor is copied to the host only when it is written).

    Raises:
        CheckpointError: not a dense tensor, or a dtype the layout cannot hold.
    """
    if not isinstance(tensor, torch.Tensor):
        raise CheckpointError(
            f"{name!r} is a {type(tensor).__name__}, not a torch.Tensor",
            field=name,
            actual=type(tensor).__name__,
        )
    if tensor.layout != torch.strided or type(tensor) not in (torch.Tensor, torch.nn.Parameter):
        raise CheckpointError(
            f"tensor {name!r} is a {type(tensor).__name__} of layout {tensor.layout}; only"
            " dense local tensors are written (densify or gather it first)",
            field=name,
            actual=type(tensor).__name__,
        )
    word = dtype_word(tensor.dtype, name)
    return TensorData(word, _header_shape(tensor, name), lambda: _host_bytes(tensor))


@names_the_file()
def save_tensors(
    tensors: Mapping[str, torch.Tensor],
    path: PathOrFile,
    *,
    metadata: Mapping[str, str] | None = None,
) -> None:
    """Write named tensors in the safetensors layout (the drop-in for
    ``safetensors.torch.save_file``), atomically and durably.

    Every name, dtype, shape and metadata entry is checked before the first byte is written;
    the bytes equal ``save_file``'s for the same tensors and metadata (metadata keys sorted).
    Unlike ``save_file``, a non-contiguous tensor is written as its values, and tensors that
    share memory are each written whole.

    Args:
        tensors: name → dense tensor (any device; any dtype the layout holds).
        path: destination path, or a binary file object written at its position.
        metadata: the ``__metadata__`` strings.

    Raises:
        CheckpointError: a value that is not a tensor, a dtype the layout lacks, a name or
            metadata that is not a string; nothing is written.
        OSError: from the file system; the previous file is untouched.

    Example:
        >>> save_tensors({"w": torch.zeros(2)}, "w.safetensors")  # doctest: +SKIP
    """
    if not isinstance(tensors, Mapping):
        raise CheckpointError(f"tensors must be a mapping of names, not {type(tensors).__name__}")
    items = {name: tensor_data(t, name) for name, t in tensors.items()}
    write_safetensors(path, items, metadata=metadata)


def empty_for(entry: TensorEntry) -> torch.Tensor:
    """A fresh CPU tensor of the entry's torch dtype and shape."""
    dtype = torch_dtype(entry)
    return torch.empty(torch_shape(entry, dtype), dtype=dtype)


def read_entry(src: Any, header: Header, entry: TensorEntry) -> torch.Tensor:
    """Tensor ``entry`` read straight into a fresh CPU tensor (exact bits)."""
    tensor = empty_for(entry)
    read_tensor_into(src, header, entry, tensor.reshape(-1).view(torch.uint8).numpy())
    return tensor


@names_the_file()
def load_tensors(
    path: PathOrFile, *, device: str | torch.device = "cpu"
) -> dict[str, torch.Tensor]:
    """Read every tensor of a safetensors file (the drop-in for
    ``safetensors.torch.load_file``), exactly: NaN payloads, subnormals and every bit kept.

    The header is checked whole (bounds, dtypes, byte lengths, offsets, duplicates) before
    any tensor is read; no read is larger than the bytes the file holds.

    Args:
        path: a path, or a seekable binary file object read from its position.
        device: where the tensors go.

    Returns:
        name → tensor, in the header's order.

    Raises:
        CheckpointError: a subclass naming what is wrong with the file.
        FileChangedError: the file changed while it was read.
        OSError: from the file system.
    """
    with open_source(path) as src:
        header = read_header(src)
        out = {name: read_entry(src, header, e) for name, e in header.entries.items()}
    if torch.device(device).type != "cpu":
        out = {name: t.to(device) for name, t in out.items()}
    return out
