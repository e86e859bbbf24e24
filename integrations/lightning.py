"""Lightning checkpoints as tlckpt checkpoint sets: :class:`TlckptCheckpointIO`.

``Trainer(plugins=[TlckptCheckpointIO()])`` makes every checkpoint Lightning writes
(``ModelCheckpoint``, ``trainer.save_checkpoint``) a verified set of one state tree at the
path Lightning names (a folder called ``….ckpt``): Lightning's checkpoint dict with its
tensors in the safetensors layout and everything else as exact tagged JSON, the global random
states beside it, and a manifest of digests written last, atomically (see
:mod:`tlckpt.runtime.sets.state_tree_sets`). A load verifies every digest before Lightning
sees the dict, never unpickles anything, and installs the random states the save recorded, so
that ``trainer.fit(ckpt_path=...)`` resumes bit for bit.

Lightning ships two packages, ``lightning`` and ``pytorch_lightning``, whose ``CheckpointIO``
and ``Callback`` bases are distinct classes, and each ``Trainer`` checks its plug-ins with
``isinstance``: the classes here derive from every base installed, so both trainers take
them. Without either package this module still imports; using a class raises
:class:`~tlckpt.optional.MissingDependencyError`.

Lightning saves no random state. The plug-in records the global states when it saves; a save
that runs later in a background thread (Lightning's ``AsyncCheckpointIO``) cannot know the
states of the moment the checkpoint was made, so :class:`TlckptRandomStates` (a callback)
records them in the checkpoint dict as it is made, and the plug-in moves them into the set.
"""

from __future__ import annotations

import errno
import importlib
import os
import threading
import warnings
from typing import Any

from ..codec.errors import CheckpointError
from ..optional import MissingDependencyError, missing_message

__all__ = ["TlckptCheckpointIO", "TlckptRandomStates", "RANDOM_STATES_KEY", "WRITER"]

#: The key under which :class:`TlckptRandomStates` puts the random states in a checkpoint
#: dict (taken out again by the plug-in, which records them beside the tree).
RANDOM_STATES_KEY = "tlckpt_random_states"
#: What the plug-in records as the writer of its sets (the training state's ``extra``).
WRITER = "tlckpt.integrations.lightning"


def _installed_bases(modules: tuple[str, ...], name: str) -> tuple[type, ...]:
    """``name`` of each of ``modules`` that imports (Lightning needs torch: without it, or
    without Lightning, there is none)."""
    bases = []
    for module in modules:
        try:
            bases.append(getattr(importlib.import_module(module), name))
        except ImportError:
            continue
    return tuple(bases)


_IO_BASES = _installed_bases(
    ("lightning.fabric.plugins.io.checkpoint_io", "lightning_fabric.plugins.io.checkpoint_io"),
    "CheckpointIO",
)
_CALLBACK_BASES = _installed_bases(
    ("lightning.pytorch.callbacks.callback", "pytorch_lightning.callbacks.callback"), "Callback"
)


def _require_lightning(what: str, bases: tuple[type, ...]) -> None:
    if not bases:
        raise MissingDependencyError(
            missing_message("lightning", what, "or pytorch_lightning"), name="lightning"
        )


def _device(map_location: Any) -> Any:
    """The device a load puts tensors on, from Lightning's ``map_location``."""
    import torch

    if map_location is None:
        return "cpu"
    if isinstance(map_location, (str, torch.device)):
        return torch.device(map_location)
    raise TypeError(
        "TlckptCheckpointIO.load_checkpoint takes map_location as None, a device or a device"
        f" name (a set records no devices to remap), not {type(map_location).__name__}"
    )


def _local_path(path: Any, what: str) -> str:
    text = os.fspath(path)
    if "://" in str(text):
        raise CheckpointError(
            f"{what} {text!s}: TlckptCheckpointIO writes and reads local paths only",
            field="path",
        )
    return str(text)


class TlckptRandomStates(*_CALLBACK_BASES):  # type: ignore[misc]
    """A callback that records the global random states in each checkpoint dict as it is
    made (``on_save_checkpoint``, on the training thread), under
    :data:`RANDOM_STATES_KEY`. Needed only when saves run in a background thread
    (``AsyncCheckpointIO``): the plug-in then records these instead of the states of the
    moment the background save runs.

    Raises:
        MissingDependencyError: neither ``lightning`` nor ``pytorch_lightning`` is installed.
    """

    def __init__(self) -> None:
        _require_lightning("TlckptRandomStates", _CALLBACK_BASES)
        super().__init__()

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict) -> None:
        """Put the random states of now into ``checkpoint``."""
        from ..runtime.sets.training_state import current_rng_states

        checkpoint[RANDOM_STATES_KEY] = current_rng_states()


