"""Model state as exact-bits JSON: the save, and the load as a plan committed after.

Both are written once over a :class:`~.placement.Placement`. The codec's JSON writer takes
one tensor at a time (sharded: gathered to rank 0 one at a time, so rank 0 holds one full
tensor beyond its shards); a JSON document is parsed whole, so the reader holds the whole
document while reading, and a load is always staged. JSON text has no offsets that follow
from the schema: sharded JSON always goes through rank 0.
"""

from __future__ import annotations

import torch

from ...codec.fileio.source import PathOrFile
from ...codec.model_state.state_bits import read_state_bits
from ...codec.model_state.state_bits_writer import write_state_bits
from ..binding.dtensors import local_tensor
from ..binding.tensors import check_convertible, from_host, to_file_dtype, to_host
from ..commit.plans import StatePlan
from ..placement.placement_protocol import Placement, Take
from .state_tensors import (
    Arrival,
    ModuleOrTensors,
    NamedTensors,
    bits_named_state,
    layout_of,
    state_plan,
    tied_copies,
    written,
)

__all__ = ["save", "plan_load"]


def save(
    placement: Placement, module_or_tensors: ModuleOrTensors, path: PathOrFile, pretty: bool
) -> None:
    """Write the state as exact-bits JSON (see :func:`~tlckpt.runtime.save_state_bits`)."""

    def check() -> tuple[NamedTensors, torch.dtype, str]:
        named, dtype, encoding = bits_named_state(module_or_tensors)
        placement.check(named)
        for name, t in named:
            to_file_dtype(local_tensor(t), dtype, name)  # each rank checks its own values
        return named, dtype, encoding

    named, dtype, encoding = placement.agree(
        check, lambda checked: layout_of(f"bits save {checked[2]}", checked[0])
    )

    def write(take: Take) -> None:
        arrays = (
            to_host(to_file_dtype(take(i), dtype, name).cpu().contiguous())
            for i, (name, _) in enumerate(named)
        )
        write_state_bits(path, arrays, encoding, pretty=pretty, count=len(named))

    # The writer asks for one tensor at a time and writes it before the next (sharded: rank
    # 0 holds one gathered tensor); every value was checked on its rank before the first.
    placement.gather([t for _, t in named], 1, write)


def _file_values(
    path: PathOrFile, named: NamedTensors, dtype: torch.dtype, encoding: str, copies: dict
) -> list[torch.Tensor | None]:
    """The file's values, checked and converted for each destination, in state order."""
    arrays = read_state_bits(path, [tuple(t.shape) for _, t in named], encoding)
    arrival = Arrival(named, copies, keep=True, as_tensor=lambda a: from_host(a, dtype))
    values = [arrival.arrive(i, array) for i, array in enumerate(arrays)]
    return [None if v is None else v.reshape(t.shape) for v, (_, t) in zip(values, named)]


def plan_load(
    placement: Placement, module_or_tensors: ModuleOrTensors, path: PathOrFile
) -> StatePlan:
    """Read and check exact-bits JSON state for the model and stage its values (see
    :func:`~tlckpt.runtime.load_state_bits`); nothing live changes.

    Returns:
        The plan; its commit copies every value into its live tensor.
    """

    def check() -> tuple[NamedTensors, str, dict[int, int], list[torch.Tensor | None]]:
        named, dtype, encoding = bits_named_state(module_or_tensors)
        placement.check(named)
        for name, t in named:
            check_convertible(t.dtype, dtype, name)
        copies = tied_copies(named)
        values = (
            _file_values(path, named, dtype, encoding, copies) if placement.touches_file else []
        )
        return named, encoding, copies, values

    named, _, copies, values = placement.agree(
        check, lambda checked: layout_of(f"bits load {checked[1]}", checked[0], checked[2])
    )
    sent = written(named, copies)
    receiver = placement.receiver([named[i][1] for i in sent])

    def send() -> None:
        for k, i in enumerate(sent):
            receiver.put(k, values[i])  # type: ignore[arg-type]  # not a copy: a value
            values[i] = None  # sent: free it

    placement.transfer(receiver, send)
    return state_plan(named, sent, receiver)
