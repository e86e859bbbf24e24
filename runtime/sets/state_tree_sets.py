"""Sets of one state tree (version 3): a framework's whole checkpoint — Lightning's
checkpoint dict — as a verified checkpoint set at any folder name.

The tree goes into ``state.safetensors`` (:mod:`..ops.state_trees`: tensors in the
safetensors layout, structure and values as exact tagged JSON, never pickled), the step, the
global random states and the writer's ``extra`` into ``training_state.json``, the manifest
last (:class:`~tlckpt.codec.sets.set_commit.SetWriter`: a killed save leaves the previous
set at the path as it was). A load verifies every digest before the tree is returned.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ...codec.errors import CheckpointError
from ...codec.safetensors import write_safetensors
from ...codec.sets.checkpoint_set import VerifiedSet
from ...codec.sets.set_commit import SetWriter
from ...codec.sets.set_document_writing import build_training_state
from ...codec.sets.set_documents import TrainingState
from ...codec.sets.set_folders import read_manifest
from ...codec.sets.set_manifest_v3 import is_state_tree_set
from ...formats.checkpoint_set import (
    SAFETENSORS_MEMBER_VERSION,
    STATE_TREE_FILE,
    STATE_TREE_MEMBER,
    TRAINING_STATE_FAMILY,
    TRAINING_STATE_FILE,
    TRAINING_STATE_VERSION,
)
from ..ops.state_trees import encode_state, load_state
from .training_state import prepare

__all__ = [
    "save_state_tree_set",
    "load_state_tree_set",
    "install_rng_states",
    "StateTreeSibling",
    "state_tree_siblings",
]


def save_state_tree_set(
    tree: Any,
    path: str | os.PathLike,
    *,
    step: int,
    rng: dict[str, Any] | None,
    extra: Any = None,
    overwrite: bool = True,
    durable: bool = True,
    key: Any = None,
) -> Path:
    """Write ``tree`` as a set of one state tree at ``path``.

    Args:
        tree: nested containers of tensors and plain values (what
            :func:`~tlckpt.runtime.ops.state_trees.save_state` takes).
        path: the set's folder (any name; a Lightning path ends in ``.ckpt``).
        step: the training step the manifest records (a u64).
        rng: the global random states to record
            (:func:`~.training_state.current_rng_states`), or ``None`` for none.
        extra: a value for the training state's ``extra`` (the writer's own notes).
        overwrite: replace a set at ``path`` (exchanged atomically: killed at any moment,
            ``path`` holds the old set or the new one).
        durable: ``fsync`` files and folders.
        key: sign the set with this 32-byte key.

    Returns:
        The set's folder.

    Raises:
        CheckpointError: a value the set cannot hold exactly (named by its path in the
            tree), a bad step or key — before anything is written.
        FileExistsError: ``path`` exists and ``overwrite`` is false.
        OSError: from the file system; the previous set at ``path`` is untouched.
    """
    items, metadata = encode_state(tree)
    document = build_training_state(step, None, None, None, rng, extra)
    with SetWriter(path, step, overwrite=overwrite, durable=durable, key=key) as writer:
        with writer.member(
            STATE_TREE_MEMBER, STATE_TREE_FILE, SAFETENSORS_MEMBER_VERSION, "safetensors"
        ) as f:
            write_safetensors(f, items, metadata=metadata)
        with writer.member(
            "training_state", TRAINING_STATE_FILE, TRAINING_STATE_VERSION, TRAINING_STATE_FAMILY
        ) as f:
            f.write(document)
        return writer.commit_state_tree([(name, item.shape) for name, item in items.items()])


def load_state_tree_set(
    path: str | os.PathLike, *, device: str | torch.device = "cpu", key: Any = None
) -> tuple[Any, TrainingState]:
    """Read a set of one state tree, every member verified before the tree is returned.

    Args:
        path: the set's folder.
        device: where the tensors go.
        key: the 32-byte key a signed set was saved with (``None``: it must be unsigned).

    Returns:
        The tree (containers, values and tensors exactly as saved) and the training state
        (step, random states, ``extra``).

    Raises:
        CheckpointError: the set does not verify (``IntegrityError``: the member and the
            check named), is not a set of a state tree, or a member is malformed.
        OSError: from the file system.
    """
    with VerifiedSet.open(path, streaming=True, key=key) as verified:
        if not is_state_tree_set(verified.manifest):
            raise CheckpointError(
                f"the set at {os.fspath(path)} is a set of a model (manifest version"
                f" {verified.manifest.version}), not of a state tree: restore it with"
                " tlckpt.restore_checkpoint",
                path=path,
                field="version",
                actual=verified.manifest.version,
            )
        state = verified.training_state()
        try:
            tree = load_state(verified.file(STATE_TREE_MEMBER), device=device)
        except CheckpointError as exc:
            raise exc.with_path(Path(path) / STATE_TREE_FILE) from None
        verified.finish_digests()
        verified.confirm_unchanged()
    return tree, state


def install_rng_states(state: TrainingState) -> bool:
    """Install the global random states ``state`` records, each checked whole first (a
    malformed one changes nothing).

    Returns:
        Whether the set recorded any (nothing is installed when it did not).

    Raises:
        CheckpointError: a recorded state is malformed or does not fit this process (the
            field named); nothing was installed.
    """
    if state.rng is None:
        return False
    prepare(state, None, None, rng=True).apply()
    return True


@dataclass(frozen=True)
class StateTreeSibling:
    """A committed set of one state tree beside another.

    Attributes:
        path: its folder (as listed: a symbolic link keeps its own name).
        step: the step its manifest records.
        mtime_ns: its folder's modification time.
    """

    path: Path
    step: int
    mtime_ns: int


def state_tree_siblings(path: str | os.PathLike) -> list[StateTreeSibling]:
    """The committed sets of one state tree in the folder holding ``path``, other than
    ``path`` itself, newest first.

    A sibling is an entry of that folder, not hidden (temporaries and leftovers are), that is
    a folder (a link to one counts once, by what it points to) whose manifest parses as that
    of a set of one state tree (version 3; a signed one is not authenticated here). Newest:
    the highest step, then the latest modification. Nothing is verified here.

    Returns:
        The siblings, newest first.
    """
    target = os.path.realpath(os.fspath(path))
    directory = os.path.dirname(os.path.abspath(os.fspath(path)))
    found: dict[str, StateTreeSibling] = {}
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        return []
    for entry in entries:
        if entry.name.startswith("."):
            continue
        real = os.path.realpath(entry.path)
        if real == target or real in found:
            continue
        try:
            if not entry.is_dir():
                continue
            manifest = read_manifest(entry.path, authenticate=False)
            mtime = os.stat(real).st_mtime_ns
        except (CheckpointError, OSError):
            continue
        if is_state_tree_set(manifest):
            found[real] = StateTreeSibling(Path(entry.path), manifest.step, mtime)
    return sorted(found.values(), key=lambda s: (s.step, s.mtime_ns, s.path.name), reverse=True)
