"""``CheckpointManager``: a folder of checkpoint sets, saved (blocking or in the background),
listed, verified, retained and restored.

A background save (``blocking=False``) copies the state off the live tensors into the
manager's reusable host arena at the call (:mod:`.snapshot`), then returns; one writer
thread writes the members, ``fsync``\\ s and commits, then applies the retention policy. One
save is in flight at a time: a new ``save`` first waits for the previous one. The writer's
work is system calls and hashing, which release the GIL (``bench/sets.py`` measures what the
training thread keeps): what it takes from training is CPU time, not the GIL. On Linux the
writer thread therefore lowers its own scheduling priority
(:data:`~.writer_threads.WRITER_NICENESS`): where cores are free it runs as fast, where they
are not the training loop keeps them and the save takes longer.

A sharded (DTensor) model's background save is a collective, on a process group of the
manager's own: :mod:`.sharded_background`.

A background failure is raised by its handle's :meth:`SaveHandle.wait`, and — once, if the
handle has not raised it already — by the next :meth:`CheckpointManager.save` or by
:meth:`CheckpointManager.wait`. A set whose save failed was never committed, so it never
becomes :meth:`~CheckpointManager.latest`.

A script that ends (normally, by ``sys.exit``, an uncaught exception or Ctrl-C) with a
background save in flight waits for it: the writer is a non-daemon thread of its own, which
the interpreter joins before it exits, and nothing on its path depends on a
``concurrent.futures`` executor (those refuse work once shutdown has begun). A failure
nobody was told of by then is printed on stderr at exit, one line naming the step, the
folder and the error (:func:`_report_at_exit`). Only a process killed outright
(``SIGKILL``, ``os._exit``) leaves its save unfinished — never committed half-way.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
import warnings
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from ...codec.errors import CheckpointError
from ...codec.sets.checkpoint_set import latest_verified
from ...codec.sets.remote_leases import LEASE_SECONDS
from ...codec.sets.remote_overwrite import settle
from ...codec.sets.remote_set_reading import remote_committed_steps, remote_latest
from ...codec.sets.remote_set_writer import RemoteOptions
from ...codec.sets.remote_store import is_url, open_store
from ...codec.sets.set_commit import clean_leftovers, remove_set
from ...codec.sets.set_folders import check_step, committed_steps, retention_victims, set_path
from ...codec.sets.set_keys import as_key
from .multi_set_writing import StructuredSource, set_source, snapshot_structured, write_any
from .remote_sets import remote_set_url, restore_remote, restore_remote_latest, retain_remote
from .set_restoring import Restored, Targets, restore_latest, restore_set
from .set_structure import MODEL_FORMATS
from .set_writing import SetSource, snapshot_source
from .sharded_background import (
    SavingGroup,
    new_saving_group,
    retain_on_writer,
    sharded_background,
)
from .snapshot import Snapshotter
from .writer_threads import SaveHandle, finished, start_writer

__all__ = ["CheckpointManager"]


def _positive(name: str, value: Any) -> int | None:
    if value is not None and (type(value) is not int or value < 1):
        raise ValueError(f"{name} must be a positive integer or None, got {value!r}")
    return value


class CheckpointManager:
    """Checkpoint sets of one training run, one folder per step under ``directory``.

    Args:
        directory: where the sets live (created if missing). Leftovers of killed saves are
            removed here and after every commit (never a folder a live save holds).
        keep_last: after each commit, keep only this many newest sets (``None``: keep all).
        keep_every: also keep every set whose step is a multiple of this.
        model_format: each model member's family (see :func:`save_checkpoint`):
            ``"auto"`` (``TLSF32B`` for float32 models, the safetensors layout otherwise),
            ``"torchlean"`` (``TLSF32B`` or exact-bits JSON), ``"safetensors"``.
        key: sign every set with this 32-byte key (blocking and background saves), and
            accept only sets signed with it: :meth:`latest` and :meth:`restore` pass over
            (with a :class:`~tlckpt.codec.sets.checkpoint_set.SkippedCheckpointWarning`) every
            set that does not authenticate. Only keys derived from it are kept, and
            never shown.
        storage_options: for a ``directory`` URL (``s3://bucket/run``, ``memory://run``…):
            the fsspec filesystem's options (endpoint, credentials: the guide's "Object
            storage"). A plain path is a local folder, as before.
        lease_seconds: for a URL, how long a save's lease lives unless renewed: a killed
            save's objects are removed by the first save that commits this long after.

    Raises:
        CheckpointError: ``key`` is not 32 bytes.
        ValueError: ``keep_last`` or ``keep_every`` is not a positive integer, or
            ``model_format`` is unknown.

    Example:
        >>> manager = CheckpointManager("run/checkpoints", keep_last=3)    # doctest: +SKIP
        >>> manager.save(step, model=model, optimizer=opt, blocking=False)  # doctest: +SKIP
        >>> restored = manager.restore(model=model, optimizer=opt)          # doctest: +SKIP
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        *,
        keep_last: int | None = None,
        keep_every: int | None = None,
        model_format: str = "auto",
        key: bytes | None = None,
        storage_options: dict[str, Any] | None = None,
        lease_seconds: float = LEASE_SECONDS,
    ):
        if model_format not in MODEL_FORMATS:
            raise ValueError(f"model_format must be one of {MODEL_FORMATS}, not {model_format!r}")
        self.model_format = model_format
        self._key = as_key(key)
        self.keep_last = _positive("keep_last", keep_last)
        self.keep_every = _positive("keep_every", keep_every)
        self._remote: RemoteOptions | None = None
        self.directory: Any
        if is_url(directory):
            # Object storage: no folder to make, and leftovers are cleaned by each save,
            # which holds a lease to judge the others' by.
            self.directory = str(directory).rstrip("/")
            self._remote = RemoteOptions(storage_options, lease_seconds)
            self._root = open_store(self.directory, storage_options)
            self._roll_forward()
        else:
            self.directory = Path(directory)
            self.directory.mkdir(parents=True, exist_ok=True)
            clean_leftovers(self.directory)
        self._snapshotter = Snapshotter()
        self._pending: SaveHandle | None = None
        self._lock = threading.Lock()
        self._group: SavingGroup | None = None  # sharded background saves' group, made once

    # ------------------------------------------------------------------ saving

    def save(
        self,
        step: int,
        *,
        model: Any,
        optimizer: Any = None,
        scheduler: Any = None,
        random_counter: int | None = None,
        extra: Any = None,
        blocking: bool = True,
        overwrite: bool = False,
    ) -> SaveHandle:
        """Save the training state as the set of ``step``.

        Args:
            step: the training step (a u64); its set must not exist unless ``overwrite``.
            model: the model (its member's family: the manager's ``model_format``); or a
                sequence or mapping of models.
            optimizer: its optimizer, if any; or a sequence or mapping of optimizers.
            scheduler: its learning-rate scheduler, if any (``state_dict`` of JSON values);
                or a sequence or mapping of them.
            random_counter: the run's random counter, if it has one.
            extra: anything else of JSON values (exactly, or refused).
            blocking: write and commit before returning (default); ``False``: copy the state
                off the live tensors, return, and write in the background (a sharded model:
                on every rank, see the module docstring).
            overwrite: replace an existing set of ``step``.

        Returns:
            The save's handle (already done when blocking).

        Raises:
            CheckpointError: a training-state value cannot be saved exactly (at the call,
                blocking or not), or the model or optimizer cannot be written to their files
                (blocking: here; in the background: by the handle, the next ``save`` and
                :meth:`wait`) — nothing is committed either way; or the previous background
                save's failure, not yet reported.
            FileExistsError: the step has a set and ``overwrite`` is false.
            OSError: from the file system (blocking).
        """
        step = check_step(step)
        with self._lock:
            self._settle(raise_failure=True)
            if not overwrite and self._exists(step):
                raise FileExistsError(
                    errno.EEXIST,
                    f"step {step} has a checkpoint set already (pass overwrite=True to replace it)",
                    str(self._set_path(step)),
                )
            fmt = self.model_format
            target = self._set_path(step)
            if blocking:
                source = set_source(step, model, optimizer, scheduler, random_counter, extra, fmt)
                path = write_any(
                    target, step, source, overwrite=overwrite, key=self._key, remote=self._remote
                )
                self._after_commit(step, source)
                return finished(step, path)
            live = set_source(step, model, optimizer, scheduler, random_counter, extra, fmt)
            snapshot: Any
            if isinstance(live, StructuredSource):
                snapshot, source = snapshot_structured(self._snapshotter, live)
            else:
                snapshot = self._snapshotter.capture(model, optimizer)
                source = snapshot_source(live, snapshot)
            if not isinstance(source, StructuredSource) and source.sharded:
                background = self._sharded_writer(step, target, source, snapshot, overwrite)
            else:

                def background() -> Path:
                    snapshot.wait()
                    path = write_any(
                        target,
                        step,
                        source,
                        overwrite=overwrite,
                        key=self._key,
                        remote=self._remote,
                    )
                    self._retain(step)
                    return path

            handle = SaveHandle(step, Future(), self.directory)
            start_writer(background, handle)
            self._pending = handle
            return handle

    def _roll_forward(self) -> None:
        """Finish the remote overwrites that killed saves committed but left unfinished
        (:func:`~tlckpt.codec.sets.remote_overwrite.settle`)."""
        if self._remote is None:
            return
        # Housekeeping before a read: a store that fails here fails the read next, and a
        # pending set that does not verify stays as it is (never rolled forward).
        with contextlib.suppress(CheckpointError, OSError):
            settle(self._root, key=self._key, lease_seconds=self._remote.lease_seconds)

    def _set_path(self, step: int) -> Any:
        """``step``'s set: a folder, or a URL."""
        if self._remote is not None:
            return remote_set_url(self.directory, step)
        return set_path(self.directory, step)

    def _exists(self, step: int) -> bool:
        """Whether ``step`` has a set (locally: any entry of its name; remotely: a
        manifest)."""
        if self._remote is not None:
            return step in remote_committed_steps(self._root)
        return os.path.lexists(set_path(self.directory, step))

    def _sharded_writer(
        self, step: int, target: Path, source: SetSource, snapshot: Any, overwrite: bool
    ) -> Callable[[], Path]:
        if self._remote is not None:
            raise CheckpointError(
                "sets of sharded (DTensor) models are saved to local folders only, not to"
                f" object storage ({self.directory})",
                path=str(self.directory),
            )
        if self._group is None or self._group.pg is None:  # on the calling thread, every rank
            self._group = new_saving_group()
        return sharded_background(
            target, step, source, snapshot, overwrite, self._key, self._group.pg, self._retain
        )

    def _after_commit(self, step: int, source: Any) -> None:
        if isinstance(source, StructuredSource) or not source.sharded:
            self._retain(step)
        else:
            retain_on_writer(step, None, self._retain)

    def wait(self) -> None:
        """Block until no save is in flight.

        Raises:
            The in-flight (or last) background save's failure, if its handle has not
            raised it already.
        """
        with self._lock:
            self._settle(raise_failure=True)

    def _settle(self, *, raise_failure: bool) -> None:
        """Wait for the save in flight; with ``raise_failure``, raise its failure if nobody
        has been told of it yet (else it stays to be raised later)."""
        handle = self._pending
        if handle is None:
            return
        handle._future.exception()  # waits for the end, raises nothing
        if not raise_failure:
            return
        self._pending = None
        error = handle._unreported_error()
        if error is not None:
            raise error

    def _retain(self, committed: int) -> None:
        """Apply the retention policy after ``committed`` was committed, and remove
        leftovers. Failures here do not undo the commit: they are warnings."""
        try:
            if self._remote is not None:
                retain_remote(self._root, committed, self.keep_last, self.keep_every)
                return
            victims = retention_victims(
                committed_steps(self.directory), self.keep_last, self.keep_every, committed
            )
            for step in victims:
                remove_set(self.directory, step)
            clean_leftovers(self.directory)
        except OSError as exc:
            warnings.warn(
                f"retention after step {committed} could not remove every old set: {exc}",
                RuntimeWarning,
                stacklevel=2,
            )

    # ------------------------------------------------------------------ reading

    def steps(self) -> list[int]:
        """The committed sets' steps, ascending (a set whose manifest parses; not verified)."""
        if self._remote is not None:
            self._roll_forward()
            return remote_committed_steps(self._root)
        return committed_steps(self.directory)

    def latest(self) -> int | None:
        """The newest set that verifies (every member's size and digest), or ``None``.

        Every newer set passed over is named in a
        :class:`~tlckpt.codec.sets.checkpoint_set.SkippedCheckpointWarning` with the member and
        the check that failed.
        """
        if self._remote is not None:
            self._roll_forward()
            return remote_latest(self._root, key=self._key)
        return latest_verified(self.directory, key=self._key)

    def restore(
        self,
        *,
        model: Any,
        optimizer: Any = None,
        scheduler: Any = None,
        step: int | None = None,
        rng: bool = False,
    ) -> Restored:
        """Restore a set into the live objects in one call, all or nothing.

        The set's members are verified (size and digest) before anything live changes;
        then the model, the optimizer, the scheduler, every param group's hyperparameters
        (``lr`` included) and, with ``rng``, the global random states are written in one
        block with Ctrl-C held back. A save in flight is waited for first.

        Args:
            model, optimizer, scheduler: the live objects (built as for the saved run),
                in the structure they were saved in (one object, a sequence, a mapping of
                the same keys); another structure is refused, nothing changed.
            step: the set to restore; ``None``: the newest that verifies (newer damaged or
                incomplete sets are passed over, each named in a warning).
            rng: also restore torch's, CUDA's, numpy's and ``random``'s global states.

        Returns:
            The set's step, random counter and ``extra``.

        Raises:
            CheckpointError: the set does not verify (``step`` given), none verifies, or
                the set does not fit the objects (names, shapes, optimizer, groups,
                scheduler); nothing live has changed.
            OSError: from the file system; nothing live has changed.
        """
        with self._lock:
            self._settle(raise_failure=False)
        targets = Targets(model, optimizer, scheduler, rng)
        if self._remote is not None:
            self._roll_forward()
            options = self._remote.storage_options
            if step is None:
                return restore_remote_latest(
                    self._root, targets, key=self._key, storage_options=options
                )
            url = self._set_path(check_step(step))
            return restore_remote(url, targets, key=self._key, storage_options=options)
        if step is None:
            return restore_latest(self.directory, targets, key=self._key)
        return restore_set(set_path(self.directory, step), targets, key=self._key)