class TlckptCheckpointIO(*_IO_BASES):  # type: ignore[misc]
    """A Lightning ``CheckpointIO`` that writes each checkpoint as a tlckpt set.

    Args:
        rng: record the global random states (torch's CPU and CUDA generators, numpy's,
            Python's ``random``) with each checkpoint, and install them when one is loaded
            (what makes a resume with dropout bit-exact).
        fallback: when the set at the path a load is given does not verify, warn and load
            the newest sibling set (same folder, see :meth:`load_checkpoint`) that does.
        durable: ``fsync`` files and folders (``False``: atomic against a crash of this
            process, not against a power cut).
        key: sign every set with this 32-byte key, and load only sets signed with it.

    Raises:
        MissingDependencyError: neither ``lightning`` nor ``pytorch_lightning`` is installed.
    """

    def __init__(
        self, *, rng: bool = True, fallback: bool = True, durable: bool = True, key: Any = None
    ) -> None:
        _require_lightning("TlckptCheckpointIO", _IO_BASES)
        super().__init__()
        from ..codec.sets.set_keys import as_key

        self.rng = rng
        self.fallback = fallback
        self.durable = durable
        self.key = as_key(key)
        self._warned_thread = False

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None
    ) -> None:
        """Write Lightning's checkpoint dict as a set of one state tree at ``path`` (a folder;
        a set there already is replaced atomically).

        Args:
            checkpoint: Lightning's checkpoint dict (not changed).
            path: where the set goes (Lightning's ``….ckpt`` name).
            storage_options: not supported (must be ``None``).

        Raises:
            TypeError: ``storage_options`` was given.
            CheckpointError: a value the set cannot hold exactly (an object in
                ``hyper_parameters``, say), naming its path in the dict — nothing written.
            OSError: from the file system; a set already at ``path`` is untouched.
        """
        from ..runtime.sets.state_tree_sets import save_state_tree_set
        from ..runtime.sets.training_state import current_rng_states

        if storage_options is not None:
            raise TypeError(
                "TlckptCheckpointIO.save_checkpoint does not take storage_options (got"
                f" {storage_options!r})"
            )
        target = _local_path(path, "save_checkpoint")
        tree = dict(checkpoint)  # a shallow copy: the random states are taken out of it
        rng = tree.pop(RANDOM_STATES_KEY, None)
        if not self.rng:
            rng = None
        elif rng is None:
            if threading.current_thread() is threading.main_thread():
                rng = current_rng_states()
            elif not self._warned_thread:
                self._warned_thread = True
                warnings.warn(
                    "TlckptCheckpointIO saves in a background thread (AsyncCheckpointIO): the"
                    " random states of the moment each checkpoint was made are not known"
                    " there, so none are recorded and a resume is not bit-exact where"
                    " randomness is used (dropout); add TlckptRandomStates() to the Trainer's"
                    " callbacks to record them",
                    RuntimeWarning,
                    stacklevel=2,
                )
        step = checkpoint.get("global_step", 0)
        try:
            save_state_tree_set(
                tree,
                target,
                step=step if type(step) is int and step >= 0 else 0,
                rng=rng,
                extra={"writer": WRITER},
                overwrite=True,
                durable=self.durable,
                key=self.key,
            )
        except CheckpointError as exc:
            if not (exc.field or "").startswith("hyper_parameters"):
                raise
            raise CheckpointError(
                f"{exc.reason}. A hyperparameter must be a plain value: convert it before"
                " save_hyperparameters() (vars(namespace), dataclasses.asdict(config),"
                " str(path)), or leave it out with save_hyperparameters(ignore=[...])",
                path=target,
                field=exc.field,
                actual=exc.actual,
            ) from None

    def load_checkpoint(
        self, path: Any, map_location: Any = None, weights_only: bool | None = None
    ) -> dict[str, Any]:
        """The checkpoint dict of the set at ``path``, verified first (every member's digest);
        the random states it records are installed (with ``rng``).

        When the set does not verify (damaged, half-deleted, never committed) and
        ``fallback`` is on, a :class:`~tlckpt.codec.sets.set_folders.SkippedCheckpointWarning`
        names why, and the newest *sibling* that verifies is loaded instead: a folder beside
        ``path`` (not hidden; a link counts as what it points to, and never as ``path``
        itself) holding a committed set of one state tree, newest meaning the highest step,
        then the latest modification. This is how ``ckpt_path="last"`` — which Lightning
        resolves to the newest ``last*.ckpt`` by modification time, unverified — resumes
        from the newest checkpoint that verifies.

        Args:
            path: the set's folder.
            map_location: where the tensors go: ``None`` (the CPU), a device or its name.
            weights_only: accepted for the interface; nothing is ever unpickled.

        Returns:
            Lightning's checkpoint dict, exactly as saved.

        Raises:
            FileNotFoundError: nothing is at ``path``.
            CheckpointError: ``path`` is a file (a ``torch.save`` checkpoint is not
                loaded), or the set does not verify and no sibling does (the error of
                ``path``'s set).
            TypeError: ``map_location`` is a mapping or a function.
            OSError: from the file system.
        """
        from ..codec.sets.set_folders import SkippedCheckpointWarning
        from ..runtime.sets.state_tree_sets import install_rng_states, load_state_tree_set

        target = _local_path(path, "load_checkpoint")
        device = _device(map_location)
        if not os.path.isdir(target):
            if not os.path.lexists(target):
                raise FileNotFoundError(errno.ENOENT, "no checkpoint set there", target)
            raise CheckpointError(
                "not a tlckpt checkpoint set (a file, not a folder): TlckptCheckpointIO loads"
                " the sets it writes, and unpickles nothing (a torch.save checkpoint needs"
                " Lightning's own TorchCheckpointIO)",
                path=target,
            )
        try:
            tree, state = load_state_tree_set(target, device=device, key=self.key)
        except CheckpointError as exc:
            if not self.fallback:
                raise
            tree, state = self._newest_sibling(target, device, exc)
        if self.rng:
            try:
                install_rng_states(state)
            except CheckpointError as exc:  # nothing was installed: the states do not fit
                warnings.warn(
                    f"the random states of {target} were not restored: {exc}",
                    SkippedCheckpointWarning,
                    stacklevel=2,
                )
        return tree

    def _newest_sibling(self, target: str, device: Any, error: CheckpointError) -> tuple[Any, Any]:
        """The tree and training state of the newest sibling of ``target`` that verifies
        (see :meth:`load_checkpoint`), with a warning for ``target`` and each sibling passed
        over; ``error`` (``target``'s) is raised when none verifies."""
        from ..codec.sets.set_folders import SkippedCheckpointWarning
        from ..runtime.sets.state_tree_sets import load_state_tree_set, state_tree_siblings

        def skipped(where: str, exc: BaseException) -> None:
            check = getattr(exc, "check", None) or type(exc).__name__
            warnings.warn(
                f"checkpoint {where} skipped: it does not verify: {exc} (check: {check})",
                SkippedCheckpointWarning,
                stacklevel=4,
            )

        skipped(target, error)
        for sibling in state_tree_siblings(target):
            try:
                tree, state = load_state_tree_set(sibling.path, device=device, key=self.key)
            except (CheckpointError, OSError) as exc:
                skipped(os.fspath(sibling.path), exc)
                continue
            warnings.warn(
                f"loaded {sibling.path} (step {sibling.step}), the newest checkpoint beside"
                f" {target} that verifies, in its place",
                SkippedCheckpointWarning,
                stacklevel=4,
            )
            return tree, state
        raise error

    def remove_checkpoint(self, path: Any) -> None:
        """Remove the set at ``path``: renamed away first (atomically), then deleted, so that
        a removal killed midway never leaves a half set under the checkpoint's name. A
        symbolic link (``save_last="link"``) or a file there is removed itself; nothing
        there is not an error.

        Raises:
            OSError: from the file system.
        """
        from ..codec.sets.set_commit import remove_set_folder

        target = _local_path(path, "remove_checkpoint")
        try:
            if os.path.isdir(target) and not os.path.islink(target):
                remove_set_folder(target, durable=self.durable)
            else:
                os.unlink(target)
        except FileNotFoundError:
            return

    def __repr__(self) -> str:
        return f"TlckptCheckpointIO(rng={self.rng}, fallback={self.fallback})"
