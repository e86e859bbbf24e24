"""Model state (parameters and persistent buffers) ↔ ``TLSF32B`` and exact-bits JSON.

State is ``state_dict()`` order: parameters (tied ones once per place they are registered,
frozen ones included) and persistent buffers, without names (FORMAT.md §4). The file's scalar
type is the model's one floating dtype; an integer or bool tensor (BatchNorm's
``num_batches_tracked``) travels in it only when the conversion is exact both ways.

Loading is all or nothing. The default, staged, load reads and checks the whole file into
fresh host memory, verifies the file did not change meanwhile, and only then copies every
value into its live tensor (device, dtype and storage stay, so tied parameters stay tied and
optimizers keep pointing at the same tensors) with Ctrl-C held back until the copies are
done. The in-place load (``staged=False``) checks the whole file first, then reads each
payload straight into its tensor: no copy of the state, but a file changed or truncated by
another process during that pass leaves a partial update, reported as
:class:`~tlckpt.codec.errors.PartialLoadError`.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, BinaryIO

import numpy as np
import torch
from torch.autograd.graph import increment_version

from ..codec.errors import (
    CheckpointError,
    ConfigError,
    PartialLoadError,
    SchemaMismatchError,
    names_the_file,
)
from ..codec.float32_state import (
    StateLayout,
    read_float32_payloads,
    validate_float32_state,
    write_float32_state,
)
from ..codec.gcpause import without_gc
from ..codec.interrupts import deferred_interrupts
from ..codec.source import PathOrFile
from ..codec.state_bits import read_state_bits, write_state_bits
from .dtensors import local_tensor, reusable, sharded
from .slots import view_key
from .tensors import (
    HostBuffer,
    check_convertible,
    encoding_of,
    file_dtype_of,
    from_file_dtype,
    from_host,
    to_file_dtype,
    to_host,
)

__all__ = [
    "state_tensors",
    "save_module_state",
    "load_module_state",
    "save_state_bits",
    "load_state_bits",
]

ModuleOrTensors = torch.nn.Module | Sequence[torch.Tensor] | Mapping[str, torch.Tensor]
NamedTensors = list[tuple[str, torch.Tensor]]

#: Scalar type of exact-bits JSON state that has no floating tensor to decide it (a model of
#: integer buffers only, or no state at all): binary64 holds every integer up to 2^53.
DEFAULT_BITS_DTYPE = torch.float64


def state_tensors(module_or_tensors: ModuleOrTensors) -> NamedTensors:
    """The live state tensors with their names, in file order.

    Args:
        module_or_tensors: an ``nn.Module`` (its ``state_dict(keep_vars=True)``: parameters
            and persistent buffers), a mapping of names to tensors, or a sequence of tensors.

    Returns:
        ``(name, tensor)`` pairs; the tensors are the live ones (not copies).

    Raises:
        CheckpointError: an entry of the state is not a tensor (for example ``_extra_state``).
        TypeError: the argument is none of the accepted kinds.
    """
    if isinstance(module_or_tensors, torch.nn.Module):
        items = list(module_or_tensors.state_dict(keep_vars=True).items())
    elif isinstance(module_or_tensors, Mapping):
        items = list(module_or_tensors.items())
    elif isinstance(module_or_tensors, torch.Tensor):
        raise TypeError("pass a module or a sequence of tensors, not a single tensor")
    else:
        items = [(f"state[{i}]", t) for i, t in enumerate(module_or_tensors)]
    for name, t in items:
        if not isinstance(t, torch.Tensor):
            raise CheckpointError(
                f"state entry {name!r} is a {type(t).__name__}, not a tensor; the formats"
                " hold tensors only",
                field=str(name),
            )
    return [(str(name), t) for name, t in items]


def float32_named_state(module_or_tensors: ModuleOrTensors) -> NamedTensors:
    """The state, checked to be storable as float32 (TLSF32B holds nothing else)."""
    named = state_tensors(module_or_tensors)
    dtype = file_dtype_of(named)
    if dtype not in (None, torch.float32):
        raise ConfigError(
            f"TLSF32B holds float32 state only and this model is {dtype}; use"
            " save_state_bits/load_state_bits for its exact bits",
            actual=str(dtype),
            expected="torch.float32",
        )
    return named


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


def host_float32(t: torch.Tensor, name: str, staging: HostBuffer) -> np.ndarray:
    t = to_file_dtype(t.detach(), torch.float32, name)
    if t.device.type == "cpu":
        return t.contiguous().numpy()  # a view of the live tensor unless it was strided
    host = staging.tensor(t.numel(), torch.float32)
    host.copy_(t.reshape(-1))
    return host.numpy().reshape(t.shape)


@names_the_file()
@without_gc
def save_module_state(module_or_tensors: ModuleOrTensors, path: PathOrFile) -> None:
    """Write a float32 model's state as a ``TLSF32B`` file (atomically for a path).

    Tensors are written one at a time; device tensors pass through one reusable (pinned)
    host buffer, so no more than one tensor's payload is held beyond the model.

    A model holding DTensors (FSDP2 ``fully_shard``, ``distribute_tensor``) makes this a
    collective: every rank calls it and rank 0 alone opens the file (see
    :mod:`tlckpt.runtime.sharded_state`); errors are then raised on every rank alike.

    Args:
        module_or_tensors: an ``nn.Module`` (``state_dict`` order) or a sequence of tensors.
        path: destination path, or a binary file object written at its position.

    Raises:
        ConfigError: the model is not float32, mixes floating dtypes, or has an integer
            tensor that float32 cannot hold exactly (the message names it). Checked before
            the first byte is written.
        OSError: from the file system.

    Example:
        >>> save_module_state(model, "model.tlsf32")           # doctest: +SKIP
    """
    module_or_tensors = reusable(module_or_tensors)
    if sharded(module_or_tensors):
        from . import sharded_state

        return sharded_state.save_module_state(module_or_tensors, path)
    named = float32_named_state(module_or_tensors)
    for name, t in named:
        if t.dtype != torch.float32:
            to_file_dtype(t, torch.float32, name)  # raises before anything is written
    staging = HostBuffer(pin=any(t.is_cuda for _, t in named))
    arrays = (host_float32(t, name, staging) for name, t in named)
    write_float32_state(path, arrays, count=len(named))


def tied_copies(named: NamedTensors) -> dict[int, int]:
    """State index → the earlier index holding the very same tensor view (tied weights are
    in ``state_dict`` once per place they are registered)."""
    # Two views can only be the same if they start at the same address: bucket by that
    # (cheap) and compare full view keys within the rare buckets of more than one tensor.
    by_address: dict[int, list[int]] = {}
    for i, (_, t) in enumerate(named):
        if t.numel():
            by_address.setdefault(local_tensor(t).data_ptr(), []).append(i)
    copies: dict[int, int] = {}
    for candidates in by_address.values():
        if len(candidates) > 1:
            first: dict[tuple, int] = {}
            for i in candidates:
                j = first.setdefault(view_key(named[i][1]), i)
                if j != i:
                    copies[i] = j
    return copies


def tie_conflict(named: NamedTensors, i: int, j: int) -> SchemaMismatchError:
    return SchemaMismatchError(
        f"tensor {i} ({named[i][0]!r}) is tied to tensor {j} ({named[j][0]!r}) but the file"
        " holds different values for them",
        field=f"tensors[{i}]",
    )


class Precheck:
    """Payload sink for the checking pass: what the structural validation cannot see.

    Integer tensors' values must convert exactly, and the copies of a tied tensor must
    agree (compared by digest, so one payload at a time is held). Other payloads are
    skipped.
    """

    def __init__(self, named: NamedTensors, copies: dict[int, int], staging: HostBuffer):
        self.named = named
        self.copies = copies
        self.originals = set(copies.values())
        self.staging = staging
        self.digests: dict[int, bytes] = {}

    def needs(self, record: int) -> bool:
        """Whether the checking pass has to read this tensor's payload at all."""
        return (
            self.named[record][1].dtype != torch.float32
            or record in self.copies
            or record in self.originals
        )

    def buffer(self, record: int, field: str, count: int, dtype: np.dtype) -> Any:
        return self.staging.array(count, dtype) if self.needs(record) else None

    def done(self, record: int, field: str, buffer: Any) -> None:
        name, t = self.named[record]
        from_file_dtype(torch.from_numpy(buffer), t.dtype, name)
        if record in self.originals or record in self.copies:
            digest = hashlib.sha256(memoryview(buffer).cast("B")).digest()
            if record in self.originals:
                self.digests[record] = digest
            elif self.digests[self.copies[record]] != digest:
                raise tie_conflict(self.named, record, self.copies[record])


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
        with torch.no_grad():
            _overwrite(t, values)


