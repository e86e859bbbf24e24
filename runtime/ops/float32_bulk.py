"""The local bulk transfers of ``TLSF32B`` model state: payloads moved by address.

When the tensors are this process's own (:class:`~.local_placement.LocalPlacement`),
:mod:`.float32_files` hands the transfer to this module: a save of host tensors as one
vectored write, a staged load through one staging buffer copied over the live tensors in one
batch, and an in-place load whose commit reads the payloads straight into them.

A *plain* tensor is a contiguous CPU float32 tensor that is not a lazily negated view: its
memory holds exactly the file's bytes, so payloads are moved by address, without a Python
object per tensor. Which tensors are plain, and where their memory is, the call's one walk
over the state says (:class:`~.state_walk.StateWalk`).
"""

from __future__ import annotations

import contextlib
from typing import Any, BinaryIO

import numpy as np
import torch
from torch.autograd.graph import increment_version

from ...codec.fileio.leases import ReadLease
from ...codec.fileio.mapped import FileMapping, mapped
from ...codec.fileio.source import PathOrFile
from ...codec.fileio.staging import fresh_bytes, same_bytes
from ...codec.fileio.transfer import Extents, address_of, copy_extents
from ...codec.model_state.float32_state import (
    StateLayout,
    float32_payloads_equal,
    read_float32_extents,
    read_float32_payloads,
)
from ...codec.model_state.float32_state_writer import write_float32_extents
from ..binding.tensors import HostBuffer, to_file_dtype
from ..commit.plans import Plan, committing, overwrite
from .state_tensors import (
    Arrival,
    NamedTensors,
    lease_outwaited,
    partial_load,
    tie_conflict,
    written,
)
from .state_walk import StateWalk

__all__ = [
    "CONVERTED_MAX_BYTES",
    "bump_versions",
    "Precheck",
    "plan_in_place",
    "save_in_bulk",
    "stage",
]

#: A save converts tensors that are not plain (integer buffers, strided views) to host
#: float32 copies up front, held until the write ends, when they add up to no more than
#: this; else (and for device tensors) it streams one tensor at a time.
CONVERTED_MAX_BYTES = 16 << 20


def bump_versions(tensors: list[torch.Tensor]) -> None:
    """Tensors written behind autograd's back: bump their versions, as ``copy_`` would, so
    that a graph that saved one of them notices."""
    try:
        increment_version(tensors)
    except RuntimeError:  # torch versions whose inference tensors have no version counter
        increment_version([t for t in tensors if not t.is_inference()])


def save_in_bulk(walk: StateWalk, path: PathOrFile) -> bool:
    """Write a local state whose tensors are all in host memory as one vectored write of
    headers and payloads, by address; ``False`` (nothing written) when it is not such a
    state (device tensors, or more than :data:`CONVERTED_MAX_BYTES` to convert)."""
    named = walk.named
    plain, addresses, rest = walk.split()
    owners: list[Any] = [walk.tensors]
    if rest:
        if any(not named[i][1].is_cpu for i in rest):
            return False
        if sum(named[i][1].numel() for i in rest) * 4 > CONVERTED_MAX_BYTES:
            return False
        converted = {}
        for i in rest:
            name, t = named[i]
            converted[i] = to_file_dtype(t.detach(), torch.float32, name).contiguous()
        every = np.zeros(len(walk), dtype=np.uint64)
        every[plain] = addresses
        every[rest] = [converted[i].data_ptr() for i in rest]
        addresses = every
        owners += list(converted.values())
    write_float32_extents(path, walk.shapes, addresses, owners)
    return True


