"""Model state of any dtype ↔ the safetensors layout, over a placement: a sharded (DTensor)
model's set member, written and read by every rank.

A safetensors file's every byte offset follows from its names, dtypes and shapes: the
header (:func:`~tlckpt.codec.safetensors.header.build_header`) is built from the global
shapes alone, identically on every rank. So on the parallel path (:mod:`..placement.
positional`) rank 0 writes the header and every rank writes its own shards' bytes at their
offsets (a ``Shard(0)`` piece of a row-major tensor is one contiguous run); through rank 0
(other placements, no shared file system) full tensors stream to it one at a time in the
file's order. Either way the file is byte for byte what
:func:`~.named_module_state.save_named_state` writes for the unsharded model (tied tensors
once, the other names in ``__metadata__``).

A load checks the header whole (every rank itself, on the parallel path; rank 0 otherwise):
its tensors must be exactly the model's (tied copies aside), of the same dtypes and global
shapes; then each rank reads its own byte ranges into fresh memory (or receives its parts
from rank 0), and every rank agrees before the plan exists. Nothing live changes before the
plan's commit. One process (the local placement) is :mod:`.named_module_state` itself.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, BinaryIO

import numpy as np
import torch

from ...codec.errors import SchemaMismatchError
from ...codec.fileio.source import PathOrFile, open_regular, open_source
from ...codec.safetensors import Header, TensorData, write_safetensors
from ...codec.safetensors.header import build_header
from ...codec.safetensors.reader import read_header, read_tensor_into
from ...codec.spec.layout import FileLayout
from ..binding.dtensors import fingerprint, local_tensor
from ..commit.plans import Plan, StatePlan
from ..placement.local_placement import LOCAL
from ..placement.placement_protocol import Placement, Route, Take
from ..placement.positional import read_pieces, save_pieces
from .named_module_state import check_fits, plan_named_load, save_named_state
from .state_tensors import (
    ModuleOrTensors,
    NamedTensors,
    layout_of,
    state_plan,
    state_tensors,
    tied_copies,
    written,
)
from .tensor_files import tensor_data

__all__ = ["save", "plan_load"]

#: Integer element types by size: the raw bytes of any dtype, moved element-wise.
_RAW = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _raw(t: torch.Tensor) -> torch.Tensor:
    """``t``'s bytes as integers of its element size, same shape (CPU, contiguous)."""
    host = t.detach()
    if host.device.type != "cpu":
        host = host.cpu()
    return host.contiguous().view(_RAW[t.element_size()])


def _entries(named: NamedTensors, copies: dict[int, int]) -> dict[str, TensorData]:
    """The header's entries: each kept tensor's dtype word and global header shape, checked
    as a single process's save checks them (a meta tensor of the global shape: no data)."""
    return {
        named[i][0]: tensor_data(
            torch.empty(named[i][1].shape, dtype=named[i][1].dtype, device="meta"), named[i][0]
        )
        for i in written(named, copies)
    }


def save(placement: Placement, module_or_tensors: ModuleOrTensors, path: PathOrFile) -> None:
    """Write the state as a safetensors file, the bytes of
    :func:`~.named_module_state.save_named_state` for the full values (see the module
    docstring). Collective over a sharded placement.

    Raises:
        CheckpointError: a state entry the layout cannot hold (on every rank); nothing is
            written.
        OSError: from the file system (on every rank); the previous file is untouched.
    """
    if placement is LOCAL:
        save_named_state(module_or_tensors, path)
        return

    def check() -> tuple[NamedTensors, dict[int, int], bytes, list[tuple[str, int, int]]]:
        named = state_tensors(module_or_tensors)
        placement.check(named)
        copies = tied_copies(named)
        metadata = {named[i][0]: named[j][0] for i, j in sorted(copies.items())} or None
        items = _entries(named, copies)
        header, placed = build_header(
            {name: (item.dtype, item.shape) for name, item in items.items()}, metadata
        )
        return named, copies, header, placed

    named, copies, header, placed = placement.agree(
        check, lambda r: fingerprint(layout_of("safetensors save", r[0], r[1]), r[2])
    )
    kept = written(named, copies)
    index = {named[i][0]: i for i in kept}
    order = [index[name] for name, _, _ in placed]  # the file's order
    tensors = [named[i][1] for i in order]
    route = placement.route(path, "save", tensors)
    if route is Route.PARALLEL:
        start = len(header)
        size = start + (placed[-1][2] if placed else 0)
        save_pieces(
            path,  # type: ignore[arg-type]  # a path: the route says so
            FileLayout(((0, header),), (), size),
            tensors,
            lambda i, local: _raw(local).numpy(),
            offsets=[start + begin for _, begin, _ in placed],
        )
        return
    metadata = {named[i][0]: named[j][0] for i, j in sorted(copies.items())} or None

    def write(take: Take) -> None:
        items = _entries(named, copies)
        # Taken in the file's order, as the writer asks for each tensor's bytes.
        data = {
            name: TensorData(
                items[name].dtype,
                items[name].shape,
                lambda k=k: _raw(take(k)).reshape(-1).view(torch.uint8).numpy(),
            )
            for k, (name, _, _) in enumerate(placed)
        }
        write_safetensors(path, data, metadata=metadata)

    placement.gather(tensors, 1, write)


