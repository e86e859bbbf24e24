"""Float32 model state as ``TLSF32B``: the save, and the load as a plan committed after.

Both are written once over a :class:`~.placement.Placement` (one process, or every rank of a
sharded model with rank 0 at the file).

Saving writes one tensor at a time; device tensors pass through one reusable (pinned) host
buffer. Loading opens the file once for every pass. The first checks the whole file (tensor
count, every shape, sizes, the end of file) without reading a payload. Then either:

* staged (the default; always, when sharded): every payload is read into new memory through
  the placement's :class:`~.placement.Receiver`, where integer tensors' values are checked to
  convert exactly and the copies of a tied tensor to agree; the file is checked not to have
  changed since the first pass began; the plan's commit copies every value into its live
  tensor;
* in place (local only): a checking pass reads what the first could not check (integer
  tensors, tied copies); the plan's commit is the copying pass, which reads each payload
  straight into its live tensor, and reports a file that changes or fails to read under it
  as a :class:`~tlckpt.codec.errors.PartialLoadError`.

Every payload pass goes through :func:`read_payloads`.
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
    float32_state_layout,
    read_float32_payloads,
    validate_float32_state,
    write_float32_state,
)
from ..codec.source import PathOrFile
from ..formats.float32_state import TENSOR_DTYPE
from .dtensors import fingerprint, local_tensor
from .placement import Placement, Receiver, Take
from .plans import Plan, StatePlan, committing, overwrite
from .positional import read_pieces, save_pieces
from .state_tensors import (
    ModuleOrTensors,
    NamedTensors,
    TieCheck,
    float32_named_state,
    layout_of,
    state_plan,
    tied_copies,
    written,
)
from .tensors import HostBuffer, check_convertible, from_file_dtype, to_file_dtype

__all__ = ["save", "plan_load", "read_payloads"]

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

    def check() -> NamedTensors:
        named = float32_named_state(module_or_tensors)
        placement.check(named)
        for name, t in named:
            if t.dtype != torch.float32:  # raises before anything is written
                to_file_dtype(local_tensor(t), torch.float32, name)  # each rank: its shard
        return named

    named = placement.agree(check, lambda named: layout_of("TLSF32B save", named))
    tensors = [t for _, t in named]
    if placement.parallel(path, "save", tensors):
        staging = HostBuffer(pin=any(t.is_cuda for t in tensors))
        layout = float32_state_layout([tuple(t.shape) for t in tensors])
        save_pieces(
            path,  # type: ignore[arg-type]  # a path: parallel() says so
            layout,
            tensors,
            lambda i, local: _host_float32(local, named[i][0], staging),
        )
        return

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

        def check() -> tuple[NamedTensors, dict[int, int]]:
            named = float32_named_state(module_or_tensors)
            placement.check(named)
            for name, t in named:
                check_convertible(t.dtype, torch.float32, name)
            return named, tied_copies(named)

        named, copies = placement.agree(
            check, lambda result: layout_of("TLSF32B load", result[0], result[1])
        )
        parallel = placement.parallel(path, "load", [t for _, t in named])

        def validate() -> _CheckedFile | None:
            if not (parallel or placement.touches_file):
                return None
            f = stack.enter_context(_opened(path))
            return f, validate_float32_state(f, [tuple(t.shape) for _, t in named])

        # In parallel every rank validated the file itself: they must have found the same.
        checked = placement.agree(
            validate,
            (lambda c: fingerprint(c[1].offsets, c[1].stamp.size)) if parallel else None,  # type: ignore[index]
        )
        if parallel:
            return _read_own_pieces(placement, named, copies, *checked)  # type: ignore[misc]
        if not staged and placement.reads_in_place and checked is not None:
            _precheck(*checked, named, copies)
            return _InPlacePlan(*checked, named, copies, stack.pop_all())
        sent = written(named, copies)
        receiver = placement.receiver([named[i][1] for i in sent])
        sink = _Receiving(named, copies, sent, receiver)
        placement.transfer(receiver, lambda: read_payloads(*checked, sink))  # type: ignore[misc]
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
    ties = TieCheck(named, copies, keep=True)
    parts: dict[int, torch.Tensor] = {}

    def keep(record: int, piece: np.ndarray) -> None:
        if record in ties.tied and ties.is_copy(record, piece):
            return
        name, t = named[record]
        values = torch.from_numpy(piece)
        if t.dtype != torch.float32:
            values = from_file_dtype(values, t.dtype, name)  # exactly, or the load fails
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
    precheck = Precheck(named, copies, HostBuffer())
    if any(precheck.needs(i) for i in range(len(named))):
        read_payloads(f, layout, precheck)


class _Installer:
    """Payload sink of an in-place load: each payload lands in its live tensor.

    A contiguous CPU float32 tensor is read into directly (no copy); anything else goes
    through the one reusable host buffer and ``copy_``. ``written`` counts the tensors whose
    memory may have been changed so far (a direct read counts from its first byte).
    """

    def __init__(self, named: NamedTensors, copies: dict[int, int], staging: HostBuffer):
        self.named = named
        self.copies = copies
        self.staging = staging
        self.direct = False
        self.written = 0

    def buffer(self, record: int, field: str, count: int, dtype: np.dtype) -> Any:
        if record in self.copies:
            return None  # its original was written already, and the check pass saw they agree
        t = self.named[record][1]
        self.direct = (
            t.is_cpu
            and t.dtype == torch.float32
            and t.is_contiguous()
            and not t.is_neg()  # a lazily negated view has no plain memory to read into
        )
        if self.direct:
            self.written += 1
            return t.detach().numpy()  # the tensor's own memory; readinto fills it
        return self.staging.array(count, dtype)

    def done(self, record: int, field: str, buffer: Any) -> None:
        name, t = self.named[record]
        if self.direct:
            # Written behind autograd's back: bump the version so a graph that saved this
            # tensor notices, as it would after copy_.
            if not t.is_inference():
                increment_version(t)
            return
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
        """The copying pass, with Ctrl-C held back throughout.

        Raises:
            PartialLoadError: the file changed, was truncated or could not be read after
                live tensors had been overwritten.
        """
        named = self.named
        installer = _Installer(named, self.copies, HostBuffer(pin=any(t.is_cuda for _, t in named)))
        with committing():
            try:
                read_payloads(self.file, self.layout, installer)
            except Exception as exc:
                if not installer.written:
                    raise  # refused before the first write: the model is unchanged
                total = len(named) - len(self.copies)
                reason = exc.reason if isinstance(exc, CheckpointError) else str(exc)
                raise PartialLoadError(
                    f"the model was partially updated: {installer.written} of {total} tensors"
                    f" had been overwritten when the in-place load failed ({reason}). Load a"
                    " complete file again or restore the model; a staged load (the default)"
                    " never leaves a model like this",
                    actual=installer.written,
                    expected=total,
                    path=getattr(exc, "path", None) or getattr(exc, "filename", None),
                ) from exc
