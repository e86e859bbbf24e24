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
  staging buffer with a few vectored reads (:func:`read_extents`) and the commit copies
  plain tensors' bytes in one batch; sharded, each payload goes through the placement's
  :class:`~.placement.Receiver` (:func:`read_payloads`);
* in place (local only): a checking pass reads what the first could not check (integer
  tensors, tied copies); the plan's commit is the copying pass, which reads the payloads
  straight into their live tensors (plain ones in bulk), and reports a file that changes
  or fails to read under it as a :class:`~tlckpt.codec.errors.PartialLoadError`.

A *plain* tensor is a contiguous CPU float32 tensor that is not a lazily negated view: its
memory holds exactly the file's bytes, so payloads are moved by address, without a Python
object per tensor.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any, BinaryIO

import numpy as np
import torch
from torch.autograd.graph import increment_version

from ..codec.errors import CheckpointError, PartialLoadError
from ..codec.float32_state import (
    StateLayout,
    float32_payloads_equal,
    read_float32_extents,
    read_float32_payloads,
    validate_float32_state,
    write_float32_extents,
    write_float32_state,
)
from ..codec.source import PathOrFile
from ..codec.staging import fresh_bytes, same_bytes
from ..codec.transfer import Extents, address_of, copy_extents
from .dtensors import local_tensor
from .placement import Placement, Receiver, Take
from .plans import Plan, committing, overwrite
from .state_tensors import (
    ModuleOrTensors,
    NamedTensors,
    TieCheck,
    float32_named_state,
    layout_of,
    state_plan,
    tie_conflict,
    tied_copies,
    written,
)
from .tensors import HostBuffer, check_convertible, from_file_dtype, to_file_dtype

__all__ = ["save", "plan_load", "read_payloads", "read_extents", "is_plain"]


def _host_float32(t: torch.Tensor, name: str, staging: HostBuffer) -> np.ndarray:
    t = to_file_dtype(t.detach(), torch.float32, name)
    if t.device.type == "cpu":
        return t.contiguous().numpy()  # a view of the live tensor unless it was strided
    host = staging.tensor(t.numel(), torch.float32)
    host.copy_(t.reshape(-1))
    return host.numpy().reshape(t.shape)


#: A save converts tensors that are not plain (integer buffers, strided views) to host
#: float32 copies up front, held until the write ends, when they add up to no more than
#: this; else (and for device tensors) it streams one tensor at a time.
CONVERTED_MAX_BYTES = 16 << 20


def save(placement: Placement, module_or_tensors: ModuleOrTensors, path: PathOrFile) -> None:
    """Write the state as ``TLSF32B`` (see :func:`~tlckpt.runtime.save_module_state`)."""

    def check() -> NamedTensors:
        named = float32_named_state(module_or_tensors)
        placement.check(named)
        if {t.dtype for _, t in named} - {torch.float32}:
            for name, t in named:
                if t.dtype != torch.float32:  # raises before anything is written
                    to_file_dtype(local_tensor(t), torch.float32, name)  # each: its shard
        return named

    named = placement.agree(check, lambda named: layout_of("TLSF32B save", named))
    if placement.reads_in_place and _save_in_bulk(named, path):
        return

    def write(take: Take) -> None:
        staging = HostBuffer(pin=any(t.is_cuda for _, t in named))
        arrays = (_host_float32(take(i), name, staging) for i, (name, _) in enumerate(named))
        write_float32_state(path, arrays, count=len(named))

    placement.gather([t for _, t in named], 1, write)