def _fit(named: NamedTensors, kept: list[int], header: Header) -> list[int]:
    """The data offset (from the file's start) of each kept tensor's bytes.

    Raises:
        SchemaMismatchError: the file's tensors are not the model's, or a shape differs.
        ConfigError: a dtype differs (a load does not convert).
    """
    names = [named[i][0] for i in kept]
    if sorted(names) != sorted(header.entries):
        missing = [n for n in names if n not in header.entries]
        unexpected = [n for n in header.entries if n not in set(names)]
        raise SchemaMismatchError(
            f"the names differ: missing in the file {missing[:8]}, unexpected in the file"
            f" {unexpected[:8]}",
            field="names",
            actual=unexpected[:8],
            expected=missing[:8],
        )
    for i in kept:
        check_fits(named[i][0], named[i][1], header, named[i][0])
    return [header.data_start + header.entries[named[i][0]].begin for i in kept]


def plan_load(placement: Placement, module_or_tensors: ModuleOrTensors, path: PathOrFile) -> Plan:
    """Check a safetensors file against the state (strictly: the same names, dtypes and
    shapes) and stage its values; nothing live changes. Collective over a sharded placement.

    Returns:
        The plan; its commit copies every value into its live tensor (a DTensor: its shard).

    Raises:
        CheckpointError: the file is not a valid safetensors file, or does not fit (on every
            rank); FileChangedError: it changed while it was read.
        OSError: from the file system.
    """
    if placement is LOCAL:
        return plan_named_load(module_or_tensors, path, strict=True)[0]

    def check() -> tuple[NamedTensors, dict[int, int]]:
        named = state_tensors(module_or_tensors)
        placement.check(named)
        return named, tied_copies(named)

    named, copies = placement.agree(check, lambda r: layout_of("safetensors load", r[0], r[1]))
    kept = written(named, copies)
    route = placement.route(path, "load", [named[i][1] for i in kept])
    parallel = route is Route.PARALLEL
    with contextlib.ExitStack() as stack:

        def validate() -> tuple[BinaryIO, Any, Header, list[int]] | None:
            if not (parallel or placement.touches_file):
                return None
            if isinstance(path, (str, os.PathLike)):
                f = stack.enter_context(open_regular(path))  # a FIFO is refused, never read
            else:
                f = path  # a file object: read through rank 0 (the route says so)
            with open_source(f) as src:
                header = read_header(src)
                stamp = src.stamp
            return f, (stamp, src.start), header, _fit(named, kept, header)

        checked = placement.agree(
            validate,
            (lambda c: fingerprint(c[3], c[2].data_size)) if parallel else None,  # type: ignore[index]
        )
        if parallel:
            f, (stamp, _), header, offsets = checked  # type: ignore[misc]
            return _read_own_pieces(placement, named, kept, f, stamp, header, offsets)
        receiver = placement.receiver([named[i][1] for i in kept])

        def read() -> None:
            f, (stamp, start), header, _ = checked  # type: ignore[misc]
            f.seek(start)  # where the header was read: the entries' offsets count from it
            with open_source(f, since=stamp) as src:
                for k, i in enumerate(kept):
                    live = named[i][1]
                    entry = header.entries[named[i][0]]
                    values = receiver.buffer(k, live.numel(), live.dtype)
                    raw = values.view(torch.uint8) if values.numel() else values
                    read_tensor_into(src, header, entry, raw.numpy())
                    receiver.put(k, values.view(live.shape))

        placement.transfer(receiver, read)
    return state_plan(named, kept, receiver)


def _read_own_pieces(
    placement: Placement,
    named: NamedTensors,
    kept: list[int],
    file: BinaryIO,
    stamp: Any,
    header: Header,
    offsets: list[int],
) -> Plan:
    """Each rank reads its own byte ranges of every kept tensor into fresh memory (by
    element size: the raw integers of that size), every rank agreeing before the plan."""
    parts: dict[int, torch.Tensor] = {}
    by_size: dict[int, list[int]] = {}
    for k, i in enumerate(kept):
        by_size.setdefault(named[i][1].element_size(), []).append(k)

    def read() -> None:
        for size, ks in by_size.items():
            tensors = [named[kept[k]][1] for k in ks]

            def keep(j: int, piece: np.ndarray, ks: list[int] = ks) -> None:
                k = ks[j]
                dtype = named[kept[k]][1].dtype
                parts[k] = torch.from_numpy(piece).view(dtype)

            read_pieces(file, stamp, [offsets[k] for k in ks], tensors, np.dtype(f"<i{size}"), keep)

    placement.agree(read)
    pairs = []
    for k, i in enumerate(kept):
        live = local_tensor(named[i][1])
        value = parts[k]
        pairs.append((live, value if live.device.type == "cpu" else value.to(live.device)))
    return StatePlan(pairs)
