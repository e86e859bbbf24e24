"""Checkpoint sets, torch side: a whole training state written as one set, and restored from
one, all or nothing.

Writing (:func:`write_set`) takes a :class:`SetSource`: the live objects (a blocking save)
or a :class:`~.snapshot.Snapshot` of them (a background save) — the same code writes both.
Members go through the public save functions into the codec's digesting writers
(:class:`~tlckpt.codec.sets.checkpoint_set.SetWriter`), the training-state document is written,
then the manifest commits the set.

Restoring (:func:`restore_set`) has two phases:

1. *open*: the manifest is read, every member opened and its size checked, the small members
   hashed (the training-state document is parsed next). A failure here means the set is
   damaged or incomplete (a caller asking for the latest set falls back to the previous one);
2. *fit and commit*: the manifest's tensor names and shapes are compared with the model's
   (same shapes under other names is refused), the scheduler, param groups and random
   states are checked against the live objects, the model and optimizer loads are planned
   (staged, off to the side) by reading the large members through digesting readers — the
   bytes hashed are the bytes loaded, in one pass; a plan that fails on a damaged member
   reports the digest, and the fallback applies. Every digest is then completed and
   compared, the members are checked not to have changed since, and only then does one
   commit block (Ctrl-C held back) write the scheduler, the model, the optimizer, the param
   groups' hyperparameters and the random states.

Models holding DTensors are saved and restored as collectives, like the file functions:
every rank calls, rank 0 writes and reads the files, and the manifest is committed only
after every rank has confirmed its part.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ...codec.sets.remote_set_writer import RemoteOptions
from ...codec.sets.remote_store import is_url
from ...codec.sets.set_keys import as_key
from .multi_set_writing import set_source, write_any
from .remote_sets import restore_remote

# Writing and restoring live in their own modules; this one offers the public functions
# and names all of them.
from .set_restoring import Restored, Targets, restore_set

__all__ = ["save_checkpoint", "load_checkpoint"]


def save_checkpoint(
    path: str | os.PathLike,
    *,
    model: Any,
    optimizer: Any = None,
    scheduler: Any = None,
    random_counter: int | None = None,
    extra: Any = None,
    step: int = 0,
    overwrite: bool = False,
    key: bytes | None = None,
    model_format: str = "auto",
    storage_options: dict[str, Any] | None = None,
) -> Path | str:
    """Save a whole training state as one checkpoint set: the folder ``path``, committed
    atomically (a crash leaves the previous set at ``path`` — or none — or the new one, and
    a recognisable leftover that the next save into the same folder removes).

    Args:
        path: the set's folder; it must not exist unless ``overwrite``. A URL
            (``s3://bucket/run/step-…``, ``memory://…``, ``file:///…``) saves to object
            storage: members uploaded under the URL's prefix, the manifest written last and
            only if absent (the guide's "Object storage").
        model: the model; or a sequence or mapping of models (a GAN's ``{"G": g, "D": d}``).
        optimizer: its optimizer, if any; or a sequence or mapping of optimizers (each
            bound to the models holding its parameters: :mod:`.set_structure`).
        scheduler: its learning-rate scheduler, if any; or a sequence or mapping of them.
        random_counter: the run's random counter, if it has one.
        extra: anything else, of JSON values (exactly, or refused).
        step: the step the set records.
        overwrite: replace an existing set at ``path`` (a symbolic link there is replaced,
            its target untouched).
        key: sign the set with this 32-byte key (members digested with keyed BLAKE3 as
            they are written, the manifest authenticated); it then loads only with the key.
        model_format: each model member's family: ``"auto"`` (``TLSF32B`` for a float32
            model, the safetensors layout otherwise), ``"torchlean"`` (``TLSF32B`` or
            exact-bits JSON: files TorchLean reads), ``"safetensors"``. A set of one model
            in a TorchLean family without tied tensors, at most one Adam/AdamW optimizer
            and one scheduler, each given as one object, is a version-1 set (as earlier
            versions wrote); any other is version 2 (docs/format.md §7).
        storage_options: for a URL, the fsspec filesystem's options (endpoint,
            credentials…).

    Returns:
        The set's folder (its URL, for a URL).

    Raises:
        CheckpointError: something cannot be saved exactly (named), or ``key`` is not 32
            bytes; nothing is written.
        FileExistsError: ``path`` exists and ``overwrite`` is false.
        OSError: from the file system; nothing is committed.

    Example:
        >>> save_checkpoint("ckpt", model=model, optimizer=opt, step=100)  # doctest: +SKIP
    """
    key = as_key(key)
    source = set_source(step, model, optimizer, scheduler, random_counter, extra, model_format)
    remote = RemoteOptions(storage_options) if is_url(path) else None
    return write_any(path, step, source, overwrite=overwrite, key=key, remote=remote)


def load_checkpoint(
    path: str | os.PathLike,
    *,
    model: Any,
    optimizer: Any = None,
    scheduler: Any = None,
    rng: bool = False,
    key: bytes | None = None,
    storage_options: dict[str, Any] | None = None,
) -> Restored:
    """Verify the checkpoint set at ``path`` and restore it, all or nothing.

    Every member's size and digest is checked before anything live changes; the model and
    optimizer loads are read from the very handles that were hashed; the model, optimizer,
    scheduler, every param group's ``lr`` and other values the live group has (the
    optimizer member's hyperparameters must agree with the document; execution flags stay
    the live run's) and, with ``rng``, the global random states (each checked whole first)
    are then written in one block with Ctrl-C held back.

    Args:
        path: the set's folder; or its URL (members streamed by ranged reads and hashed as
            they arrive into a local staging folder, then restored from it).
        model, optimizer, scheduler: the live objects, built as for the saved run, given
            in the structure they were saved in (one object, a sequence, a mapping with
            the same keys); another structure is refused.
        rng: also restore torch's, CUDA's, numpy's and ``random``'s global states.
        key: the 32-byte key the set was signed with; ``None`` for an unsigned set.
        storage_options: for a URL, the fsspec filesystem's options.

    Returns:
        The set's step, random counter and ``extra``.

    Raises:
        KeyRequiredError: the set is signed and no key was given.
        IntegrityError: a member is missing or damaged (named, with the check); with
            ``key``, the set is signed with another key, was edited, or is not signed.
        CheckpointError: the set is malformed or does not fit the objects (tensor names or
            shapes, optimizer, param groups, scheduler, random states); nothing has changed.
        OSError: from the file system; nothing has changed.
    """
    targets = Targets(model, optimizer, scheduler, rng)
    if is_url(path):
        return restore_remote(str(path), targets, key=key, storage_options=storage_options)
    return restore_set(path, targets, key=key)
