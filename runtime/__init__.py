"""Binding TorchLean checkpoints to torch modules and Adam/AdamW optimizers (CPU and CUDA).

* :func:`schema_of` — the parameter slots of a module and their tied-weight map.
* :func:`save_module_state` / :func:`load_module_state` — float32 state as ``TLSF32B``.
* :func:`save_state_bits` / :func:`load_state_bits` — any float dtype as exact-bits JSON.
* :func:`save_optimizer` / :func:`load_optimizer` — Adam/AdamW state as ``TLADAMF`` when it
  fits TorchLean's versions, else as tlckpt's own ``TLCKOPT`` family.
* :class:`CheckpointManager`, :func:`save_checkpoint` / :func:`load_checkpoint` — a whole
  training state (model, optimizer, scheduler, hyperparameters, random states) as one
  verified checkpoint set (:mod:`.sets`).
* :func:`export_hf` / :func:`load_hf` — Hugging Face model folders (one safetensors file, or
  shards and their index), as ``huggingface_hub`` writes them.

Loads are all or nothing: the file is read and checked completely, and found unchanged,
before anything live changes, and Ctrl-C is held back while live state is written. The one
exception is opt-in: ``load_module_state(..., staged=False)`` copies straight into the live
tensors and reports a file changed under it as a ``PartialLoadError``.

Models and optimizers sharded with ``torch.distributed`` (FSDP2 ``fully_shard``, DTensors
from ``distribute_tensor``) go through the same functions, called on every rank. The file is
the one a single process would write, so a checkpoint loads into any number of ranks. When
every rank sees the same file system, each rank writes and reads its own bytes of it
(:mod:`.placement.positional`); otherwise rank 0 reads or writes it and full tensors stream
through it (:mod:`.placement.sharded_placement`). :func:`last_sharded_io` says which path a
call took.

How the package is laid out (``docs/architecture.md``): the public functions
(:mod:`.module_state`, :mod:`.optimizer`) choose a placement (:mod:`.placement`) and run the
operation, written once over it (:mod:`.ops`: ``TLSF32B``, exact-bits JSON, ``TLADAMF`` and
``TLCKOPT``), on torch objects bound to the codec's values (:mod:`.binding`). A load returns a
plan; its commit (:mod:`.commit`) is the only place where live tensors or optimizer state are
written. Checkpoint sets of a whole training state are in :mod:`.sets`.
"""

from ..optional import require
from ..runtime_names import RUNTIME_NAMES

# Before anything below imports torch: without it, one message that says what to install.
require("torch", "tlckpt.runtime (torch models and optimizers)")

from .binding.slots import schema_of as schema_of  # noqa: E402
from .hugging_face import export_hf as export_hf  # noqa: E402
from .hugging_face import load_hf as load_hf  # noqa: E402
from .module_state import load_module_state as load_module_state  # noqa: E402
from .module_state import load_state_bits as load_state_bits  # noqa: E402
from .module_state import save_module_state as save_module_state  # noqa: E402
from .module_state import save_state_bits as save_state_bits  # noqa: E402
from .ops.lazy_files import CheckpointFile as CheckpointFile  # noqa: E402
from .ops.lazy_files import open_checkpoint as open_checkpoint  # noqa: E402
from .ops.state_trees import load_state as load_state  # noqa: E402
from .ops.state_trees import save_state as save_state  # noqa: E402
from .ops.tensor_files import load_tensors as load_tensors  # noqa: E402
from .ops.tensor_files import save_tensors as save_tensors  # noqa: E402
from .optimizer import MissingRandomCounterWarning as MissingRandomCounterWarning  # noqa: E402
from .optimizer import load_optimizer as load_optimizer  # noqa: E402
from .optimizer import save_optimizer as save_optimizer  # noqa: E402
from .placement.sharded_io import ShardedIO as ShardedIO  # noqa: E402
from .placement.sharded_io import last_sharded_io as last_sharded_io  # noqa: E402
from .sets.checkpoint_manager import CheckpointManager as CheckpointManager  # noqa: E402
from .sets.checkpoint_sets import load_checkpoint as load_checkpoint  # noqa: E402
from .sets.checkpoint_sets import save_checkpoint as save_checkpoint  # noqa: E402
from .sets.set_restoring import Restored as Restored  # noqa: E402
from .sets.writer_threads import SaveHandle as SaveHandle  # noqa: E402

#: The one list of these names (torch-free, so the root package can name them lazily).
__all__ = list(RUNTIME_NAMES)
