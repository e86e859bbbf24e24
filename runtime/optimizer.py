"""Adam/AdamW optimizer state ↔ files, all or nothing: TorchLean's ``TLADAMF`` (FORMAT.md
§3) whenever the state fits one of its versions, tlckpt's own ``TLCKOPT`` family otherwise.

The public functions: each chooses the placement of the parameters (one process, or
DTensors across ranks: :func:`~.placement.placement_for`) and runs the operation written
once over it, for both families (:mod:`.optimizer_files`). Saving streams one
representative slot at a time (device moments through reusable pinned host buffers). Loading
is plan-then-commit: the file is read and checked into fresh tensors on each parameter's
device, the complete replacement state is built (``step`` in the form the optimizer's
settings expect), and only then is the optimizer's state swapped in one step
(:mod:`.plans`). Any error before the swap leaves the optimizer bit for bit as it was; the
replacement tensors are simply dropped.
"""

from __future__ import annotations

import warnings

import torch

from ..codec.errors import names_the_file
from ..codec.fileio.gcpause import without_gc
from ..codec.fileio.source import PathOrFile
from .binding.dtensors import reusable
from .binding.slots import ModuleOrParams
from .ops import optimizer_files
from .placement.choice import placement_for

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
    require_torchlean: bool = False,
) -> int:
    """Write an optimizer's state (atomically): Adam/AdamW as below; any other
    ``torch.optim`` optimizer (and any ``Optimizer`` subclass whose state and group options
    are tensors and JSON values) as an optimizer tree, keyed by parameter names, in the
    safetensors layout (:mod:`.ops.optimizer_trees`; ``require_torchlean`` refuses it).

    When the state fits one of TorchLean's ``TLADAMF`` versions — one config (kind, betas,
    eps, weight decay) for every param group that manages a trainable parameter, no amsgrad,
    no maximize, float32 or float64 moments of one dtype, state for every trainable
    parameter, none for a frozen one — the file is that version, byte-identical to what
    TorchLean writes: float64 moments → 5; else a random counter → 4; else tied parameters →
    3; else 2. Otherwise it is tlckpt's own ``TLCKOPT`` family, which TorchLean cannot read:
    per-group hyperparameters, amsgrad's ``max_exp_avg_sq``, bfloat16/float16 moments,
    parameters without state yet (version 1); and a frozen parameter's state, kept from
    before it was frozen as torch keeps it (version 2: TorchLean's schema forbids a frozen
    slot owning state). ``inspect(path)["family"]`` says which (``"adam"`` or
    ``"tlckpt_optimizer"``).

    The learning rate is not part of a ``TLADAMF`` file; a ``TLCKOPT`` file records each
    group's, which a load leaves to the live optimizer all the same.

    Parameters that are DTensors (FSDP2 ``fully_shard``, ``distribute_tensor``) make this a
    collective: every rank calls it and rank 0 alone opens the file (see
    :mod:`tlckpt.runtime.placement.sharded_placement`); errors are then raised on every rank alike.

    Args:
        optimizer: any ``torch.optim`` optimizer.
        module_or_params: the module (``named_parameters(remove_duplicate=False)`` order)
            or the parameter sequence the checkpoint describes (or, for an optimizer tree, a
            mapping of names to parameters).
        path: destination path, or a binary file object written at its position.
        random_counter: the training run's random counter to store, if it has one.
        require_torchlean: refuse to write anything TorchLean cannot read.

    Returns:
        The version written: 2 to 5 (``TLADAMF``), 1 to 2 (``TLCKOPT``), or 1 (an
        optimizer tree).

    Raises:
        CheckpointError: a refusal (not Adam, a parameter the optimizer and the module
            disagree on, moments of a dtype no file holds, incomplete state — named), an
            invalid counter, or with ``require_torchlean`` a :class:`ConfigError` listing
            every reason the state does not fit TorchLean's versions; checked before the
            first byte is written.
        OSError: from the file system.

    Example:
        >>> save_optimizer(opt, model, "opt.tladam")               # doctest: +SKIP
        3
    """
    module_or_params = reusable(module_or_params)
    placement = placement_for(module_or_params)
    return optimizer_files.save(
        placement, optimizer, module_or_params, path, random_counter, require_torchlean
    )


@names_the_file()
@without_gc
def load_optimizer(
    optimizer: torch.optim.Optimizer,
    module_or_params: ModuleOrParams,
    path: PathOrFile,
    *,
    restore_random_counter: bool = False,
) -> int | None:
    """Load an optimizer file into a live optimizer, all or nothing: ``TLADAMF`` or
    ``TLCKOPT`` for Adam/AdamW as below; for any other optimizer an optimizer tree of the
    same class and groups (names, order, dtypes, shapes), whose state and group options
    (the execution flags excepted) are swapped in together (:mod:`.ops.optimizer_trees`).

    Its schema must equal the parameters'. A ``TLADAMF`` file's config must equal the
    optimizer's own (kind, betas, eps, weight decay bit for bit, in every group; moment dtype
    = the parameters' dtype). A ``TLCKOPT`` file's param groups must be the optimizer's: as
    many, each slot in the same group, every hyperparameter but the learning rate equal bit
    for bit, each entry's moment dtype its parameter's; a frozen parameter's state (version 2)
    goes to the group that manages it, which must be the file's. The file's ``requires_grad``
    flags must be the parameters' (freeze the same parameters before loading). The whole file
    is read and checked into new tensors on each parameter's device, then the optimizer's
    state is replaced for all parameters at once (``step`` in the dtype and on the device
    that the optimizer's own ``step`` expects for its foreach / fused / capturable settings;
    a parameter without an entry gets no state). The learning rate is left as the optimizer
    has it.

    Parameters that are DTensors (FSDP2 ``fully_shard``, ``distribute_tensor``) make this a
    collective: every rank calls it and rank 0 alone opens the file (see
    :mod:`tlckpt.runtime.placement.sharded_placement`); errors are then raised on every rank alike.

    Args:
        optimizer: any ``torch.optim`` optimizer.
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
    plan = optimizer_files.plan_load(
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