def _save_in_bulk(named: NamedTensors, path: PathOrFile) -> bool:
    """Write a local state whose tensors are all in host memory as one vectored write of
    headers and payloads, by address; ``False`` (nothing written) when it is not such a
    state (device tensors, or more than :data:`CONVERTED_MAX_BYTES` to convert)."""
    plain, addresses, rest = _plain(named, list(range(len(named))))
    owners: list[Any] = [named[i][1] for i in plain]
    if rest:
        if any(not named[i][1].is_cpu for i in rest):
            return False
        if sum(named[i][1].numel() for i in rest) * 4 > CONVERTED_MAX_BYTES:
            return False
        converted = {}
        for i in rest:
            name, t = named[i]
            converted[i] = to_file_dtype(t.detach(), torch.float32, name).contiguous()
        order = sorted(plain + rest)
        at = dict(zip(plain, addresses))
        addresses = [at[i] if i in at else converted[i].data_ptr() for i in order]
        owners += list(converted.values())
    write_float32_extents(path, [t.shape for _, t in named], addresses, owners)
    return True


@contextlib.contextmanager
def _opened(path: PathOrFile) -> Iterator[BinaryIO]:
    """One open handle for every pass of a load.

    Re-opening the path between passes could read a different file (one renamed over it
    meanwhile) in the second pass than was validated in the first.
    """
    if isinstance(path, (str, os.PathLike)):
        with open(path, "rb") as f:
            yield f
    else:
        yield path


#: The open file of a load and what its checking pass found (on the process that reads it).
_CheckedFile = tuple[BinaryIO, StateLayout]


def read_payloads(file: BinaryIO, layout: StateLayout, sink: Any) -> None:
    """One payload pass over a checked file: each payload into ``sink``'s buffers (see
    :func:`~tlckpt.codec.float32_state.read_float32_payloads`)."""
    read_float32_payloads(file, layout, sink)


def read_extents(
    file: BinaryIO,
    layout: StateLayout,
    records: list[int],
    addresses: Any,
    owners: list[Any],
    progress: Any = None,
) -> None:
    """One payload pass in bulk: the payloads of ``records`` into memory by address (see
    :func:`~tlckpt.codec.float32_state.read_float32_extents`)."""
    read_float32_extents(file, layout, records, addresses, owners, progress)


_PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)


def is_plain(t: torch.Tensor) -> bool:
    """Whether ``t``'s memory is exactly a payload's bytes: a contiguous CPU float32 tensor
    (not a subclass, not a lazily negated view), so bytes move to and from it by address."""
    return (
        type(t) in _PLAIN_TYPES
        and t.dtype is torch.float32
        and t.is_cpu
        and t.is_contiguous()
        and not t.is_neg()
    )


def _bump_versions(tensors: list[torch.Tensor]) -> None:
    """Tensors written behind autograd's back: bump their versions, as ``copy_`` would, so
    that a graph that saved one of them notices."""
    try:
        increment_version(tensors)
    except RuntimeError:  # torch versions whose inference tensors have no version counter
        increment_version([t for t in tensors if not t.is_inference()])


def _plain(named: NamedTensors, records: list[int]) -> tuple[list[int], list[int], list[int]]:
    """``records`` split into the plain tensors (with their addresses) and the others."""
    plain: list[int] = []
    addresses: list[int] = []
    others: list[int] = []
    # Type and dtype once per distinct value: most states are all float32 tensors.
    uniform = {type(t) for _, t in named} <= set(_PLAIN_TYPES) and {t.dtype for _, t in named} <= {
        torch.float32
    }
    f32, kinds = torch.float32, _PLAIN_TYPES
    for i in records:
        t = named[i][1]
        if (
            (uniform or (type(t) in kinds and t.dtype is f32))
            and t.is_cpu
            and t.is_contiguous()
            and not t.is_neg()
        ):
            plain.append(i)
            addresses.append(t.data_ptr())
        else:
            others.append(i)
    return plain, addresses, others


