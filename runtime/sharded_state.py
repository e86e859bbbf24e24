"""Model state of sharded modules (DTensor parameters: FSDP2, ``distribute_tensor``).

The public functions of :mod:`.module_state` come here when the model holds a DTensor.
They are then collectives: every rank of the default process group calls them, in the
same order; rank 0 alone opens the file. The file is the one a single process holding the
full values would write, so it loads into any number of ranks, or into one process.

Saving gathers one full tensor at a time to rank 0 (``full_tensor()``), which writes it
before the next is gathered. Loading is all or nothing on every rank: rank 0 checks the
whole file first and every rank learns the verdict; then each tensor is broadcast from
rank 0 and every rank keeps a fresh copy of its own shard, off to the side; only when all
have arrived and every rank is fine (rank 0 has read the last byte and found the file
unchanged since its first pass began) does each rank copy its shards into its live tensors,
with Ctrl-C held back until the copies are done. These loads are therefore always staged:
the ``staged`` keyword of the public functions does not reach them.
Plain tensors next to DTensors (FSDP2 leaves buffers unsharded) are rank 0's on save and
broadcast to every rank on load.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any, BinaryIO

import numpy as np
import torch

from ..codec.float32_state import (
    read_float32_payloads,
    validate_float32_state,
    write_float32_state,
)
from ..codec.source import PathOrFile
from ..codec.state_bits import read_state_bits, write_state_bits
from .collectives import (
    GatherStream,
    ScatterStream,
    check_mesh,
    is_writer,
    share_verdict,
    writer_runs,
)
from .dtensors import fingerprint, local_tensor, spec_of
from .module_state import (
    ModuleOrTensors,
    NamedTensors,
    Precheck,
    bits_named_state,
    commit,
    float32_named_state,
    host_float32,
    tie_conflict,
    tied_copies,
)
from .tensors import (
    HostBuffer,
    check_convertible,
    from_file_dtype,
    from_host,
    to_file_dtype,
    to_host,
)

__all__ = [
    "save_module_state",
    "load_module_state",
    "save_state_bits",
    "load_state_bits",
]


@contextlib.contextmanager
def open_handle(path: PathOrFile) -> Iterator[tuple[BinaryIO, int]]:
    """One open handle for both passes of the writer's read, and where the file starts."""
    if isinstance(path, (str, os.PathLike)):
        with open(path, "rb") as f:
            yield f, 0
    else:
        yield path, path.tell()


def _layout(kind: str, named: NamedTensors, copies: dict[int, int] | None = None) -> bytes:
    described = [(n, str(t.dtype), tuple(t.shape), spec_of(t)) for n, t in named]
    return fingerprint(kind, described, sorted((copies or {}).items()))


def _check_local(named: NamedTensors) -> None:
    for name, t in named:
        check_mesh(name, t)


def _on_cuda(named: NamedTensors) -> bool:
    return any(t.device.type == "cuda" for _, t in named)


def _commit(stream: ScatterStream) -> None:
    """Every destination's new part into its live memory (its local shard for a DTensor),
    with Ctrl-C held back until the last copy is done (:func:`.module_state.commit`)."""
    commit((local_tensor(live), part) for live, part in stream)


def save_module_state(module_or_tensors: ModuleOrTensors, path: PathOrFile) -> None:
    """Collective :func:`~tlckpt.runtime.save_module_state` for a sharded model."""
    named: NamedTensors = []
    error: BaseException | None = None
    layout = b""
    try:
        named = float32_named_state(module_or_tensors)
        _check_local(named)
        for name, t in named:
            if t.dtype != torch.float32:  # each rank vouches for its own shard's values
                to_file_dtype(local_tensor(t), torch.float32, name)
        layout = _layout("TLSF32B save", named)
    except Exception as exc:
        error = exc
    share_verdict(error, layout)

    stream = GatherStream([t for _, t in named], lanes=1)

    def write() -> None:
        staging = HostBuffer(pin=_on_cuda(named))
        arrays = (host_float32(stream.take(i), name, staging) for i, (name, _) in enumerate(named))
        write_float32_state(path, arrays, count=len(named))

    writer_runs(stream, write)


class _Sender:
    """Payload sink of the writer's second pass: each tensor, converted for its
    destination, straight into the scatter stream (tied copies are not sent twice)."""

    def __init__(
        self,
        named: NamedTensors,
        copies: dict[int, int],
        staging: HostBuffer,
        stream: ScatterStream,
    ):
        self.named = named
        self.copies = copies
        self.staging = staging
        self.stream = stream
        self.position = {record: k for k, record in enumerate(_sent(named, copies))}

    def buffer(self, record: int, field: str, count: int, dtype: np.dtype) -> Any:
        if record in self.copies:
            return None
        return self.staging.array(count, dtype)

    def done(self, record: int, field: str, buffer: Any) -> None:
        name, t = self.named[record]
        values = from_file_dtype(torch.from_numpy(buffer).view(t.shape), t.dtype, name)
        self.stream.put(self.position[record], values)