class _Stager:
    """Payload sink of a staged load: every payload into fresh host memory, checked there.

    A float32 tensor's payload is read straight into a new tensor, which is its staged
    value; an integer or bool tensor's goes through one reusable buffer and is converted
    (exactly, or the load fails). A tied copy's payload is compared bit for bit with its
    original's and dropped. Nothing live is touched: :func:`commit` does that afterwards.
    """

    def __init__(self, named: NamedTensors, copies: dict[int, int]):
        self.named = named
        self.copies = copies
        self.originals = set(copies.values())
        self.staging = HostBuffer()
        self.values: list[torch.Tensor | None] = [None] * len(named)
        self.file_bits: dict[int, np.ndarray] = {}
        self.fresh: torch.Tensor | None = None

    def buffer(self, record: int, field: str, count: int, dtype: np.dtype) -> Any:
        if record in self.copies or self.named[record][1].dtype != torch.float32:
            return self.staging.array(count, dtype)
        self.fresh = torch.empty(count, dtype=torch.float32)
        return self.fresh.numpy()

    def done(self, record: int, field: str, buffer: Any) -> None:
        name, t = self.named[record]
        if record in self.copies:
            original = self.copies[record]
            if not np.array_equal(buffer.view(np.uint32), self.file_bits[original]):
                raise tie_conflict(self.named, record, original)
            return
        if t.dtype == torch.float32:
            values, self.fresh = self.fresh, None
        else:
            values = from_file_dtype(torch.from_numpy(buffer), t.dtype, name)  # a new tensor
        if record in self.originals:  # the file's bits, for the tied copies that follow
            bits = buffer.view(np.uint32)
            self.file_bits[record] = bits if t.dtype == torch.float32 else bits.copy()
        self.values[record] = values.view(t.shape)


