"""The Hugging Face ``Trainer``'s checkpoint folders as tlckpt sets, without ``transformers``:
naming, listing, the newest that verifies, rotation, the ``trainer_state.json`` copy, and
every rank's random states (torch imported on use only).

A run's checkpoints are ``<output_dir>/checkpoint-<step>`` (the Trainer's names, which users,
``get_last_checkpoint`` and scripts expect), each one checkpoint set written by
:func:`~tlckpt.runtime.sets.checkpoint_sets.save_checkpoint`: it is committed atomically, has
its members' digests and its manifest last. Its ``extra`` (:data:`EXTRA_FORMAT`) holds the
Trainer's state (``TrainerState`` as a mapping), each rank's random states and the gradient
scaler's state. ``trainer_state.json`` beside the members is a copy of that state for the
Trainer to read (it reads it by path); the set's copy is the truth, and a resume rewrites the
file from it when the two differ.
"""

from __future__ import annotations

import json
import os
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson

from ..codec.errors import CheckpointError, MalformedError
from ..codec.fileio.atomic import atomic_output, fsync_folder
from ..codec.sets.checkpoint_set import VerifiedSet
from ..codec.sets.rng_states import check_random_state
from ..codec.sets.set_folder_moves import remove_tree, rename_aside
from ..codec.sets.set_folders import SkippedCheckpointWarning

__all__ = [
    "PREFIX",
    "EXTRA_FORMAT",
    "TRAINER_STATE_FILE",
    "checkpoint_folder",
    "checkpoint_folders",
    "skip_warning",
    "newest",
    "ResumePoint",
    "resume_point",
    "trainer_state_text",
    "write_trainer_state",
    "rotate",
    "random_state_record",
    "gather_random_states",
    "prepared_random_state",
]

_T = TypeVar("_T")

#: The Trainer's checkpoint folders: ``checkpoint-<step>`` (its ``PREFIX_CHECKPOINT_DIR``).
PREFIX = "checkpoint"
_FOLDER = re.compile(rf"{PREFIX}-([0-9]+)")
#: What a set's ``extra`` records as its ``format``: the layout of the rest of it.
EXTRA_FORMAT = "tlckpt_hf_trainer/1"
#: The Trainer reads its state from this file of the checkpoint folder.
TRAINER_STATE_FILE = "trainer_state.json"


def checkpoint_folder(run_dir: str | os.PathLike, step: int) -> str:
    """The folder of ``step``'s checkpoint in ``run_dir`` (``checkpoint-<step>``)."""
    return os.path.join(os.fspath(run_dir), f"{PREFIX}-{step}")


def checkpoint_folders(run_dir: str | os.PathLike) -> list[tuple[int, str]]:
    """The ``checkpoint-<step>`` folders of ``run_dir`` (sets or not), ``(step, path)`` by
    ascending step; a missing ``run_dir`` has none."""
    try:
        entries = list(os.scandir(run_dir))
    except FileNotFoundError:
        return []
    found = []
    for entry in entries:
        match = _FOLDER.fullmatch(entry.name)
        if match is not None and entry.is_dir(follow_symlinks=False):
            found.append((int(match.group(1)), entry.path))
    return sorted(found)


def skip_warning(path: str, exc: BaseException) -> None:
    """Warn that the checkpoint at ``path`` was passed over because of ``exc``."""
    warnings.warn(
        f"checkpoint {path} skipped: it does not verify as a TlckptTrainer set: {exc}",
        SkippedCheckpointWarning,
        stacklevel=3,
    )


def newest(run_dir: str | os.PathLike, attempt: Callable[[str], _T]) -> _T | None:
    """``attempt`` of the newest ``checkpoint-<step>`` folder of ``run_dir`` for which it
    does not raise ``CheckpointError`` or ``OSError``; each newer one is passed over with a
    :func:`skip_warning`. ``None`` when none passes."""
    for _, path in reversed(checkpoint_folders(run_dir)):
        try:
            return attempt(path)
        except (CheckpointError, OSError) as exc:
            skip_warning(path, exc)
    return None


def _field(mapping: Any, key: str, kind: type, where: str) -> Any:
    value = mapping.get(key) if isinstance(mapping, dict) else None
    if not isinstance(value, kind):
        raise MalformedError(
            f"{where}.{key} must be a {kind.__name__}, got {type(value).__name__}",
            field=f"extra.{where}.{key}",
        )
    return value


