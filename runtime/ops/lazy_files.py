"""``open_checkpoint``: a model-state file opened lazily, tensor by tensor.

One interface over three families: safetensors (names from the header), ``TLSF32B`` (names
are positions, ``"0"``, ``"1"``, …; shapes from its record headers, payloads skipped) and
exact-bits JSON (positions too; a JSON document cannot be skipped through: it is parsed at
open to learn the shapes, and read and checked whole again at the first ``tensor()`` call,
whose values are then kept). Opening a binary file reads only what describes the tensors: a
safetensors header, or a ``TLSF32B`` file's record headers.
"""

from __future__ import annotations

import os

import numpy as np
import torch

from ...codec.errors import CheckpointError, ConfigError, SchemaMismatchError, names_the_file
from ...codec.fileio.source import PathOrFile, open_source
from ...codec.inspection import sniff_family
from ...codec.model_state.float32_state import scan_float32_sizes
from ...codec.model_state.float32_state_writer import float32_state_layout
from ...codec.model_state.state_bits import inspect_state_bits, read_state_bits
from ...codec.safetensors import SafetensorsReader
from ...codec.sniffing import JSON_FAMILY
from ...formats.float32_state import TENSOR_DTYPE
from ...formats.optimizer_tree import FAMILY as OPTIMIZER_TREE
from ..binding.tensors import from_host
from .tensor_files import empty_for, torch_dtype, torch_shape

__all__ = ["CheckpointFile", "open_checkpoint"]

SAFETENSORS_FAMILY = "safetensors"
FLOAT32_FAMILY = "float32_state"


class CheckpointFile:
    """A checkpoint file opened by :func:`open_checkpoint`; a context manager.

    Attributes:
        family: ``"safetensors"``, ``"optimizer_tree"`` (its state tensors by name),
            ``"float32_state"`` (TLSF32B) or ``"state_bits"``.
        path: the file.
    """

    def __init__(self, path: str | os.PathLike, family: str):
        self.path = os.fspath(path)
        self.family = family
        self._reader: SafetensorsReader | None = None
        self._shapes: list[tuple[int, ...]] = []
        self._positional_dtype = torch.float32
        self._encoding = ""
        self._offsets: list[int] = []
        self._cached: list[np.ndarray] | None = None
        if family in (SAFETENSORS_FAMILY, OPTIMIZER_TREE):  # a tree is a safetensors file
            self._reader = SafetensorsReader(self.path)
        elif family == FLOAT32_FAMILY:
            _, shapes, _ = scan_float32_sizes(self.path)
            self._shapes = [tuple(s) for s in shapes]
            self._offsets = [p.offset for p in float32_state_layout(self._shapes).payloads]
        elif family == JSON_FAMILY:
            info = inspect_state_bits(self.path)
            self._shapes = [tuple(t["shape"]) for t in info["tensors"]]
            self._encoding = info.get("encoding") or info["format"]
            dtype = getattr(torch, self._encoding, None)
            if not isinstance(dtype, torch.dtype):
                raise ConfigError(
                    f"exact-bits JSON of {self._encoding!r} has no torch dtype",
                    path=self.path,
                    actual=self._encoding,
                )
            self._positional_dtype = dtype
        else:
            raise CheckpointError(
                f"open_checkpoint reads safetensors, TLSF32B and exact-bits JSON files, not"
                f" {family}",
                path=self.path,
                field="magic",
                actual=family,
            )

    # ------------------------------------------------------------------ description

    @property
    def metadata(self) -> dict[str, str]:
        """The safetensors ``__metadata__`` (``{}`` for the other families)."""
        if self._reader is not None:
            return dict(self._reader.header.metadata or {})
        return {}

    def names(self) -> list[str]:
        """The tensors' names, in file order (positions as strings where the family has no
        names)."""
        if self._reader is not None:
            return list(self._reader.header.entries)
        return [str(i) for i in range(len(self._shapes))]

    def _position(self, name: str) -> int:
        if name.isdigit() and int(name) < len(self._shapes) and str(int(name)) == name:
            return int(name)
        raise SchemaMismatchError(
            f"no tensor {name!r}: this {self.family} file has positions 0..{len(self._shapes) - 1}",
            path=self.path,
            field=name,
        )

    def shape(self, name: str) -> tuple[int, ...]:
        """Tensor ``name``'s shape (torch's: for ``float4_e2m1fn_x2`` the last dim halved)."""
        if self._reader is not None:
            entry = self._reader.entry(name)
            try:
                return torch_shape(entry, torch_dtype(entry))
            except ConfigError:  # no torch dtype (F6): the header's shape
                return entry.shape
        return self._shapes[self._position(name)]

    def dtype(self, name: str) -> torch.dtype:
        """Tensor ``name``'s torch dtype.

        Raises:
            ConfigError: torch has none for it (safetensors F6 kinds).
        """
        if self._reader is not None:
            return torch_dtype(self._reader.entry(name))
        self._position(name)
        return self._positional_dtype

    # ------------------------------------------------------------------ reading

    def tensor(self, name: str) -> torch.Tensor:
        """Tensor ``name``, read now, exactly (a fresh CPU tensor).

        Raises:
            SchemaMismatchError: no such tensor.
            CheckpointError: the file is damaged there, or changed since it was opened.
        """
        if self._reader is not None:
            entry = self._reader.entry(name)
            out = empty_for(entry)
            self._reader.read_into(name, out.reshape(-1).view(torch.uint8).numpy())
            return out
        i = self._position(name)
        if self.family == FLOAT32_FAMILY:
            array = np.empty(self._shapes[i], dtype=TENSOR_DTYPE)
            with open_source(self.path) as src:
                src.need(self._offsets[i] + array.nbytes, name, offset=0)
                src.seek(src.start + self._offsets[i])
                src.readinto(array, name)
            return torch.from_numpy(array)
        if self._cached is None:
            self._cached = read_state_bits(self.path, self._shapes, self._encoding)
        return from_host(self._cached[i], self._positional_dtype).reshape(self._shapes[i]).clone()

    def close(self) -> None:
        """Close the file."""
        if self._reader is not None:
            self._reader.close()
        self._cached = None

    def __enter__(self) -> CheckpointFile:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"CheckpointFile({self.path!r}, family={self.family!r})"


@names_the_file()
def open_checkpoint(path: PathOrFile) -> CheckpointFile:
    """Open a model-state file lazily: names, shapes, dtypes and metadata now, each tensor
    when asked for.

    Args:
        path: a safetensors, ``TLSF32B`` or exact-bits JSON file (a path).

    Returns:
        A :class:`CheckpointFile` (use it in a ``with`` block, or ``close()`` it).

    Raises:
        UnsupportedFormatError: a file of another family, or of none.
        CheckpointError: a subclass naming what is wrong with its header.

    Example:
        >>> with open_checkpoint("model.safetensors") as f:  # doctest: +SKIP
        ...     w = f.tensor("lm_head.weight")
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError("open_checkpoint takes a path")
    return CheckpointFile(path, sniff_family(path))
