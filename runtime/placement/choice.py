"""Where a checkpoint operation's tensors live, and how their bytes reach the file.

Every save and load (``TLSF32B``, exact-bits JSON, ``TLADAMF``) is written once, against a
:class:`Placement`, chosen once per call by :func:`placement_for`:

* :class:`~.local_placement.LocalPlacement` — the tensors are this process's own: checks
  raise where they fail, payloads move straight between the file and tensor memory;
* :class:`~.sharded_placement.ShardedPlacement` — the tensors hold DTensors
  (FSDP2 ``fully_shard``, ``distribute_tensor``): the operation is a collective, every rank
  calls it, rank 0 alone opens the file (the one a single process would write), verdicts
  are shared so that every rank raises alike, and full tensors travel one at a time
  (:mod:`.collectives`).

The operations call a placement in this order:

1. :meth:`Placement.agree` around the local work that may fail: the caller's objects
   checked (:meth:`Placement.check` among them), and on the rank that
   :attr:`~Placement.touches_file` the file's checking pass. Every rank goes on, or every
   rank raises the same error.
2. The transfer, along the :class:`Route` that :meth:`Placement.route` decides once per
   call. :attr:`Route.PARALLEL` (sharded, every rank seeing the same file system): every
   rank writes or reads its own bytes of the file (:mod:`.positional`) and the rest of this
   step is skipped. :attr:`Route.LOCAL_BULK` (one process): payloads move by address
   between the file and the tensors where the family has such a path (``TLSF32B``), else as
   a stream. :attr:`Route.STREAM`, a save:
   :meth:`Placement.gather` runs the writer (the codec) with each full
   tensor on demand. A load: a :meth:`Placement.receiver` for the new values, then
   :meth:`Placement.transfer` runs the reader, which reads each payload into
   :meth:`Receiver.buffer` and hands the new values to :meth:`Receiver.put`; each rank keeps
   its own part (:meth:`Receiver.received`). Both end agreed, as step 1.
3. :meth:`Placement.share`: a small result (the version written, the steps and random counter
   read) on every rank.
4. For a load, a plan (:mod:`.plans`) holding the new values, off to the side; its commit is
   the only step that writes live state, the same for every placement.
"""

from __future__ import annotations

from typing import Any

from ..binding.dtensors import sharded
from .local_placement import LOCAL
from .placement_protocol import Placement

__all__ = ["placement_for"]


def placement_for(module_or_tensors: Any) -> Placement:
    """The placement of a call's tensors: sharded when any of them is a DTensor.

    Args:
        module_or_tensors: a module, a mapping or a sequence of tensors (a one-shot
            iterable must have been made a list: :func:`~.dtensors.reusable`).
    """
    if not sharded(module_or_tensors):
        return LOCAL
    # Deferred: the sharded placement imports torch.distributed.tensor (half a second),
    # which single-process users never pay for. It imports nothing of this module's.
    from .sharded_placement import ShardedPlacement

    return ShardedPlacement()