def _sent(named: NamedTensors, copies: dict[int, int]) -> list[int]:
    """The state indices whose values travel (a tied copy shares its original's memory)."""
    return [i for i in range(len(named)) if i not in copies]


def load_module_state(module_or_tensors: ModuleOrTensors, path: PathOrFile) -> None:
    """Collective :func:`~tlckpt.runtime.load_module_state` for a sharded model."""
    named: NamedTensors = []
    copies: dict[int, int] = {}
    error: BaseException | None = None
    layout = b""
    with contextlib.ExitStack() as stack:
        try:
            named = float32_named_state(module_or_tensors)
            _check_local(named)
            for name, t in named:
                check_convertible(t.dtype, torch.float32, name)
            copies = tied_copies(named)
            layout = _layout("TLSF32B load", named, copies)
            if is_writer():
                # The first pass, on rank 0 only: the whole file, nothing live touched.
                shapes = [tuple(t.shape) for _, t in named]
                staging = HostBuffer(pin=_on_cuda(named))
                f, _ = stack.enter_context(open_handle(path))
                payloads = validate_float32_state(f, shapes)
                precheck = Precheck(named, copies, staging)
                if any(precheck.needs(i) for i in range(len(named))):
                    read_float32_payloads(f, payloads, precheck)
        except Exception as exc:
            error = exc
        share_verdict(error, layout)  # go / no-go, the same on every rank

        stream = ScatterStream([named[i][1] for i in _sent(named, copies)])
        writer_runs(
            stream,
            lambda: read_float32_payloads(f, payloads, _Sender(named, copies, staging, stream)),
        )
    _commit(stream)


def save_state_bits(module_or_tensors: ModuleOrTensors, path: PathOrFile, pretty: bool) -> None:
    """Collective :func:`~tlckpt.runtime.save_state_bits` for a sharded model.

    The codec's JSON writer takes all arrays at once, so rank 0 holds the whole gathered
    state while writing (the single-process writer holds it too: it is the model).
    """
    named: NamedTensors = []
    error: BaseException | None = None
    layout = b""
    try:
        named, dtype, encoding = bits_named_state(module_or_tensors)
        _check_local(named)
        for name, t in named:
            to_file_dtype(local_tensor(t), dtype, name)  # each rank checks its own values
        layout = _layout(f"bits save {encoding}", named)
    except Exception as exc:
        error = exc
    share_verdict(error, layout)

    stream = GatherStream([t for _, t in named], lanes=None)  # the writer keeps them all

    def write() -> None:
        arrays = []
        for i, (name, _) in enumerate(named):
            full = to_file_dtype(stream.take(i), dtype, name)
            arrays.append(to_host(full.cpu().contiguous()))
        write_state_bits(path, arrays, encoding, pretty=pretty)

    writer_runs(stream, write)


def load_state_bits(module_or_tensors: ModuleOrTensors, path: PathOrFile) -> None:
    """Collective :func:`~tlckpt.runtime.load_state_bits` for a sharded model."""
    named: NamedTensors = []
    copies: dict[int, int] = {}
    sources: list[torch.Tensor] = []
    error: BaseException | None = None
    layout = b""
    try:
        named, dtype, encoding = bits_named_state(module_or_tensors)
        _check_local(named)
        for name, t in named:
            check_convertible(t.dtype, dtype, name)
        copies = tied_copies(named)
        layout = _layout(f"bits load {encoding}", named, copies)
        if is_writer():
            arrays = read_state_bits(path, [tuple(t.shape) for _, t in named], encoding)
            for i, j in copies.items():
                if arrays[i].tobytes() != arrays[j].tobytes():
                    raise tie_conflict(named, i, j)
            for (name, t), array in zip(named, arrays):
                values = from_host(array, dtype).reshape(t.shape)
                sources.append(from_file_dtype(values, t.dtype, name))
            del arrays
    except Exception as exc:
        error = exc
    share_verdict(error, layout)

    sent = _sent(named, copies)
    stream = ScatterStream([named[i][1] for i in sent])

    def send() -> None:
        for k, i in enumerate(sent):
            stream.put(k, sources[i])
            sources[i] = None  # type: ignore[call-overload]  # sent: free it

    writer_runs(stream, send)
    _commit(stream)
