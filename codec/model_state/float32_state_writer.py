"""Writing float32 model state (``TLSF32B``): one tensor at a time through the spec, or
headers and payloads as one vectored write by address; and the layout such a file has."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from ...formats import registry
from ...formats.float32_state import TENSOR_DTYPE, WRITTEN_VERSION
from ...formats.framing import FLOAT32_STATE_MAGIC
from ...formats.primitives import product
from ..errors import CheckpointError, UnsupportedFormatError, names_the_file
from ..fileio.atomic import output
from ..fileio.gcpause import gc_paused
from ..fileio.source import PathOrFile
from ..fileio.transfer import Extents, GatherBatch, address_of, write_gather
from ..spec.builder import Reserved
from ..spec.builder import build as build_spec
from ..spec.layout import FileLayout, layout_of_spec
from .state_template import shape_tuples, template_for

__all__ = ["write_float32_state", "write_float32_extents", "float32_state_layout"]

_TENSOR_DTYPE = np.dtype(TENSOR_DTYPE)


def _check_array(i: int, array: Any) -> None:
    if not isinstance(array, np.ndarray) or array.dtype != _TENSOR_DTYPE:
        got = array.dtype if isinstance(array, np.ndarray) else type(array).__name__
        raise CheckpointError(
            f"tensor {i} must be a little-endian float32 array, got {got}",
            field=f"tensors[{i}]",
        )


def _records(arrays: Iterable[Any]):
    for i, array in enumerate(arrays):
        _check_array(i, array)
        shape = array.shape
        yield {"rank": len(shape), "dims": shape, "element_count": array.size, "payload": array}


@names_the_file()
def write_float32_state(
    path: PathOrFile, arrays: Iterable[np.ndarray], *, count: int | None = None
) -> None:
    """Write float32 arrays as a ``TLSF32B`` v1 file, one tensor at a time, atomically.

    Args:
        path: destination path (written atomically), or a binary file object.
        arrays: float32 numpy arrays in state order. A sequence, or any iterable with
            ``count`` given: each array is written before the next is requested, so a
            generator can reuse one host buffer for device tensors.
        count: the number of arrays, required when ``arrays`` has no ``len``.

    Raises:
        CheckpointError: an array is not float32, or the iterable's length differs from
            ``count``; the previous file at ``path`` is untouched.
        OSError: from the file system.
    """
    if count is None:
        if not hasattr(arrays, "__len__"):
            raise TypeError("pass count= when arrays is not a sequence")
        count = len(arrays)  # type: ignore[arg-type]
        for i, array in enumerate(arrays):  # in memory already: check before the first byte
            _check_array(i, array)
    spec = registry.lookup(FLOAT32_STATE_MAGIC, WRITTEN_VERSION)
    if spec is None:  # pragma: no cover - registered at import
        raise UnsupportedFormatError(f"TLSF32B v{WRITTEN_VERSION} is not registered")
    with output(path) as f:
        build_spec(f, spec.struct, {"tensor_count": count, "tensors": _records(arrays)})


def float32_state_layout(shapes: Sequence[Sequence[int]]) -> FileLayout:
    """The layout of the ``TLSF32B`` file :func:`write_float32_state` writes for tensors of
    ``shapes``: header bytes, and payload ``i``'s offset and size (``layout.payloads[i]``).

    Raises:
        CheckpointError: a shape the format cannot hold.
    """
    spec = registry.lookup(FLOAT32_STATE_MAGIC, WRITTEN_VERSION)
    if spec is None:  # pragma: no cover - registered at import
        raise UnsupportedFormatError(f"TLSF32B v{WRITTEN_VERSION} is not registered")
    dims = [tuple(int(d) for d in shape) for shape in shapes]
    records = (
        {
            "rank": len(shape),
            "dims": shape,
            "element_count": product(shape),
            "payload": Reserved(product(shape), _TENSOR_DTYPE),
        }
        for shape in dims
    )
    return layout_of_spec(spec.struct, {"tensor_count": len(dims), "tensors": records})


@names_the_file()
def write_float32_extents(
    path: PathOrFile,
    shapes: Sequence[tuple[int, ...]],
    addresses: Sequence[int],
    owners: list[Any],
) -> None:
    """Write a ``TLSF32B`` v1 file whose payloads are given as memory, by address.

    The headers come from the destination template of ``shapes`` (cached per layout: the
    same bytes :func:`write_float32_state` writes); headers and payloads go to the output
    as one vectored write (:func:`~.transfer.write_gather`: a ``writev`` per
    :data:`~.transfer.IOV_MAX` pieces for a plain file), so a model of many small tensors
    costs no Python per tensor here.

    Args:
        path: destination path (written atomically), or a binary file object.
        shapes: each tensor's shape, in state order.
        addresses: where each tensor's float32 little-endian values lie in memory: exactly
            ``product(shape) * 4`` bytes of memory that ``owners`` keep alive (the caller
            vouches for it: a tensor's ``data_ptr()`` for that tensor's own shape).
        owners: the objects owning that memory.

    Raises:
        CheckpointError: as many addresses as shapes are needed; nothing is written.
        OSError: from the file system.
    """
    template = template_for(shape_tuples(shapes))
    if template is None:  # pragma: no cover - the shipped spec always has a template
        raise CheckpointError("TLSF32B headers cannot be derived for these shapes")
    n = len(template.payload_lengths)
    if len(addresses) != n:
        raise CheckpointError(f"{len(addresses)} payloads for {n} shapes", field="tensors")
    headers = np.frombuffer(template.headers, dtype=np.uint8)
    regions = len(template.header_lengths)
    pieces = np.zeros(2 * regions, dtype=np.uint64)
    pieces[0::2] = address_of(headers) + template.header_starts().astype(np.uint64)
    pieces[1 : 2 * n : 2] = addresses
    lengths = np.zeros(2 * regions, dtype=np.uint64)
    lengths[0::2] = template.header_lengths
    lengths[1 : 2 * n : 2] = template.payload_lengths
    batch = GatherBatch(Extents(pieces, lengths, None, [headers, owners]))
    with output(path) as f, gc_paused():
        write_gather(f, batch)
