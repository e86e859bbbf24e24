"""The path a sharded save or load took, as the caller can read it.

Two paths move a sharded model's bytes (:mod:`.io_choice` chooses, per call):

* ``"parallel"`` — every rank writes and reads its own bytes of the one file
  (:mod:`.positional`), when every rank sees the same file system;
* ``"rank0"`` — rank 0 alone opens the file, full tensors stream through it one at a time
  (:mod:`.sharded_placement`): ranks without a shared file system, file objects, placements
  the parallel path does not write, or when forced.

The environment variable ``TLCKPT_SHARDED_IO`` forces a path: ``parallel`` (no probe: for
shared file systems the probe misjudges), ``rank0``, or ``auto`` (the default). If any rank
asks for ``rank0``, that path runs. The path that ran is logged on rank 0 (logger
``tlckpt.sharded``, level INFO) and kept on every rank: :func:`last_sharded_io`.

Nothing here imports ``torch.distributed``: single-process users never pay for it.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

__all__ = ["ENV", "LOGGER", "ShardedIO", "last_sharded_io", "record"]

#: The environment variable that forces a path: ``auto`` (default), ``parallel``, ``rank0``.
ENV = "TLCKPT_SHARDED_IO"
#: Where the path each sharded save or load took is logged (rank 0, INFO).
LOGGER = logging.getLogger("tlckpt.sharded")


@dataclass(frozen=True)
class ShardedIO:
    """The path one sharded save or load took.

    Attributes:
        operation: ``"save"`` or ``"load"``.
        path: the file (as this rank named it), or ``None`` for a file object.
        route: ``"parallel"`` (every rank its own bytes) or ``"rank0"`` (through rank 0).
        reason: why, in words.
    """

    operation: str
    path: str | None
    route: str
    reason: str


_last = threading.local()


def last_sharded_io() -> ShardedIO | None:
    """The path the last sharded save or load of this thread took (``None`` before one).

    The save and load functions return what they always returned; this is where a caller
    (or a test) learns whether the ranks wrote and read their own bytes or went through
    rank 0. Single-process calls do not change it.
    """
    return getattr(_last, "record", None)


def record(taken: ShardedIO, *, log: bool) -> None:
    """Keep ``taken`` as this thread's last record; log it if ``log`` (rank 0)."""
    _last.record = taken
    if log:
        LOGGER.info(
            "sharded %s of %s: %s (%s)", taken.operation, taken.path, taken.route, taken.reason
        )
