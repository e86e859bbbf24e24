"""Binding TorchLean checkpoints to torch modules and Adam/AdamW optimizers (CPU and CUDA).

* :func:`schema_of` — the parameter slots of a module and their tied-weight map.
* :func:`save_module_state` / :func:`load_module_state` — float32 state as ``TLSF32B``.
* :func:`save_state_bits` / :func:`load_state_bits` — any float dtype as exact-bits JSON.
* :func:`save_optimizer` / :func:`load_optimizer` — Adam/AdamW state as ``TLADAMF``.
* :class:`CheckpointManager`, :func:`save_checkpoint` / :func:`load_checkpoint` — a whole
  training state (model, optimizer, scheduler, hyperparameters, random states) as one
  verified checkpoint set (:mod:`.checkpoint_sets`, :mod:`.checkpoint_manager`).

Loads are all or nothing: the file is read and checked completely, and found unchanged,
before anything live changes, and Ctrl-C is held back while live state is written. The one
exception is opt-in: ``load_module_state(..., staged=False)`` copies straight into the live
tensors and reports a file changed under it as a ``PartialLoadError``.

Models and optimizers sharded with ``torch.distributed`` (FSDP2 ``fully_shard``, DTensors
from ``distribute_tensor``) go through the same functions, called on every rank: rank 0
reads or writes the one file, the same file one process would (:mod:`.sharded_placement`),
so a checkpoint loads into any number of ranks.

How the package is laid out: the public functions (:mod:`.module_state`, :mod:`.optimizer`)
choose a placement (:mod:`.placement`: :mod:`.local_placement` or
:mod:`.sharded_placement`, whose collectives are in :mod:`.collectives`) and run the
operation, written once over it: :mod:`.float32_files` (``TLSF32B``), :mod:`.bits_files`
(exact-bits JSON), :mod:`.adam_files` (``TLADAMF``). A load returns a plan; its commit
(:mod:`.plans`) is the only place where live tensors or optimizer state are written.
"""

from ..optional import require

# Before anything below imports torch: without it, one message that says what to install.
require("torch", "tlckpt.runtime (torch models and optimizers)")

from .checkpoint_manager import CheckpointManager, SaveHandle  # noqa: E402
from .checkpoint_sets import Restored, load_checkpoint, save_checkpoint  # noqa: E402
from .module_state import (  # noqa: E402
    load_module_state,
    load_state_bits,
    save_module_state,
    save_state_bits,
)
from .optimizer import MissingRandomCounterWarning, load_optimizer, save_optimizer  # noqa: E402
from .slots import schema_of  # noqa: E402

__all__ = [
    "schema_of",
    "save_module_state",
    "load_module_state",
    "save_state_bits",
    "load_state_bits",
    "save_optimizer",
    "load_optimizer",
    "MissingRandomCounterWarning",
    "CheckpointManager",
    "SaveHandle",
    "Restored",
    "save_checkpoint",
    "load_checkpoint",
]
