"""Which path a sharded save or load takes (:mod:`.sharded_io` names them): a collective
probe of the file system, per call.

For a save, rank 0 creates a uniquely named probe file in the destination's folder and every
rank opens it (for writing too, as it will the save's temporary) and reads its content; the
probe file is removed at once. For a load, every rank
fingerprints the source file (size, modification time and a digest of its first 64 KiB) and
the fingerprints must agree (no write: a read-only folder of checkpoints loads in parallel
too). A rank that fails to probe (a folder it cannot see) simply votes no.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
from collections.abc import Iterator
from typing import Any

from ...codec.errors import CheckpointError, ConfigError
from ...codec.fileio.source import open_regular
from .collectives import all_agree, all_rows, broadcast_json, is_writer, share_verdict
from .sharded_io import ENV, LOGGER, ShardedIO, record

__all__ = ["choose", "one_probe"]

_MODES = ("auto", "parallel", "rank0")
_PROBE_PREFIX = ".tlckpt-probe-"
_FINGERPRINT_BYTES = 64 << 10


_remembered = threading.local()


@contextlib.contextmanager
def one_probe() -> Iterator[None]:
    """Inside the block, a save probes each folder once and reuses the answer: a checkpoint
    set's members share one folder. Every rank enters and leaves it at the same point of
    its collectives (the answer is the same on every rank, being agreed)."""
    before = getattr(_remembered, "answers", None)
    _remembered.answers = {}
    try:
        yield
    finally:
        _remembered.answers = before


def _save_probe_once(path: str) -> bool:
    answers = getattr(_remembered, "answers", None)
    if answers is None:
        return _save_probe(path)
    folder = os.path.dirname(os.path.abspath(path))
    if folder not in answers:
        answers[folder] = _save_probe(path)
    return answers[folder]


def _requested() -> str:
    mode = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if mode not in _MODES:
        raise ConfigError(
            f"{ENV}={mode!r}: expected one of {', '.join(_MODES)}",
            field=ENV,
            actual=mode,
            expected=list(_MODES),
        )
    return mode


def _save_probe(path: str) -> bool:
    """Collective: whether every rank sees the file rank 0 creates in ``path``'s folder."""
    folder = os.path.dirname(os.path.abspath(path))
    created: list[str] | None = None
    if is_writer():
        token = os.urandom(16).hex()
        name = f"{_PROBE_PREFIX}{token[:16]}"
        try:
            fd = os.open(
                os.path.join(folder, name),
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW,
                0o666,  # the umask applies, as to the save's temporary
            )
            try:
                os.write(fd, token.encode())
            finally:
                os.close(fd)
            created = [name, token]
        except OSError:
            created = None  # no folder, read-only, full: the streaming path reports it
    shared = broadcast_json(created)
    seen = False
    if shared is not None:
        seen = _sees(os.path.join(folder, shared[0]), shared[1].encode())
    try:
        return all_agree(seen)
    finally:
        if is_writer() and created is not None:
            try:
                os.unlink(os.path.join(folder, created[0]))
            except OSError:
                LOGGER.warning("could not remove the probe file %s", created[0])


def _sees(probe: str, token: bytes) -> bool:
    """Whether this rank reads ``token`` from ``probe``, opened for writing too as the save's
    temporary will be (a test makes a rank blind)."""
    try:
        with open(probe, "r+b") as f:
            return f.read(len(token) + 1) == token
    except OSError:
        return False


def _fingerprint(path: str) -> bytes:
    """What this rank sees at ``path``: size, modification time, the first 64 KiB."""
    try:
        with open_regular(path) as f:  # a FIFO would block the probe of every rank
            st = os.fstat(f.fileno())
            head = f.read(_FINGERPRINT_BYTES)
    except (OSError, CheckpointError):  # the rank-0 load then says what is wrong
        return b""
    return hashlib.sha256(repr((st.st_size, st.st_mtime_ns)).encode() + head).digest()


def _load_probe(path: str) -> bool:
    """Collective: whether every rank sees the same file at ``path``."""
    mine = _fingerprint(path)
    return all_agree(bool(mine), mine)


def choose(path: Any, operation: str, unsupported: str | None) -> bool:
    """Collective: whether this sharded ``operation`` takes the parallel path; recorded.

    Args:
        path: the caller's path or file object.
        operation: ``"save"`` or ``"load"``.
        unsupported: why this rank's tensors or file cannot take the parallel path, or
            ``None`` (ranks may differ: any rank's reason sends every rank through rank 0).

    Raises:
        ConfigError: on every rank, ``TLCKPT_SHARDED_IO`` holds something else than a mode.
    """
    error: BaseException | None = None
    mode = "auto"
    try:
        mode = _requested()
    except ConfigError as exc:
        error = exc
    share_verdict(error)
    is_path = isinstance(path, (str, os.PathLike))
    rows = all_rows(bytes([_MODES.index(mode), is_path, unsupported is None]))
    modes = {_MODES[row[0]] for row in rows}
    forced_rank0 = "rank0" in modes  # any rank's wish for the streaming path wins
    forced_parallel = "parallel" in modes
    if not all(row[1] for row in rows):
        route, reason = "rank0", "a file object is written through rank 0"
    elif forced_rank0:
        route, reason = "rank0", f"{ENV}=rank0"
    elif not all(row[2] for row in rows):  # any rank's reason counts for all
        what = unsupported or "another rank's call"
        route, reason = "rank0", f"{what} is moved through rank 0"
    elif forced_parallel:
        route, reason = "parallel", f"{ENV}=parallel"
    else:
        name = os.fsdecode(path)
        shared = _save_probe_once(name) if operation == "save" else _load_probe(name)
        if shared:
            route, reason = "parallel", "every rank sees the same file system"
        else:
            route, reason = "rank0", "the ranks do not see the same file system"
    taken = ShardedIO(operation, os.fsdecode(path) if is_path else None, route, reason)
    record(taken, log=is_writer())
    return route == "parallel"
