"""``tlckpt ls DIR`` and ``tlckpt verify PATH``: checkpoint sets from the command line
(no torch needed).

``ls`` lists every set folder of a directory, oldest first: its step, its size (the members'
bytes, manifest included), and whether it verifies — or why not (the member and the check);
then the sets under other names (a folder holding a manifest, such as Lightning's
``epoch=0-step=5.ckpt`` written by :mod:`tlckpt.integrations.lightning`), by name;
leftovers of killed saves are counted, and entries named like a set that are not one (a
step above 2**64 - 1, a file, a FIFO) are named as skipped. ``verify`` checks one set
completely (:func:`~tlckpt.codec.sets.checkpoint_set.verify_checkpoint`). With a key
(``--key-file``) both accept only sets signed with it; without one, a signed set is reported
as one that cannot be authenticated. Both take URLs (``s3://bucket/run``, ``memory://…``):
the store's options come from ``--storage-options`` (a JSON object) and the standard
environment variables (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``…). What a set records is
printed through :func:`~.printable.printable`: control characters shown, never obeyed.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..codec.errors import CheckpointError
from ..codec.fileio.atomic import is_library_temporary
from ..codec.sets.checkpoint_set import verify_checkpoint
from ..codec.sets.remote_set_reading import remote_candidate_steps
from ..codec.sets.remote_store import is_url, join_url, open_store
from ..codec.sets.set_commit import is_retired
from ..codec.sets.set_folders import read_manifest, scan_sets, set_path
from ..codec.sets.set_keys import as_key
from ..formats.checkpoint_set import FOLDER_PATTERN, MANIFEST_FILE
from .describe import table
from .printable import printable

__all__ = ["list_sets", "verify_set"]


def _size(folder: Path) -> int:
    total = 0
    for entry in os.scandir(folder):
        if entry.is_file(follow_symlinks=False):
            total += entry.stat(follow_symlinks=False).st_size
    return total


def _human(nbytes: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if nbytes < 1024 or unit == "GiB":
            return f"{nbytes:,} {unit}" if unit == "B" else f"{nbytes:,.1f} {unit}"
        nbytes /= 1024  # type: ignore[assignment]
    return str(nbytes)  # pragma: no cover - the loop returns


def _one_line(text: object) -> str:
    return printable(" ".join(str(text).split()))


def _verdict(path: Any, key: Any, storage_options: dict[str, Any] | None) -> str:
    try:
        manifest = verify_checkpoint(path, key=key, storage_options=storage_options)
        members = ", ".join(sorted(m.file for m in manifest.members.values()))
        signed = "" if manifest.key_id is None else f", signed, key id {manifest.key_id}"
        return f"verified ({members}{signed})"
    except (CheckpointError, OSError) as exc:
        kind = type(exc).__name__
        check = getattr(exc, "check", None)
        return f"NOT VERIFIED: {kind}{f' ({check})' if check else ''}: {_one_line(exc)}"


def _list_remote(url: str, key: Any, storage_options: dict[str, Any] | None) -> str:
    """:func:`list_sets` of a directory URL: every ``step-…`` prefix, oldest first (one
    without a manifest is a killed save's, shown as not verified)."""
    root = open_store(url, storage_options)
    rows = []
    for step in remote_candidate_steps(root):
        name = f"step-{step:020d}"
        folder = root.child(name)
        size = sum(folder.size(k) for k in folder.object_keys())
        rows.append((step, _human(size), _verdict(join_url(url, name), key, storage_options)))
    lines = [f"{printable(url)}: {len(rows)} set(s)"]
    if rows:
        lines.append(table(("step", "size", "status"), rows))
    return "\n".join(lines)


def list_sets(
    directory: str | os.PathLike, key: Any = None, storage_options: dict[str, Any] | None = None
) -> str:
    """The table ``tlckpt ls`` prints (``key``: the 32 bytes signed sets must be signed
    with, else ``None``); ``directory`` may be a URL (``storage_options``: its store's).

    Raises:
        CheckpointError: ``key`` is not 32 bytes.
        OSError: the directory cannot be listed.
    """
    key = as_key(key)
    if is_url(directory):
        return _list_remote(str(directory), key, storage_options)
    directory = Path(directory)
    names = os.listdir(directory)  # raises for a missing directory
    rows = []
    steps, strays = scan_sets(directory)
    for step in steps:
        folder = set_path(directory, step)
        rows.append((step, _human(_size(folder)), _verdict(folder, key, None)))
    named = []
    for name in sorted(names):
        folder = directory / name
        # Sets under other names (Lightning's ``epoch=0-step=5.ckpt``): a folder, not hidden
        # (temporaries and leftovers are), holding a manifest.
        if name.startswith(".") or FOLDER_PATTERN.fullmatch(name) or not folder.is_dir():
            continue
        if not (folder / MANIFEST_FILE).is_file():
            continue
        try:
            step = str(read_manifest(folder, authenticate=False).step)
        except (CheckpointError, OSError):
            step = "?"
        named.append((printable(name), step, _human(_size(folder)), _verdict(folder, key, None)))
    leftovers = [n for n in names if is_library_temporary(n)]
    retired = [n for n in names if is_retired(n)]
    lines = [f"{directory}: {len(rows)} set(s)"]
    if rows:
        lines.append(table(("step", "size", "status"), rows))
    if named:
        lines.append(f"{len(named)} set(s) under other names")
        lines.append(table(("set", "step", "size", "status"), named))
    if leftovers:
        count = len(leftovers)
        lines.append(f"{count} leftover(s) of interrupted saves (removed by the next save)")
    if retired:
        # An overwrite that died where no exchange exists: the next save or manager puts
        # the old set back (or removes it, where the new one is in place).
        lines.append(
            f"{len(retired)} set(s) moved aside by an interrupted overwrite (restored or"
            " removed by the next save)"
        )
    lines.extend(f"skipped {name}: not a checkpoint set ({why})" for name, why in strays)
    return "\n".join(lines)


def verify_set(
    path: str | os.PathLike, key: Any = None, storage_options: dict[str, Any] | None = None
) -> str:
    """The line ``tlckpt verify`` prints for a set that verifies (with ``key``: that is
    signed with it); ``path`` may be a URL (``storage_options``: its store's).

    Raises:
        KeyRequiredError: the set is signed and ``key`` is ``None``.
        CheckpointError: it does not verify (the member and the check named).
        OSError: from the file system.
    """
    manifest = verify_checkpoint(path, key=key, storage_options=storage_options)
    total = sum(m.size for m in manifest.members.values())
    if is_url(path):
        total += open_store(str(path), storage_options).size(MANIFEST_FILE)
    else:
        total += (Path(path) / MANIFEST_FILE).stat().st_size
    members = ", ".join(
        f"{m.file} ({m.family} v{m.version}, {_human(m.size)})" for m in manifest.members.values()
    )
    signed = "" if manifest.key_id is None else f"; signed, key id {manifest.key_id}"
    # The library is any string a manifest holds: printed with its control characters shown.
    return (
        f"{printable(path)}: ok (step {manifest.step}, {len(manifest.state)} state tensors,"
        f" {_human(total)}; {members}; written by {printable(manifest.library)}{signed})"
    )
