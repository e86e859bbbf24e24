"""The collectives of a sharded checkpoint: shared verdicts and one-tensor-at-a-time streams.

Every function and method here that communicates is a collective over the default process
group (or the one this thread bound, :func:`bound_group`: a background save's own): all
ranks call it, in the same order, with the same sizes. Rank :data:`WRITER` (0)
is the only one that touches the file.

* :mod:`.group` — who this rank is, where tensors travel, which rows a rank holds (no
  communication);
* :mod:`.verdicts` — go / no-go for every rank (:func:`share_verdict`) and small values
  broadcast from the writer (:func:`broadcast_bytes`, :func:`broadcast_json`);
* :mod:`.stream` — what both streams share: taking part in every transfer that is left, and
  :func:`writer_runs`, which runs the writer's work against a stream and agrees on its end;
* :mod:`.gather` — :class:`GatherStream`, full tensors to the writer (saves);
* :mod:`.scatter` — :class:`ScatterStream`, full tensors from the writer, each rank keeping
  its part (loads).

Call order of a sharded load, on every rank (a save is the same with the stream reversed):

1. local work that may fail (checks, and on the writer the checking pass over the file);
2. :func:`share_verdict` with that failure (or ``None``) and a layout fingerprint: if any
   rank failed, or the ranks' layouts differ, every rank raises the same error here;
3. a :class:`ScatterStream` (or :class:`GatherStream`) of full tensors driven by
   :func:`writer_runs`; a rank that fails midway keeps taking part, so nobody waits forever;
4. :func:`share_verdict` again (the end of :func:`writer_runs`); only then does any rank
   change live state.

Control messages are small tensors on the backend's device (CPU for gloo, the current CUDA
device for NCCL), so the same code runs on either; nothing is pickled.
"""

from .gather import GatherStream
from .group import (
    WRITER,
    bound_group,
    check_mesh,
    current_group,
    is_writer,
    new_saving_group,
    rank,
    row_shards,
    wire_device,
    world_size,
)
from .scatter import ScatterStream
from .stream import writer_runs
from .verdicts import all_agree, all_rows, broadcast_bytes, broadcast_json, share_verdict

__all__ = [
    "WRITER",
    "bound_group",
    "current_group",
    "new_saving_group",
    "writer_runs",
    "rank",
    "world_size",
    "is_writer",
    "wire_device",
    "check_mesh",
    "share_verdict",
    "all_rows",
    "all_agree",
    "broadcast_bytes",
    "broadcast_json",
    "row_shards",
    "GatherStream",
    "ScatterStream",
]