@dataclass(frozen=True)
class ResumePoint:
    """A verified set chosen to resume from, and what of its ``extra`` the Trainer needs.

    Attributes:
        path: the set's folder.
        step: its step.
        trainer_state: the Trainer's state, as the mapping the set holds.
        random_states: each rank's random states, as recorded (checked on use).
        scaler: the gradient scaler's ``state_dict``, or ``None``.
        has_optimizer: whether the set holds an optimizer (not one saved with
            ``save_only_model``); then it holds the scheduler too.
    """

    path: str
    step: int
    trainer_state: dict[str, Any]
    random_states: list[Any]
    scaler: dict[str, Any] | None
    has_optimizer: bool


def resume_point(path: str | os.PathLike, *, key: bytes | None = None) -> ResumePoint:
    """Verify the set at ``path`` (every member, its families and headers) and read what the
    Trainer needs of its ``extra``.

    Raises:
        CheckpointError: the set does not verify (the member and check named), its
            ``extra`` is not the Trainer's (:data:`EXTRA_FORMAT`), or its step is not the one
            its ``checkpoint-<step>`` folder or its Trainer state names.
        OSError: from the file system.
    """
    path = os.fspath(path)
    # One pass over the set: the digests as it is opened, then what verify_checkpoint checks.
    with VerifiedSet.open(path, key=key) as verified:
        state = verified.training_state()
        verified.check_members()
        manifest = verified.manifest
    extra = state.extra
    if not isinstance(extra, dict) or extra.get("format") != EXTRA_FORMAT:
        raise CheckpointError(
            f"{path} is a checkpoint set, but not one a TlckptTrainer saved (its extra has no"
            f" format {EXTRA_FORMAT!r})",
            path=path,
            field="extra.format",
        )
    trainer_state = _field(extra, "trainer_state", dict, "extra")
    # The folder's name orders the checkpoints, and the Trainer's state says where to go on
    # from: both must be the set's own step (a set copied or renamed to another is refused).
    match = _FOLDER.fullmatch(os.path.basename(os.path.abspath(path)))
    for what, step in (
        ("the folder's name", None if match is None else int(match.group(1))),
        ("the Trainer state's global_step", trainer_state.get("global_step")),
    ):
        if step is not None and step != state.step:
            raise CheckpointError(
                f"{path}: {what} says step {step}, the set is of step {state.step}",
                path=path,
                field="step",
                actual=step,
                expected=state.step,
            )
    scaler = extra.get("scaler")
    if scaler is not None and not isinstance(scaler, dict):
        raise MalformedError("extra.scaler must be a mapping or null", field="extra.scaler")
    return ResumePoint(
        path=path,
        step=state.step,
        trainer_state=trainer_state,
        random_states=_field(extra, "rng", list, "extra"),
        scaler=scaler,
        has_optimizer="optimizer" in manifest.members,
    )


def trainer_state_text(state: dict[str, Any]) -> str:
    """The text ``TrainerState.save_to_json`` writes for ``state`` (``asdict`` of it)."""
    return json.dumps(state, indent=2, sort_keys=True) + "\n"


def write_trainer_state(folder: str | os.PathLike, state: dict[str, Any]) -> bool:
    """Make ``folder``'s ``trainer_state.json`` the text of ``state``, atomically, unless it
    already is.

    Returns:
        Whether the file was (re)written.

    Raises:
        OSError: from the file system.
    """
    path = os.path.join(os.fspath(folder), TRAINER_STATE_FILE)
    text = trainer_state_text(state).encode()
    try:
        with open(path, "rb") as f:
            if f.read(len(text) + 1) == text:
                return False
    except FileNotFoundError:
        pass
    with atomic_output(path) as f:
        f.write(text)
    return True


