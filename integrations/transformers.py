"""Hugging Face ``Trainer`` checkpoints as tlckpt checkpoint sets: :class:`TlckptTrainer`.

``TlckptTrainer`` is a ``transformers.Trainer`` that saves each checkpoint of a run as a
checkpoint set in ``<output_dir>/checkpoint-<step>`` (the Trainer's own folder names): the
model (``model.safetensors`` by default), the optimizer, the scheduler, every rank's random
states (torch CPU and CUDA, numpy, ``random``) and the ``TrainerState``, with their digests
and the manifest written last, nothing pickled; rotation follows ``save_total_limit`` (the
best model's checkpoint kept, with ``load_best_model_at_end``); and
``train(resume_from_checkpoint=True)`` resumes bit-exactly from the newest set that
*verifies*, passing over a damaged or incomplete newer one with a
:class:`~tlckpt.codec.sets.set_folders.SkippedCheckpointWarning` (the stock Trainer takes the
highest step number unchecked). ``resume_from_checkpoint="path"`` takes a set's folder.

Why a subclass: a callback cannot meet that contract. The Trainer resolves
``resume_from_checkpoint=True`` itself (highest ``checkpoint-N``, unverified), reads
``trainer_state.json``, a Hugging Face weights file, ``optimizer.pt``, ``scheduler.pt`` and
``rng_state.pth`` by path (``torch.load``), and its save writes those pickles
(``training_args.bin`` too); callbacks see none of it. The subclass overrides the public
``train`` (to choose the set) and five private methods, the Trainer's checkpoint seams,
each kept to its stock signature and role so that it survives releases:

* ``_save_checkpoint(model, trial)``: write the set instead of the stock files (its
  bookkeeping — FLOs, the best checkpoint, stateful callbacks' states — done as the stock
  one does it), then rotate;
* ``_load_from_checkpoint(path, model=None)``: nothing to load yet — the model is restored
  with the optimizer and scheduler, all or nothing, once they exist;
* ``_load_optimizer_and_scheduler(path)``: restore the model, optimizer, scheduler (and the
  gradient scaler) from the verified set in one call;
* ``_load_rng_state(path)``: install this rank's random states where the Trainer installs
  them (after skipping the batches already trained, so that the data order is the
  uninterrupted run's);
* ``_load_best_model()``: load the best checkpoint's model from its set (verified).

A release that renames one of these fails loudly (the stock method runs, looks for its
pickles and does not find them), never silently. DeepSpeed and FSDP keep their own
checkpoint formats: ``TlckptTrainer`` refuses them. Checkpoints are not pushed to the Hub
(``trainer.push_to_hub()`` of the final model works as usual).

This module imports without ``transformers`` and torch; :class:`TlckptTrainer` is built on
first use, raising :class:`~tlckpt.optional.MissingDependencyError` when they are missing.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import warnings
from typing import Any

from ..codec.errors import CheckpointError
from ..codec.sets.checkpoint_set import verify_checkpoint
from ..codec.sets.set_keys import as_key
from ..optional import require
from ._trainer_sets import (
    EXTRA_FORMAT,
    ResumePoint,
    checkpoint_folder,
    gather_random_states,
    newest,
    prepared_random_state,
    resume_point,
    rotate,
    write_trainer_state,
)

# TlckptTrainer is built on first use (module __getattr__): it subclasses transformers.Trainer.
__all__ = ["TlckptTrainer", "latest_verified_checkpoint"]  # noqa: F822

#: The model member's family in a Trainer's sets unless ``model_format`` says otherwise:
#: ``model.safetensors``, which Hugging Face tools read too.
DEFAULT_MODEL_FORMAT = "safetensors"


def latest_verified_checkpoint(
    output_dir: str | os.PathLike, *, key: bytes | None = None
) -> str | None:
    """The newest ``checkpoint-<step>`` folder of ``output_dir`` that is a checkpoint set
    that verifies (every member's size and digest, families and headers), or ``None``.

    What ``TlckptTrainer.train(resume_from_checkpoint=True)`` resumes from (it also needs
    the set to be one a ``TlckptTrainer`` saved); every newer folder passed over is named in
    a :class:`~tlckpt.codec.sets.set_folders.SkippedCheckpointWarning` with the reason.

    Args:
        output_dir: the Trainer's ``output_dir``.
        key: the 32-byte key the sets were signed with; ``None`` for unsigned sets.

    Returns:
        The folder's path, or ``None``.

    Raises:
        CheckpointError: ``key`` is not 32 bytes.
    """
    checked = as_key(key)  # a bad key is the caller's error, never a set to pass over

    def verifies(path: str) -> str:
        verify_checkpoint(path, key=checked)
        return path

    return newest(output_dir, verifies)


def __getattr__(name: str) -> Any:
    if name == "TlckptTrainer":
        return _trainer_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# --------------------------------------------------------------------------- saving


def _inner_optimizer(optimizer: Any) -> Any:
    """The torch optimizer under accelerate's ``AcceleratedOptimizer`` wrapper."""
    return getattr(optimizer, "optimizer", optimizer)


def _scaler(trainer: Any) -> Any:
    return getattr(trainer.accelerator, "scaler", None)


def _note_best(trainer: Any, run_dir: str) -> None:
    """``state.best_model_checkpoint``, as the stock save sets it: the best step's folder,
    if it exists or is the one being saved."""
    state = trainer.state
    if trainer.args.save_strategy in ("steps", "epoch", "best") and state.best_global_step:
        best = checkpoint_folder(run_dir, state.best_global_step)
        if state.best_global_step == state.global_step or os.path.isdir(best):
            state.best_model_checkpoint = best


def _export_callback_states(trainer: Any) -> None:
    """The stateful callbacks' (and the control's) states into ``state.stateful_callbacks``,
    as the stock save records them."""
    from transformers.trainer_callback import ExportableState

    for callback in [*trainer.callback_handler.callbacks, trainer.control]:
        if not isinstance(callback, ExportableState):
            continue
        name = callback.__class__.__name__
        saved = callback.state()
        if isinstance(trainer.state.stateful_callbacks[name], list):
            trainer.state.stateful_callbacks[name].append(saved)
        else:
            trainer.state.stateful_callbacks[name] = saved


def save_trainer_set(trainer: Any, trial: Any) -> str:
    """The checkpoint of ``trainer``'s current step, as a set (see the module docstring).

    Every rank calls it (the random states are gathered); the ranks that save
    (``args.should_save``) write the set, ``trainer_state.json`` and rotate.

    Returns:
        The checkpoint's folder.

    Raises:
        CheckpointError: a value cannot be saved exactly (named); nothing is committed.
        OSError: from the file system; the previous checkpoints are untouched.
    """
    from ..runtime.sets.checkpoint_sets import save_checkpoint

    args = trainer.args
    step = trainer.state.global_step
    run_dir = trainer._get_output_dir(trial=trial)
    folder = checkpoint_folder(run_dir, step)
    if trainer.hp_search_backend is None and trial is None:
        trainer.store_flos()
    _note_best(trainer, run_dir)
    _export_callback_states(trainer)
    random_states = gather_random_states(args.world_size)  # collective: every rank
    if not args.should_save:
        return folder
    scaler = _scaler(trainer)
    extra = {
        "format": EXTRA_FORMAT,
        "trainer_state": dataclasses.asdict(trainer.state),
        "rng": random_states,
        "scaler": None if scaler is None else scaler.state_dict(),
    }
    only_model = args.save_only_model
    save_checkpoint(
        folder,
        model=trainer.model,
        optimizer=None if only_model else _inner_optimizer(trainer.optimizer),
        scheduler=None if only_model else trainer.lr_scheduler,
        extra=extra,
        step=step,
        overwrite=True,  # a set of this step from an earlier run of the same output_dir
        key=trainer._tlckpt_key,
        model_format=trainer._tlckpt_model_format,
    )
    write_trainer_state(folder, extra["trainer_state"])
    rotate(run_dir, args.save_total_limit, folder, trainer.state.best_model_checkpoint)
    return folder


# --------------------------------------------------------------------------- resuming


@dataclasses.dataclass(frozen=True)
class _Resume:
    """The set a ``train`` call resumes from, checked, and this rank's random states ready
    to install (``None``: the set was saved with another number of ranks)."""

    point: ResumePoint
    install_rng: Any


def prepare_resume(trainer: Any, resume: Any) -> _Resume:
    """The set to resume from: ``resume`` is ``True`` (the newest set of ``output_dir`` that
    verifies and a ``TlckptTrainer`` saved, newer ones passed over with a warning) or a
    set's folder. Everything the Trainer will read of it is checked here, before anything
    live changes, and ``trainer_state.json`` is made the set's copy.

    Raises:
        ValueError: ``resume`` is ``True`` and no set of ``output_dir`` verifies.
        CheckpointError: the set named does not verify, or is not a ``TlckptTrainer``'s.
    """
    key = trainer._tlckpt_key
    args = trainer.args
    if resume is True:
        point = newest(args.output_dir, lambda path: resume_point(path, key=key))
        if point is None:
            raise ValueError(
                f"No valid checkpoint found in output directory ({args.output_dir}): no"
                " checkpoint-<step> folder there is a checkpoint set that verifies"
            )
    else:
        point = resume_point(os.fspath(resume), key=key)
    install = None
    if len(point.random_states) == args.world_size:
        index = args.process_index
        install = prepared_random_state(point.random_states[index], f"extra.rng[{index}]")
    else:
        warnings.warn(
            f"{point.path} holds the random states of {len(point.random_states)} ranks, this"
            f" run has {args.world_size}: they are not restored, and the resumed run is not"
            " bit-exact",
            RuntimeWarning,
            stacklevel=3,
        )
    # Every rank makes sure of the file it is about to read (atomic replacements of the same
    # text: ranks sharing the folder cannot see it half-written, nor wait on each other).
    if write_trainer_state(point.path, point.trainer_state):
        warnings.warn(
            f"{point.path}: trainer_state.json was missing or differed from the set's"
            " (verified) copy; it was rewritten from the set",
            RuntimeWarning,
            stacklevel=3,
        )
    return _Resume(point, install)


def _expected(trainer: Any, checkpoint: str) -> _Resume:
    resume = trainer._tlckpt_resume
    if resume is None or os.path.abspath(checkpoint) != os.path.abspath(resume.point.path):
        raise CheckpointError(
            "TlckptTrainer restores checkpoints through train(resume_from_checkpoint=...)"
            f" only, which chose {None if resume is None else resume.point.path}, not"
            f" {checkpoint}",
            path=os.fspath(checkpoint),
        )
    return resume


def restore_trainer_set(trainer: Any, checkpoint: str) -> None:
    """Restore the model, optimizer and scheduler (and the gradient scaler) from the chosen
    set, all or nothing (verified again as it is read).

    Raises:
        CheckpointError: the set changed since it was chosen, or does not fit the objects;
            nothing live has changed.
    """
    from ..runtime.sets.checkpoint_sets import load_checkpoint

    point = _expected(trainer, checkpoint).point
    with_optimizer = point.has_optimizer
    restored = load_checkpoint(
        point.path,
        model=trainer.model,
        optimizer=_inner_optimizer(trainer.optimizer) if with_optimizer else None,
        scheduler=trainer.lr_scheduler if with_optimizer else None,
        key=trainer._tlckpt_key,
    )
    if restored.step != point.step:
        raise CheckpointError(
            f"the set at {point.path} changed since it was chosen (step {restored.step}, was"
            f" {point.step})",
            path=point.path,
        )
    scaler = _scaler(trainer)
    if scaler is not None and point.scaler is not None:
        scaler.load_state_dict(point.scaler)


# --------------------------------------------------------------------------- the class


@functools.cache
def _trainer_class() -> type:
    """``TlckptTrainer``, built on first use (``transformers`` imported then)."""
    transformers = require("transformers", "tlckpt.integrations.transformers.TlckptTrainer")
    from ..runtime.sets.checkpoint_sets import load_checkpoint
    from ..runtime.sets.set_structure import MODEL_FORMATS

    class TlckptTrainer(transformers.Trainer):
        """A ``transformers.Trainer`` whose checkpoints are tlckpt checkpoint sets (see
        :mod:`tlckpt.integrations.transformers`).

        Args:
            *args, **kwargs: those of ``transformers.Trainer``.
            checkpoint_key: sign every set with this 32-byte key, and resume only from sets
                signed with it.
            model_format: the model member's family (``"safetensors"``, the default:
                ``model.safetensors``; ``"auto"``, ``"torchlean"``: as ``save_checkpoint``).

        Raises:
            ValueError: DeepSpeed or FSDP is enabled (they keep their own checkpoints), or
                ``model_format`` is unknown.
            CheckpointError: ``checkpoint_key`` is not 32 bytes.
        """

        def __init__(
            self,
            *args: Any,
            checkpoint_key: bytes | None = None,
            model_format: str = DEFAULT_MODEL_FORMAT,
            **kwargs: Any,
        ) -> None:
            if model_format not in MODEL_FORMATS:
                raise ValueError(f"model_format must be one of {MODEL_FORMATS}")
            as_key(checkpoint_key)  # refused here, not at the first save
            super().__init__(*args, **kwargs)
            if self.is_deepspeed_enabled or self.is_fsdp_enabled:
                raise ValueError(
                    "TlckptTrainer does not checkpoint DeepSpeed or FSDP runs (they keep"
                    " their own checkpoint formats); use transformers.Trainer"
                )
            self._tlckpt_key = checkpoint_key
            self._tlckpt_model_format = model_format
            self._tlckpt_resume: _Resume | None = None

        def train(
            self,
            resume_from_checkpoint: str | bool | None = None,
            trial: Any = None,
            **kwargs: Any,
        ) -> Any:
            """``Trainer.train``, resuming from a checkpoint set: ``True`` takes the newest
            set of ``output_dir`` that verifies (newer damaged ones passed over with a
            warning), a path takes that set (it must verify)."""
            resume = None
            if resume_from_checkpoint not in (None, False):
                resume = prepare_resume(self, resume_from_checkpoint)
            self._tlckpt_resume = resume
            try:
                return super().train(
                    resume_from_checkpoint=None if resume is None else resume.point.path,
                    trial=trial,
                    **kwargs,
                )
            finally:
                self._tlckpt_resume = None

        def _save_checkpoint(self, model: Any, trial: Any) -> None:
            save_trainer_set(self, trial)

        def _load_from_checkpoint(self, resume_from_checkpoint: str, model: Any = None) -> None:
            # The model is restored with the optimizer and scheduler, in one verified call.
            _expected(self, resume_from_checkpoint)

        def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
            if checkpoint is not None:
                restore_trainer_set(self, checkpoint)

        def _load_rng_state(self, checkpoint: str | None) -> None:
            if checkpoint is not None:
                install = _expected(self, checkpoint).install_rng
                if install is not None:
                    install()

        def _load_best_model(self) -> None:
            best = self.state.best_model_checkpoint
            load_checkpoint(best, model=self.model, key=self._tlckpt_key)

    TlckptTrainer.__module__ = __name__
    TlckptTrainer.__qualname__ = "TlckptTrainer"
    return TlckptTrainer
