"""Adam/AdamW optimizer state ↔ ``TLADAMF`` checkpoints (FORMAT.md §3), all or nothing.

The public functions: each chooses the placement of the parameters (one process, or
DTensors across ranks: :func:`~.placement.placement_for`) and runs the operation written
once over it (:mod:`.adam_files`). Saving streams one representative slot at a time (device
moments through reusable pinned host buffers). Loading is plan-then-commit: the file is read
and checked into fresh tensors on each parameter's device, the complete replacement state is
built (``step`` in the form the optimizer's settings expect), and only then is the
optimizer's state swapped in one step (:mod:`.plans`). Any error before the swap leaves the
optimizer bit for bit as it was; the replacement tensors are simply dropped.
"""

from __future__ import annotations

import warnings

import torch

from ..codec.errors import names_the_file
from ..codec.gcpause import without_gc
from ..codec.source import PathOrFile
from . import adam_files
from .dtensors import reusable
from .placement import placement_for
from .slots import ModuleOrParams

__all__ = ["MissingRandomCounterWarning", "save_optimizer", "load_optimizer"]


class MissingRandomCounterWarning(UserWarning):
    """A random counter was asked for but the file has none: stochastic training (dropout,
    sampling) cannot resume exactly where it stopped."""


@names_the_file()
@without_gc
def save_optimizer(
    optimizer: torch.optim.Optimizer,
    module_or_params: ModuleOrParams,
    path: PathOrFile,
    *,
    random_counter: int | None = None,
) -> int:
    """Write an Adam/AdamW optimizer's state as a TorchLean checkpoint (atomically).

    The version follows FORMAT.md: float64 moments → 5; else a random counter → 4; else tied
    parameters → 3; else 2. The learning rate is not part of the file.

    Parameters that are DTensors (FSDP2 ``fully_shard``, ``distribute_tensor``) make this a
    collective: every rank calls it and rank 0 alone opens the file (see
    :mod:`tlckpt.runtime.sharded_placement`); errors are then raised on every rank alike.

    Args:
        optimizer: ``torch.optim.Adam`` or ``torch.optim.AdamW`` that has taken a step.
        module_or_params: the module (``named_parameters(remove_duplicate=False)`` order)
            or the parameter sequence the checkpoint describes.
        path: destination path, or a binary file object written at its position.
        random_counter: the training run's random counter to store, if it has one.

    Returns:
        The format version written.

    Raises:
        CheckpointError: a refusal (amsgrad, differing groups, Adam with weight decay,
            another dtype, no step taken yet, a trainable parameter without state — named)
            or an invalid counter; checked before the first byte is written.
        OSError: from the file system.

    Example:
        >>> save_optimizer(opt, model, "opt.tladam")               # doctest: +SKIP
        3
    """
    module_or_params = reusable(module_or_params)
    placement = placement_for(module_or_params)
    return adam_files.save(placement, optimizer, module_or_params, path, random_counter)


@names_the_file()
@without_gc
def load_optimizer(
    optimizer: torch.optim.Optimizer,
    module_or_params: ModuleOrParams,
    path: PathOrFile,
    *,
    restore_random_counter: bool = False,
) -> int | None:
    """Load a TorchLean Adam/AdamW checkpoint into a live optimizer, all or nothing.

    The file's config must equal the optimizer's own (kind, betas, eps, weight decay bit for
    bit, moment dtype = the parameters' dtype); its schema must equal the parameters'. The
    whole file is read and checked into new tensors on each parameter's device, then the
    optimizer's state is replaced for all parameters at once (``step`` in the dtype and on
    the device that the optimizer's own ``step`` expects for its foreach / fused /
    capturable settings). The learning rate is left as the optimizer has it.

    Parameters that are DTensors (FSDP2 ``fully_shard``, ``distribute_tensor``) make this a
    collective: every rank calls it and rank 0 alone opens the file (see
    :mod:`tlckpt.runtime.sharded_placement`); errors are then raised on every rank alike.

    Args:
        optimizer: ``torch.optim.Adam`` or ``torch.optim.AdamW``.
        module_or_params: the parameters, as for :func:`save_optimizer`.
        path: file path, or a seekable binary file object read from its position.
        restore_random_counter: whether the caller restores the run's random counter.

    Returns:
        The file's random counter when ``restore_random_counter`` is true (``None``, with a
        :class:`MissingRandomCounterWarning`, if the file has none); else ``None``.

    Raises:
        CheckpointError: any refusal of the optimizer (see :func:`save_optimizer`), any
            rejection of the file (a subclass naming field, slot, offset and values), a file
            changed by another process while it was read (``FileChangedError``), or a file
            holding a random counter when ``restore_random_counter`` is false. The optimizer
            is then unchanged; a ``KeyboardInterrupt`` during the swap is raised after it.
        OSError: from the file system.

    Example:
        >>> load_optimizer(opt, model, "opt.tladam")                # doctest: +SKIP
    """
    module_or_params = reusable(module_or_params)
    placement = placement_for(module_or_params)
    plan = adam_files.plan_load(
        placement, optimizer, module_or_params, path, restore_random_counter
    )
    if restore_random_counter and plan.random_counter is None:
        warnings.warn(
            "the checkpoint has no random counter: stochastic training cannot be resumed exactly",
            MissingRandomCounterWarning,
            stacklevel=2,
        )
    plan.commit()
    return plan.random_counter if restore_random_counter else None