def rotate(
    run_dir: str | os.PathLike, limit: int | None, newest: str, best: str | None = None
) -> list[str]:
    """Remove the oldest ``checkpoint-<step>`` folders beyond ``limit``, as the Trainer's
    ``save_total_limit`` does, never ``newest`` (just saved) nor ``best`` (the best model's,
    with ``load_best_model_at_end``). Folders are ordered by step, not by time; each is
    renamed to a hidden leftover name first, so that a removal cut short never leaves a
    damaged checkpoint under its name.

    Returns:
        The folders removed.

    Raises:
        OSError: from the file system.
    """
    if limit is None or limit <= 0:
        return []
    folders = checkpoint_folders(run_dir)
    protected = {os.path.abspath(newest)}
    if best is not None:
        protected.add(os.path.abspath(best))
    keep = max(limit, len(protected))
    removed = []
    remaining = len(folders)
    directory = os.path.abspath(os.fspath(run_dir))
    for _, path in folders:
        if remaining <= keep:
            break
        if os.path.abspath(path) in protected:
            continue
        retired = rename_aside(directory, os.path.abspath(path), ".tmp")
        fsync_folder(directory)
        remove_tree(retired)
        removed.append(path)
        remaining -= 1
    return removed


# --------------------------------------------------------------------------- random states


def random_state_record() -> dict[str, Any]:
    """This process's global random states as JSON values: torch's CPU generator and each
    initialised CUDA device's (hex of their bytes), numpy's legacy global generator and
    Python's ``random`` (their own values, lists for tuples)."""
    import random

    import numpy as np
    import torch

    cuda = []
    # Asking an uninitialised CUDA for a state would initialise it; it has none worth keeping.
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        cuda = [
            torch.cuda.get_rng_state(i).numpy().tobytes().hex()
            for i in range(torch.cuda.device_count())
        ]
    numpy_state = np.random.get_state(legacy=False)
    version, words, gauss = random.getstate()
    return {
        "torch": torch.get_rng_state().numpy().tobytes().hex(),
        "cuda": cuda,
        "numpy": {
            "bit_generator": numpy_state["bit_generator"],
            "state": {
                "key": [int(w) for w in numpy_state["state"]["key"]],
                "pos": int(numpy_state["state"]["pos"]),
            },
            "has_gauss": int(numpy_state["has_gauss"]),
            "gauss": float(numpy_state["gauss"]),
        },
        "random": [version, list(words), gauss],
    }


def gather_random_states(world_size: int) -> list[dict[str, Any]]:
    """Collective where ``world_size > 1`` (every rank calls it): every rank's
    :func:`random_state_record`, by rank, as bytes tensors (nothing pickled)."""
    record = random_state_record()
    if world_size <= 1:
        return [record]
    from ..runtime.placement.collectives.verdicts import all_rows

    data = orjson.dumps(record)
    lengths = [int.from_bytes(r, "little") for r in all_rows(len(data).to_bytes(8, "little"))]
    longest = max(lengths)
    rows = all_rows(data.ljust(longest, b" "))
    return [orjson.loads(row[:n]) for row, n in zip(rows, lengths)]


def _hex(value: Any, field: str) -> bytes:
    try:
        if not isinstance(value, str):
            raise ValueError
        return bytes.fromhex(value)
    except ValueError:
        raise MalformedError(f"{field} must be a hex string", field=field) from None


def prepared_random_state(record: Any, where: str = "extra.rng") -> Callable[[], None]:
    """Check one rank's recorded random states whole (as a set's restore checks its own:
    torch's byte layouts, numpy's and ``random``'s exact forms), and return what installs
    them — which then cannot fail.

    Raises:
        MalformedError, ConfigError: a state is not one its generator writes, or the CUDA
            devices differ (the field named).
    """
    import random

    import numpy as np
    import torch

    from ..runtime.sets import rng_states

    cpu = rng_states.cpu_state(_hex(_field(record, "torch", str, where), f"{where}.torch"))
    cuda_hex = _field(record, "cuda", list, where)
    cuda = rng_states.cuda_states(
        [_hex(h, f"{where}.cuda[{i}]") for i, h in enumerate(cuda_hex)], f"{where}.cuda"
    )
    numpy_state = rng_states.numpy_state(_field(record, "numpy", dict, where))
    saved = _field(record, "random", list, where)
    if len(saved) != 3 or not isinstance(saved[1], list):
        raise MalformedError(f"{where}.random must be [version, words, gauss]", field=where)
    python_state = check_random_state((saved[0], tuple(saved[1]), saved[2]), f"{where}.random")

    def install() -> None:
        torch.set_rng_state(cpu)
        for i, state in enumerate(cuda):
            torch.cuda.set_rng_state(state, i)
        np.random.set_state(numpy_state)
        random.setstate(python_state)

    return install
