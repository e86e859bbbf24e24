"""Float32 model state as ``TLSF32B``: the save, and the load as a plan committed after.

Both are written once over a :class:`~.placement.Placement` (one process, or every rank of a
sharded model with rank 0 at the file).

Saving writes one tensor at a time; device tensors pass through one reusable (pinned) host
buffer. Loading opens the file once for every pass. The first checks the whole file (tensor
count, every shape, sizes, the end of file) without reading a payload. Then either:

* staged (the default; always, when sharded): every payload is read into new memory, where
  integer tensors' values are checked to convert exactly and the copies of a tied tensor to
  agree; the file is checked not to have changed since the first pass began; the plan's
  commit copies every value into its live tensor. Locally, all payloads land in one
  staging buffer with a few vectored reads and the commit copies
  plain tensors' bytes in one batch; sharded, each payload goes through the placement's
  :class:`~.placement.Receiver`;
* in place (local only): a checking pass reads what the first could not check (integer
  tensors, tied copies); the plan's commit is the copying pass, which reads the payloads
  straight into their live tensors (plain ones in bulk), and reports a file that changes
  or fails to read under it as a :class:`~tlckpt.codec.errors.PartialLoadError`.

The local transfers by address (plain tensors, one staging buffer, the in-place commit) are
:mod:`.float32_bulk`'s; this module holds what every placement shares, the path through a
placement's :class:`~.placement.Receiver`, and the parallel one (:mod:`.positional`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any, BinaryIO

import numpy as np
import torch

from ...codec.fileio.leases import ReadLease, leased
from ...codec.fileio.source import PathOrFile, open_regular
from ...codec.model_state.float32_state import (
    StateLayout,
    read_float32_payloads,
    validate_float32_state,
)
from ...codec.model_state.float32_state_writer import float32_state_layout, write_float32_state
from ...formats.float32_state import TENSOR_DTYPE
from ..binding.dtensors import fingerprint, local_tensor
from ..binding.tensors import HostBuffer, check_convertible, to_file_dtype
from ..commit.plans import Plan, StatePlan
from ..placement.placement_protocol import Placement, Receiver, Route, Take
from ..placement.positional import read_pieces, save_pieces
from . import float32_bulk
from .state_tensors import (
    Arrival,
    ModuleOrTensors,
    NamedTensors,
    layout_of,
    state_plan,
    tied_copies,
    written,
)
from .state_walk import StateWalk, float32_walk

__all__ = ["save", "plan_load"]

#: The element type of every ``TLSF32B`` payload, as the positional reads want it.
_FILE_DTYPE = np.dtype(TENSOR_DTYPE)


def _host_float32(t: torch.Tensor, name: str, staging: HostBuffer) -> np.ndarray:
    t = to_file_dtype(t.detach(), torch.float32, name)
    if t.device.type == "cpu":
        return t.contiguous().numpy()  # a view of the live tensor unless it was strided
    host = staging.tensor(t.numel(), torch.float32)
    host.copy_(t.reshape(-1))
    return host.numpy().reshape(t.shape)


def save(placement: Placement, module_or_tensors: ModuleOrTensors, path: PathOrFile) -> None:
    """Write the state as ``TLSF32B`` (see :func:`~tlckpt.runtime.save_module_state`)."""

    def check() -> StateWalk:
        walk = float32_walk(module_or_tensors)
        placement.check(walk.named)
        if walk.dtypes - {torch.float32}:
            for name, t in walk.named:
                if t.dtype != torch.float32:  # raises before anything is written
                    to_file_dtype(local_tensor(t), torch.float32, name)  # each: its shard
        return walk

    walk = placement.agree(check, lambda walk: layout_of("TLSF32B save", walk.named))
    named, tensors = walk.named, walk.tensors
    route = placement.route(path, "save", tensors)
    if route is Route.PARALLEL:
        staging = HostBuffer(pin=any(t.is_cuda for t in tensors))
        layout = float32_state_layout(walk.shapes)
        save_pieces(
            path,  # type: ignore[arg-type]  # a path: the route says so
            layout,
            tensors,
            lambda i, local: _host_float32(local, named[i][0], staging),
        )
        return
    if route is Route.LOCAL_BULK and float32_bulk.save_in_bulk(walk, path):
        return  # else (device tensors, too much to convert up front) one at a time

    def write(take: Take) -> None:
        staging = HostBuffer(pin=any(t.is_cuda for _, t in named))
        arrays = (_host_float32(take(i), name, staging) for i, (name, _) in enumerate(named))
        write_float32_state(path, arrays, count=len(named))

    placement.gather([t for _, t in named], 1, write)


@contextlib.contextmanager
def _opened(path: PathOrFile) -> Iterator[BinaryIO]:
    """One open handle for every pass of a load.

    Re-opening the path between passes could read a different file (one renamed over it
    meanwhile) in the second pass than was validated in the first.
    """
    if isinstance(path, (str, os.PathLike)):
        with open_regular(path) as f:  # a FIFO or a device is refused, never read
            yield f
    else:
        yield path


#: The open file of a load and what its checking pass found (on the process that reads it).
_CheckedFile = tuple[BinaryIO, StateLayout]


def plan_load(
    placement: Placement,
    module_or_tensors: ModuleOrTensors,
    path: PathOrFile,
    *,
    staged: bool,
    lease: bool = False,
) -> Plan:
    """Check a ``TLSF32B`` file against the state and stage its values (see
    :func:`~tlckpt.runtime.load_module_state`); nothing live changes.

    With ``lease``, a local load of a path first takes a read lease on the file
    (:mod:`~tlckpt.codec.fileio.leases`): where one is granted nobody can change the file
    until the plan is closed, so the plan is an in-place one, whose commit reads the
    payloads straight into the live tensors (large ones whose pages are in memory copied from
    a mapping of the file: :mod:`~tlckpt.codec.fileio.mapped`) and fails only if the disk
    does (or a writer outwaited the kernel's lease-break time); where none is granted, a
    ``staged`` load stages, an in-place one reads without a lease. Callers that commit the
    plan at once (not alongside others) may ask for it.

    Returns:
        The plan; its commit writes the live tensors (in place: the copying pass, from the
        file the plan holds open, under its lease if it has one).
    """
    held: ReadLease | None = None
    with contextlib.ExitStack() as stack:

        def check() -> tuple[StateWalk, dict[int, int]]:
            walk = float32_walk(module_or_tensors)
            placement.check(walk.named)
            if walk.dtypes - {torch.float32}:
                for name, t in walk.named:
                    check_convertible(t.dtype, torch.float32, name)
            return walk, tied_copies(walk.named, walk.addresses)

        walk, copies = placement.agree(
            check, lambda result: layout_of("TLSF32B load", result[0].named, result[1])
        )
        named = walk.named
        route = placement.route(path, "load", walk.tensors)
        parallel = route is Route.PARALLEL

        def validate() -> _CheckedFile | None:
            if not (parallel or placement.touches_file):
                return None
            nonlocal held
            f = stack.enter_context(_opened(path))
            if lease and not parallel and isinstance(path, (str, os.PathLike)):
                held = stack.enter_context(leased(f))  # before the checks: they then hold
            return f, validate_float32_state(f, walk.shapes)

        # In parallel every rank validated the file itself: they must have found the same.
        checked = placement.agree(
            validate,
            (lambda c: fingerprint(c[1].offsets, c[1].stamp.size)) if parallel else None,  # type: ignore[index]
        )
        if parallel:
            return _read_own_pieces(placement, named, copies, *checked)  # type: ignore[misc]
        if route is Route.LOCAL_BULK and checked is not None:  # one process: it read the file
            if not staged or held is not None:
                return float32_bulk.plan_in_place(
                    *checked, walk, copies, stack.pop_all(), lease=held
                )
            return float32_bulk.stage(*checked, walk, copies)
        sent = written(named, copies)
        receiver = placement.receiver([named[i][1] for i in sent])
        sink = _Receiving(named, copies, sent, receiver)
        placement.transfer(receiver, lambda: read_float32_payloads(*checked, sink))  # type: ignore[misc]
    return state_plan(named, sent, receiver)


def _read_own_pieces(
    placement: Placement,
    named: NamedTensors,
    copies: dict[int, int],
    file: BinaryIO,
    layout: StateLayout,
) -> Plan:
    """A staged load in parallel: each rank reads its own pieces, checks them (tied copies
    against their originals' same pieces, integer values converting exactly), and every
    rank agrees before anything is committed."""
    sent = written(named, copies)
    item = {record: k for k, record in enumerate(sent)}
    arrival = Arrival(named, copies, keep=True)
    parts: dict[int, torch.Tensor] = {}

    def keep(record: int, piece: np.ndarray) -> None:
        values = arrival.arrive(record, piece)
        if values is not None:  # not a tied copy
            parts[item[record]] = values

    tensors = [t for _, t in named]
    placement.agree(
        lambda: read_pieces(file, layout.stamp, layout.offsets, tensors, _FILE_DTYPE, keep)
    )
    return StatePlan([(local_tensor(named[i][1]), parts[k]) for k, i in enumerate(sent)])


class _Receiving:
    """Payload sink of a staged load: each payload into the receiver's memory, checked there.

    A tied copy's payload is compared bit for bit with its original's and dropped (the copy
    shares its original's memory); an integer or bool tensor's values are converted,
    exactly or the load fails. Nothing live is touched.
    """

    def __init__(
        self, named: NamedTensors, copies: dict[int, int], sent: list[int], receiver: Receiver
    ):
        self.named = named
        self.arrival = Arrival(named, copies, keep=receiver.keeps_buffers)
        self.item = {record: k for k, record in enumerate(sent)}
        self.receiver = receiver
        self.pending: int | None = None  # the item being read, and its buffer
        self.values = torch.empty(0)

    def buffer(self, record: int, field: str, count: int, dtype: np.dtype) -> Any:
        self.pending = self.item.get(record)
        if self.pending is None:  # a tied copy: only compared with its original
            self.values = self.receiver.scratch(count, torch.float32)
        else:
            self.values = self.receiver.buffer(self.pending, count, torch.float32)
        return self.values.numpy()

    def done(self, record: int, field: str, buffer: Any) -> None:
        values = self.arrival.arrive(record, buffer)
        if values is not None:  # not a tied copy
            self.receiver.put(self.pending, values.view(self.named[record][1].shape))  # type: ignore[arg-type]