def plan_load(
    placement: Placement, module_or_tensors: ModuleOrTensors, path: PathOrFile, *, staged: bool
) -> Plan:
    """Check a ``TLSF32B`` file against the state and stage its values (see
    :func:`~tlckpt.runtime.load_module_state`); nothing live changes.

    Returns:
        The plan; its commit writes the live tensors (in place: the copying pass, from the
        file the plan holds open).
    """
    with contextlib.ExitStack() as stack:

        def check() -> tuple[NamedTensors, dict[int, int], _CheckedFile | None]:
            named = float32_named_state(module_or_tensors)
            placement.check(named)
            if {t.dtype for _, t in named} - {torch.float32}:
                for name, t in named:
                    check_convertible(t.dtype, torch.float32, name)
            copies = tied_copies(named)
            if not placement.touches_file:
                return named, copies, None
            f = stack.enter_context(_opened(path))
            return named, copies, (f, validate_float32_state(f, [t.shape for _, t in named]))

        named, copies, checked = placement.agree(
            check, lambda result: layout_of("TLSF32B load", result[0], result[1])
        )
        if placement.reads_in_place and checked is not None:  # one process: bulk transfers
            if not staged:
                _precheck(*checked, named, copies)
                return _InPlacePlan(*checked, named, copies, stack.pop_all())
            return _stage(*checked, named, copies)
        sent = written(named, copies)
        receiver = placement.receiver([named[i][1] for i in sent])
        sink = _Receiving(named, copies, sent, receiver)
        placement.transfer(receiver, lambda: read_payloads(*checked, sink))  # type: ignore[misc]
    return state_plan(named, sent, receiver)