def stage(f: BinaryIO, layout: StateLayout, walk: StateWalk, copies: dict[int, int]) -> Plan:
    """A local staged load: every payload into one fresh staging buffer (a mapping of its
    own when large) with a few vectored reads, tied copies compared with their originals there,
    integer tensors converted; the plan holds the staging and what goes where."""
    named = walk.named
    sizes = layout.size_array
    starts = np.zeros(len(sizes), dtype=np.int64)
    np.cumsum(sizes[:-1], out=starts[1:])
    staging = fresh_bytes(int(sizes.sum()))
    base = address_of(staging)
    read_float32_extents(
        f, layout, list(range(len(sizes))), base + starts.astype(np.uint64), [staging]
    )
    bounds = list(zip(starts.tolist(), sizes.tolist()))

    def payload(i: int) -> np.ndarray:
        at, n = bounds[i]
        return staging[at : at + n].view(np.float32)

    for copy, original in copies.items():
        (a, n), (b, _) = bounds[copy], bounds[original]
        if not same_bytes(staging[a : a + n], staging[b : b + n]):
            raise tie_conflict(named, copy, original)
    plain, live_addresses, rest = walk.split(written(named, copies) if copies else None)
    # Other tensors' values: converted (exactly, or the load fails) before anything live
    # is touched.
    arrival = Arrival(named, {}, keep=True)  # tied copies: compared above, not written
    others = [(named[i][1], arrival.arrive(i, payload(i)).view(named[i][1].shape)) for i in rest]  # type: ignore[union-attr]
    lengths = sizes[plain]
    live = walk.tensors_at(plain)
    return _StagedPlan(
        Extents.build(live_addresses, lengths, None, live),
        Extents.build(base + starts[plain].astype(np.uint64), lengths, None, [staging]),
        live,
        others,
    )


class _StagedPlan(Plan):
    """A local staged load's new values: plain tensors' bytes in one staging buffer,
    copied over their memory in one batch; other tensors' values, copied one by one."""

    def __init__(
        self,
        destinations: Extents,
        sources: Extents,
        live: list[torch.Tensor],
        others: list[tuple[torch.Tensor, torch.Tensor]],
    ):
        self.destinations = destinations
        self.sources = sources
        self.live = live
        self.others = others

    def commit(self) -> None:
        with committing():
            copy_extents(self.destinations, self.sources)
            bump_versions(self.live)
            for live, values in self.others:
                overwrite(live, values)


class Precheck:
    """Payload sink of an in-place load's checking pass for what the structural validation
    cannot see: integer tensors' values must convert exactly (tied copies are compared
    before, in the file: :func:`_precheck`). Other payloads are skipped.
    """

    def __init__(self, named: NamedTensors, staging: HostBuffer):
        self.named = named
        self.arrival = Arrival(named, {}, keep=False)
        self.staging = staging

    def buffer(self, record: int, field: str, count: int, dtype: np.dtype) -> Any:
        if self.named[record][1].dtype == torch.float32:
            return None  # float32 values are what the file holds: nothing to check
        return self.staging.array(count, dtype)

    def done(self, record: int, field: str, buffer: Any) -> None:
        self.arrival.arrive(record, buffer)


def _precheck(
    f: BinaryIO,
    layout: StateLayout,
    walk: StateWalk,
    copies: dict[int, int],
    mapping: FileMapping | None,
) -> None:
    """What an in-place load checks before its copying pass beyond the structure: tied
    copies first (as a staged load does), compared with their originals in the file chunk by
    chunk; then the values of integer tensors, which must convert exactly."""
    for copy, original in sorted(copies.items()):
        if not float32_payloads_equal(f, layout, original, copy, mapping):
            raise tie_conflict(walk.named, copy, original)
    if walk.dtypes - {torch.float32}:
        read_float32_payloads(f, layout, Precheck(walk.named, HostBuffer()))


