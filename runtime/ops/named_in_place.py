"""A leased safetensors load: payloads straight into the live tensors, with no staging copy.

The default ``load_module_state`` of a ``.safetensors`` path takes a read lease on the file
(:mod:`~tlckpt.codec.fileio.leases`): where one is granted nobody can change the file until
the load ends, so after the header, names, dtypes, shapes and tied copies are checked, the
commit reads each payload into its live tensor's memory (large warm ones copied from a
mapping of the file: :mod:`~tlckpt.codec.fileio.mapped`) — all or nothing as long as the disk
reads, like ``TLSF32B``'s leased load. Tensors whose memory is not the file's bytes (on a
device, not contiguous, a lazily negated or conjugated view, sharing memory with another
entry) are staged as before and copied in by the same commit. Where no lease is granted
the load stages (:mod:`.named_module_state`).
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import numpy as np
import torch

from ...codec.fileio.leases import ReadLease, leased
from ...codec.fileio.mapped import FileMapping, mapped
from ...codec.fileio.source import FileStamp, open_regular, open_source
from ...codec.fileio.transfer import Extents, read_extents
from ...codec.safetensors import Header, TensorEntry
from ..commit.plans import Plan, committing, overwrite
from .entry_staging import stage_entries
from .float32_bulk import bump_versions
from .state_tensors import NamedTensors, lease_outwaited, partial_load
from .tensor_files import read_entry

__all__ = ["open_leased", "plan_in_place", "reopened", "same_in_file"]


@contextlib.contextmanager
def open_leased(path: Any) -> Any:
    """``(file, lease)`` for a path this process gets a read lease on, else ``None``; the
    file is closed (and the lease released) when the block ends."""
    if not isinstance(path, (str, os.PathLike)):
        yield None
        return
    with open_regular(path) as f, leased(f) as lease:
        yield None if lease is None else (f, lease)


def reopened(f: Any, stamp: FileStamp) -> Any:
    """:func:`open_source` over the leased file from its first byte (offsets in the header
    count from there), checked against ``stamp``, the checks' stamp."""
    f.seek(0)
    return open_source(f, since=stamp)


def same_in_file(
    header: Header,
    a: TensorEntry,
    b: TensorEntry,
    opened: tuple[Any, ReadLease],
    stamp: FileStamp,
) -> bool:
    """Whether two tensors of the leased file hold the same bytes: compared in a mapping of
    the file where their pages are in memory, else read (one copy of each)."""
    if a.nbytes != b.nbytes:
        return False
    f, lease = opened
    start = header.data_start
    with mapped(f, lease) as mapping, reopened(f, stamp) as src:
        if mapping is not None:
            same = mapping.same(start + a.begin, start + b.begin, a.nbytes)
            if same is not None:
                return same
        x, y = read_entry(src, header, a), read_entry(src, header, b)
        return torch.equal(x.reshape(-1).view(torch.uint8), y.reshape(-1).view(torch.uint8))


def _plain(t: torch.Tensor) -> bool:
    """Whether the tensor's memory holds exactly its values, in order, on the host."""
    return (
        t.device.type == "cpu"
        and t.is_contiguous()
        and not t.is_neg()
        and not t.is_conj()
        and t.numel() > 0
    )


def _disjoint(tensors: list[torch.Tensor]) -> bool:
    """Whether no two tensors' bytes overlap."""
    spans = sorted((t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()) for t in tensors)
    return all(spans[k][1] <= spans[k + 1][0] for k in range(len(spans) - 1))


def plan_in_place(
    named: NamedTensors,
    sources: dict[str, str],
    header: Header,
    opened: tuple[Any, ReadLease],
    stamp: FileStamp,
    stack: contextlib.ExitStack,
) -> Plan | None:
    """The plan of a leased load whose file ``opened`` holds the checked ``header``: the
    payloads of plain live tensors are read into them by the commit, the others staged now.
    The plan takes over what ``stack`` holds (the file, its lease) once nothing can fail;
    ``None`` (stage instead) where the plain tensors' memory overlaps.

    ``sources``: model name → file tensor, tied copies of the model already left out (their
    originals are written, their file tensors compared by the caller).
    """
    f, lease = opened
    plain = [(name, t) for name, t in named if name in sources and _plain(t)]
    if not _disjoint([t for _, t in plain]):
        return None
    plain_names = {name for name, _ in plain}
    rest = [(name, t) for name, t in named if name in sources and name not in plain_names]
    mapping = stack.enter_context(mapped(f, lease))
    with reopened(f, stamp) as src:  # the file was checked through this handle
        staged = stage_entries(src, header, (sources[name] for name, _ in rest))
    pairs = [(t, _on_device(staged[sources[name]], t)) for name, t in rest]
    entries = [header.entries[sources[name]] for name, _ in plain]
    order = np.argsort([e.begin for e in entries], kind="stable")
    live = [plain[k][1] for k in order.tolist()]
    extents = Extents.build(
        [t.data_ptr() for t in live],
        [entries[k].nbytes for k in order.tolist()],
        [header.data_start + entries[k].begin for k in order.tolist()],
        live,
    )
    return _LeasedPlan(f, stamp, extents, live, pairs, lease, mapping, stack.pop_all())


def _on_device(value: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
    return value if live.device.type == "cpu" else value.to(live.device)


class _LeasedPlan(Plan):
    """Checked payloads the commit reads into the live tensors' memory under the lease."""

    def __init__(
        self,
        file: Any,
        stamp: FileStamp,
        extents: Extents,
        live: list[torch.Tensor],
        pairs: list[tuple[torch.Tensor, torch.Tensor]],
        lease: ReadLease,
        mapping: FileMapping | None,
        resources: contextlib.ExitStack,
    ):
        self.file = file
        self.stamp = stamp
        self.extents = extents
        self.live = live
        self.pairs = pairs
        self.lease = lease
        self.mapping = mapping
        self.resources = resources

    def close(self) -> None:
        self.resources.close()

    def commit(self) -> None:
        """The staged values, then the payloads read into their tensors, Ctrl-C held back.

        Raises:
            PartialLoadError: the disk failed to read, or a writer outwaited the kernel's
                lease-break time, after live tensors had been overwritten.
        """
        touched = 0

        def progress(through: int) -> None:
            nonlocal touched
            touched = through

        with committing():
            for live, values in self.pairs:
                overwrite(live, values)
            try:
                with open_source(self.file, since=self.stamp) as src:
                    read_extents(src.file, self.extents, "payload", progress, self.mapping)
                bump_versions(self.live)
                if not self.lease.intact():
                    touched = len(self.live)
                    raise lease_outwaited()
            except Exception as exc:
                done = touched + len(self.pairs)
                if not done:
                    raise  # refused before the first write: the model is unchanged
                total = len(self.live) + len(self.pairs)
                raise partial_load(exc, done, total, leased=True) from exc