def _stage(f: BinaryIO, layout: StateLayout, named: NamedTensors, copies: dict[int, int]) -> Plan:
    """A local staged load: every payload into one fresh staging buffer (a mapping of its
    own when large) with a few vectored reads, tied copies compared with their originals there,
    integer tensors converted; the plan holds the staging and what goes where."""
    sizes = layout.size_array
    starts = np.zeros(len(sizes), dtype=np.int64)
    np.cumsum(sizes[:-1], out=starts[1:])
    staging = fresh_bytes(int(sizes.sum()))
    base = address_of(staging)
    read_extents(f, layout, list(range(len(sizes))), base + starts.astype(np.uint64), [staging])
    bounds = list(zip(starts.tolist(), sizes.tolist()))

    def values(i: int) -> torch.Tensor:
        at, n = bounds[i]
        return torch.from_numpy(staging[at : at + n].view(np.float32)).view(named[i][1].shape)

    for copy, original in copies.items():
        (a, n), (b, _) = bounds[copy], bounds[original]
        if not same_bytes(staging[a : a + n], staging[b : b + n]):
            raise tie_conflict(named, copy, original)
    plain, live_addresses, rest = _plain(named, written(named, copies))
    # Other tensors' values: converted (exactly, or the load fails) before anything live
    # is touched.
    others = []
    for i in rest:
        name, t = named[i]
        others.append((t, from_file_dtype(values(i), t.dtype, name)))
    index = np.asarray(plain, dtype=np.int64)
    lengths = sizes[index]
    live = [named[i][1] for i in plain]
    return _StagedPlan(
        Extents.build(live_addresses, lengths, None, live),
        Extents.build(base + starts[index].astype(np.uint64), lengths, None, [staging]),
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
            _bump_versions(self.live)
            for live, values in self.others:
                overwrite(live, values)


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
        self.ties = TieCheck(named, copies, keep=receiver.keeps_buffers)
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
        if record in self.ties.tied and self.ties.is_copy(record, buffer):
            return
        name, t = self.named[record]
        values = self.values.view(t.shape)
        if t.dtype != torch.float32:
            values = from_file_dtype(values, t.dtype, name)  # exactly, or the load fails
        self.receiver.put(self.pending, values)  # type: ignore[arg-type]  # not a copy


class Precheck:
    """Payload sink of an in-place load's checking pass: what the structural validation
    cannot see.

    Integer tensors' values must convert exactly, and the copies of a tied tensor must
    agree (compared by digest, so one payload at a time is held). Other payloads are
    skipped.
    """

    def __init__(self, named: NamedTensors, copies: dict[int, int], staging: HostBuffer):
        self.named = named
        self.ties = TieCheck(named, copies, keep=False)
        self.staging = staging

    def needs(self, record: int) -> bool:
        """Whether the checking pass has to read this tensor's payload at all."""
        return self.named[record][1].dtype != torch.float32 or self.ties.needs(record)

    def buffer(self, record: int, field: str, count: int, dtype: np.dtype) -> Any:
        return self.staging.array(count, dtype) if self.needs(record) else None

    def done(self, record: int, field: str, buffer: Any) -> None:
        if not self.ties.is_copy(record, buffer):
            name, t = self.named[record]
            from_file_dtype(torch.from_numpy(buffer), t.dtype, name)


def _precheck(
    f: BinaryIO, layout: StateLayout, named: NamedTensors, copies: dict[int, int]
) -> None:
    """What an in-place load checks before its copying pass beyond the structure: tied
    copies first (as a staged load does), compared with their originals in the file chunk by
    chunk; then the values of integer tensors, which must convert exactly."""
    for copy, original in sorted(copies.items()):
        if not float32_payloads_equal(f, layout, original, copy):
            raise tie_conflict(named, copy, original)
    if {t.dtype for _, t in named} - {torch.float32}:
        read_payloads(f, layout, Precheck(named, {}, HostBuffer()))


class _Installer:
    """Payload sink of an in-place load for the tensors that are not plain: each payload
    through the one reusable host buffer and ``copy_``. ``written`` counts them."""

    def __init__(self, named: NamedTensors, records: set[int], staging: HostBuffer):
        self.named = named
        self.records = records
        self.staging = staging
        self.written = 0

    def buffer(self, record: int, field: str, count: int, dtype: np.dtype) -> Any:
        if record not in self.records:
            return None  # plain (read in bulk) or a tied copy (its original was written)
        return self.staging.array(count, dtype)

    def done(self, record: int, field: str, buffer: Any) -> None:
        name, t = self.named[record]
        values = from_file_dtype(torch.from_numpy(buffer).view(t.shape), t.dtype, name)
        self.written += 1
        overwrite(t, values)


class _InPlacePlan(Plan):
    """A checked file whose payloads the commit reads straight into the live tensors."""

    def __init__(
        self,
        file: BinaryIO,
        layout: StateLayout,
        named: NamedTensors,
        copies: dict[int, int],
        resources: contextlib.ExitStack,
    ):
        self.file = file
        self.layout = layout
        self.named = named
        self.copies = copies
        self.resources = resources

    def close(self) -> None:
        self.resources.close()

    def commit(self) -> None:
        """The copying pass, with Ctrl-C held back throughout: the tensors that are not
        plain one by one, then the plain ones in bulk, straight into their memory.

        Raises:
            PartialLoadError: the file changed, was truncated or could not be read after
                live tensors had been overwritten.
        """
        named = self.named
        records = written(named, self.copies)
        plain, addresses, rest = _plain(named, records)
        live = [named[i][1] for i in plain]
        installer = _Installer(
            named, set(rest), HostBuffer(pin=any(named[i][1].is_cuda for i in rest))
        )
        touched = 0  # plain tensors whose memory a read may have changed so far

        def progress(through: int) -> None:
            nonlocal touched
            touched = through

        with committing():
            try:
                if installer.records:
                    read_payloads(self.file, self.layout, installer)
                if plain:
                    read_extents(self.file, self.layout, plain, addresses, live, progress)
                    _bump_versions(live)
            except Exception as exc:
                done = touched + installer.written
                if not done:
                    raise  # refused before the first write: the model is unchanged
                total = len(records)
                reason = exc.reason if isinstance(exc, CheckpointError) else str(exc)
                raise PartialLoadError(
                    f"the model was partially updated: {done} of {total} tensors"
                    f" had been overwritten when the in-place load failed ({reason}). Load a"
                    " complete file again or restore the model; a staged load (the default)"
                    " never leaves a model like this",
                    actual=done,
                    expected=total,
                    path=getattr(exc, "path", None) or getattr(exc, "filename", None),
                ) from exc