class _Installer:
    """Payload sink of an in-place load for the tensors that are not plain: each payload
    through the one reusable host buffer and ``copy_``. ``written`` counts them."""

    def __init__(self, named: NamedTensors, records: set[int], staging: HostBuffer):
        self.named = named
        self.arrival = Arrival(named, {}, keep=False)
        self.records = records
        self.staging = staging
        self.written = 0

    def buffer(self, record: int, field: str, count: int, dtype: np.dtype) -> Any:
        if record not in self.records:
            return None  # plain (read in bulk) or a tied copy (its original was written)
        return self.staging.array(count, dtype)

    def done(self, record: int, field: str, buffer: Any) -> None:
        values = self.arrival.arrive(record, buffer)
        t = self.named[record][1]
        self.written += 1
        overwrite(t, values.view(t.shape))  # type: ignore[union-attr]  # not a tied copy


class _InPlacePlan(Plan):
    """A checked file whose payloads the commit reads straight into the live tensors."""

    def __init__(
        self,
        file: BinaryIO,
        layout: StateLayout,
        walk: StateWalk,
        copies: dict[int, int],
        resources: contextlib.ExitStack,
        lease: ReadLease | None = None,
        mapping: FileMapping | None = None,
    ):
        self.file = file
        self.layout = layout
        self.walk = walk
        self.copies = copies
        self.resources = resources
        self.lease = lease
        self.mapping = mapping

    def close(self) -> None:
        self.resources.close()

    def commit(self) -> None:
        """The copying pass, with Ctrl-C held back throughout: the tensors that are not
        plain one by one, then the plain ones in bulk, straight into their memory.

        Under a read lease the file cannot have changed since it was checked; the lease is
        checked once more at the end (:meth:`~tlckpt.codec.fileio.leases.ReadLease.intact`).

        Raises:
            PartialLoadError: the file changed, was truncated or could not be read after
                live tensors had been overwritten (under a lease: the disk failed to read,
                or a writer outwaited the kernel's lease-break time).
        """
        named = self.walk.named
        # The tensors as the plan's walk found them: nothing in this library changes a
        # tensor's memory between a plan and its commit.
        plain, addresses, rest = self.walk.split(
            written(named, self.copies) if self.copies else None
        )
        live = self.walk.tensors_at(plain)
        staging = HostBuffer(pin=any(named[i][1].is_cuda for i in rest))
        if rest:  # its largest size now: no allocation to fail once live tensors change
            staging.tensor(max(named[i][1].numel() for i in rest), torch.float32)
        installer = _Installer(named, set(rest), staging)
        touched = 0  # plain tensors whose memory a read may have changed so far

        def progress(through: int) -> None:
            nonlocal touched
            touched = through

        with committing():
            try:
                if installer.records:
                    read_float32_payloads(self.file, self.layout, installer)
                if len(plain):
                    read_float32_extents(
                        self.file,
                        self.layout,
                        plain,
                        addresses,
                        live,
                        progress,
                        mapping=self.mapping,
                    )
                    bump_versions(live)
                if self.lease is not None and not self.lease.intact():
                    touched = len(plain)
                    raise lease_outwaited()
            except Exception as exc:
                done = touched + installer.written
                if not done:
                    raise  # refused before the first write: the model is unchanged
                total = len(named) - len(self.copies)
                raise partial_load(exc, done, total, self.lease is not None) from exc


def plan_in_place(
    f: BinaryIO,
    layout: StateLayout,
    walk: StateWalk,
    copies: dict[int, int],
    resources: contextlib.ExitStack,
    lease: ReadLease | None = None,
) -> Plan:
    """A local in-place load of a checked file: the checking pass now (tied copies,
    integer values), the copying pass in the plan's commit, which holds ``resources`` (the
    open file, and ``lease`` on it if any) until it is closed. Under a lease, both passes
    copy and compare large payloads from a mapping of the file (:mod:`~.fileio.mapped`)."""
    try:
        mapping = resources.enter_context(mapped(f, lease))
        _precheck(f, layout, walk, copies, mapping)
    except BaseException:
        resources.close()  # the file, its lease and mapping: no plan holds them
        raise
    return _InPlacePlan(f, layout, walk, copies, resources, lease, mapping)