def _overwrite(live: torch.Tensor, values: torch.Tensor) -> None:
    """``live.copy_(values)``, under ``no_grad`` held by the caller. An inference tensor
    accepts in-place writes only under inference mode."""
    if live.is_inference():
        with torch.inference_mode():
            live.copy_(values)
    else:
        live.copy_(values)


def commit(pairs: Iterable[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Copy each new value into its live tensor: all of them, or none if interrupted before
    this begins.

    The values are complete and checked, and ``copy_`` into a tensor of the same shape does
    not fail for a reason of the file's. Ctrl-C is held back until the last copy is done
    (:func:`~tlckpt.codec.interrupts.deferred_interrupts`); ``pairs`` may be a generator, it
    is consumed inside.
    """
    with deferred_interrupts(), torch.no_grad():
        for live, values in pairs:
            _overwrite(live, values)


def _staged_pairs(
    named: NamedTensors, values: Sequence[torch.Tensor | None], copies: dict[int, int]
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(live tensor, new value), tied copies left out: they share their original's memory."""
    for i, (_, t) in enumerate(named):
        if i not in copies:
            yield t, values[i]  # type: ignore[misc]


@names_the_file()
@without_gc
def load_module_state(
    module_or_tensors: ModuleOrTensors, path: PathOrFile, *, staged: bool = True
) -> None:
    """Load a ``TLSF32B`` file into a float32 model, in place, all or nothing.

    One open handle serves every pass. The first checks the whole file (tensor count, every
    shape, sizes, the end of file) without touching the model. Then:

    * ``staged=True`` (the default): every payload is read into fresh host memory, where
      integer tensors' values are checked to convert exactly and the copies of a tied
      tensor to agree; the file is checked not to have changed since the first pass began;
      only then is every value copied into its live tensor, with Ctrl-C held back until the
      last copy is done. Whatever fails or interrupts the load — a bad or truncated file,
      another process rewriting it, ``KeyboardInterrupt`` — the model holds either all of its
      previous values or all of the file's. Costs one transient copy of the state in host
      memory (plus one tensor's payload for tied or integer tensors).
    * ``staged=False``: a checking pass reads only what the first could not check (integer
      tensors, tied copies); the copying pass then reads each payload straight into its
      tensor when it is a contiguous CPU float32 tensor, else through one reusable (pinned)
      host buffer: at most one tensor's payload of extra memory. Ctrl-C is held back for
      the whole copying pass. If the file changes or fails to read *during* that pass, the
      model is partially updated and :class:`PartialLoadError` says so.

    A model holding DTensors (FSDP2 ``fully_shard``, ``distribute_tensor``) makes this a
    collective: every rank calls it and rank 0 alone opens the file (see
    :mod:`tlckpt.runtime.sharded_state`); errors are then raised on every rank alike. Such
    loads are always staged (each rank keeps its new shards off to the side until all have
    arrived), whatever ``staged`` says.

    Args:
        module_or_tensors: the destination model or tensors (``state_dict`` order).
        path: file path, or a seekable binary file object read from its position.
        staged: stage the whole state before writing any of it (all or nothing, one copy
            of the state), or copy in place (bounded memory).

    Raises:
        CheckpointError: the file does not fit the model (a subclass naming the tensor,
            offset and values), holds different values for tied copies, or the model is not
            float32; the model is unchanged.
        FileChangedError: another process changed the file during the load; the model is
            unchanged.
        PartialLoadError: only with ``staged=False``: the file changed, was truncated or
            could not be read after live tensors had been overwritten; the message says how
            many, and ``__cause__`` why.
        OSError: from the file system; the model is unchanged (with ``staged=False``, an
            ``OSError`` during the copying pass becomes a :class:`PartialLoadError`).

    Example:
        >>> load_module_state(model, "model.tlsf32")           # doctest: +SKIP
    """
    module_or_tensors = reusable(module_or_tensors)
    if sharded(module_or_tensors):
        from . import sharded_state

        return sharded_state.load_module_state(module_or_tensors, path)
    named = float32_named_state(module_or_tensors)
    for name, t in named:
        check_convertible(t.dtype, torch.float32, name)
    shapes = [tuple(t.shape) for _, t in named]
    copies = tied_copies(named)
    with _opened(path) as f:
        layout = validate_float32_state(f, shapes)
        if not staged:
            return _load_in_place(f, layout, named, copies)
        stager = _Stager(named, copies)
        read_float32_payloads(f, layout, stager)
    commit(_staged_pairs(named, stager.values, copies))


def _load_in_place(
    f: BinaryIO, layout: StateLayout, named: NamedTensors, copies: dict[int, int]
) -> None:
    """The checking and copying passes of ``load_module_state(..., staged=False)``."""
    staging = HostBuffer(pin=any(t.is_cuda for _, t in named))
    precheck = Precheck(named, copies, staging)
    if any(precheck.needs(i) for i in range(len(named))):
        read_float32_payloads(f, layout, precheck)
    installer = _Installer(named, copies, staging)
    with deferred_interrupts():
        try:
            read_float32_payloads(f, layout, installer)
        except Exception as exc:
            if not installer.written:
                raise  # refused before the first write: the model is unchanged
            total = len(named) - len(copies)
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


def bits_named_state(module_or_tensors: ModuleOrTensors) -> tuple[NamedTensors, torch.dtype, str]:
    named = state_tensors(module_or_tensors)
    dtype = file_dtype_of(named) or DEFAULT_BITS_DTYPE
    return named, dtype, encoding_of(dtype, "model state")


@names_the_file()
@without_gc
def save_state_bits(
    module_or_tensors: ModuleOrTensors, path: PathOrFile, *, pretty: bool = True
) -> None:
    """Write the model's state as exact-bits JSON in the model's own floating dtype.

    Every word is kept, NaN payloads and subnormals included. The encoding follows the
    dtype: float64, float32, float16, bfloat16, the float8 kinds, complex32/64/128 (a model
    without floating tensors uses float64).

    A model holding DTensors (FSDP2 ``fully_shard``, ``distribute_tensor``) makes this a
    collective: every rank calls it and rank 0 alone opens the file (see
    :mod:`tlckpt.runtime.sharded_state`); errors are then raised on every rank alike.

    Args:
        module_or_tensors: an ``nn.Module`` (``state_dict`` order) or a sequence of tensors.
        path: destination path (written atomically) or a binary file object.
        pretty: indented JSON (default) or compact.

    Raises:
        ConfigError: mixed floating dtypes, a dtype no format holds, or an integer tensor
            whose values the file's type cannot hold exactly (the message names it).
        OSError: from the file system.
    """
    module_or_tensors = reusable(module_or_tensors)
    if sharded(module_or_tensors):
        from . import sharded_state

        return sharded_state.save_state_bits(module_or_tensors, path, pretty)
    named, dtype, encoding = bits_named_state(module_or_tensors)
    arrays = []
    for name, t in named:
        values = to_file_dtype(t.detach(), dtype, name).cpu().contiguous()
        arrays.append(to_host(values))
    write_state_bits(path, arrays, encoding, pretty=pretty)


@names_the_file()
@without_gc
def load_state_bits(
    module_or_tensors: ModuleOrTensors, path: PathOrFile, *, staged: bool = True
) -> None:
    """Load exact-bits JSON state into the model in place, all or nothing.

    The expected format tag follows the model's floating dtype. The whole file is read at
    once, checked not to have changed while it was read, parsed and checked, and every
    value converted for its destination, before any tensor is written; then every value is
    copied into its live tensor with Ctrl-C held back until the last copy is done. A JSON
    document must be parsed whole, so this load is always staged: ``staged`` is accepted
    for symmetry with :func:`load_module_state` and ``staged=False`` changes nothing (it
    neither saves memory nor weakens the guarantee).

    A model holding DTensors (FSDP2 ``fully_shard``, ``distribute_tensor``) makes this a
    collective: every rank calls it and rank 0 alone opens the file (see
    :mod:`tlckpt.runtime.sharded_state`); errors are then raised on every rank alike.

    Args:
        module_or_tensors: the destination model or tensors.
        path: file path or a binary file object.
        staged: accepted for symmetry; JSON loads are always staged.

    Raises:
        CheckpointError: the file does not fit (wrong tag, counts, shapes, words, or a value
            that does not convert exactly into an integer tensor); the model is unchanged.
        FileChangedError: another process changed the file while it was read; the model
            is unchanged.
        OSError: from the file system; the model is unchanged.
    """
    module_or_tensors = reusable(module_or_tensors)
    if sharded(module_or_tensors):
        from . import sharded_state

        return sharded_state.load_state_bits(module_or_tensors, path)
    named, dtype, encoding = bits_named_state(module_or_tensors)
    for name, t in named:
        check_convertible(t.dtype, dtype, name)
    arrays = read_state_bits(path, [tuple(t.shape) for _, t in named], encoding)
    copies = tied_copies(named)
    for i, j in copies.items():
        if arrays[i].tobytes() != arrays[j].tobytes():
            raise tie_conflict(named, i, j)
    sources = []
    for (name, t), array in zip(named, arrays):
        values = from_host(array, dtype).reshape(t.shape)
        sources.append(from_file_dtype(values, t.dtype, name))
    commit(_staged_pairs(named, sources, copies))
