"""Writing a Hugging Face model folder: the shards, then the index, then the stale files go.

The order keeps a folder loadable as something whole at every moment a write may stop:

1. an index left by an earlier export is removed first (durably), so that no index ever
   points at a mix of old and new shards;
2. each shard is written atomically (a temporary file renamed into place): a shard of a
   final name is always complete;
3. for a sharded export, an old ``model.safetensors`` (which loaders prefer to an index) is
   removed just before the new index is written, atomically — the commit point;
4. then the files of the earlier export this one does not have are removed.

An export stopped before step 3 leaves no index (the earlier single file, if there was one,
is still whole); one stopped in step 4 leaves an index whose files are all new. Other files
of the folder (``config.json``, tokenizers) are never touched.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path

from ..fileio.atomic import fsync_folder, output
from ..safetensors.writer import TensorData, write_safetensors
from .shard_plan import INDEX_FILE, SHARD_PATTERN, SINGLE_FILE, ShardPlan, index_bytes

__all__ = ["FORMAT_METADATA", "write_hf_folder"]

#: The metadata ``huggingface_hub`` gives every shard.
FORMAT_METADATA = {"format": "pt"}
_OURS = re.compile(SHARD_PATTERN)


def _remove(path: Path) -> bool:
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


def write_hf_folder(
    out_dir: str | os.PathLike,
    plan: ShardPlan,
    tensor: Callable[[str], TensorData],
    removals: Mapping[str, str],
    *,
    before_commit: Callable[[], None] | None = None,
    on_shard: Callable[[str], None] | None = None,
) -> list[Path]:
    """Write the folder of ``plan`` (see the module docstring for the order).

    Args:
        out_dir: the folder (made if missing).
        plan: the shards and their tensors.
        tensor: name → its :class:`TensorData` (called when its shard is written; its
            bytes may be produced later still, when its turn in the file comes).
        removals: dropped tied name → kept name (the metadata of a single file, or of the
            index).
        before_commit: called once every tensor is written, before the commit: before the
            index is written, or before a single file is renamed into place (a source's
            last check that it did not change).
        on_shard: called with each file name before it is written (progress).

    Returns:
        The files written, in order (the index last).

    Raises:
        CheckpointError: a tensor the layout cannot hold, or one whose bytes are not its
            size; an error of ``before_commit``. The shards written so far stay; no index.
        OSError: from the file system.
    """
    folder = Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    if _remove(folder / INDEX_FILE):
        fsync_folder(folder)
    written: list[Path] = []
    for file, names in plan.files.items():
        if on_shard is not None:
            on_shard(file)
        metadata = dict(FORMAT_METADATA)
        if not plan.sharded:
            metadata.update(removals)
        path = folder / file
        items = {name: tensor(name) for name in names}
        with output(path) as f:  # renamed into place when the block ends without an error
            write_safetensors(f, items, metadata=metadata)
            if before_commit is not None and not plan.sharded:
                before_commit()  # a single file is the commit: checked before its rename
        written.append(path)
    if before_commit is not None and plan.sharded:
        before_commit()
    if plan.sharded:
        _remove(folder / SINGLE_FILE)
        with output(folder / INDEX_FILE) as f:
            f.write(index_bytes(plan, removals))
        written.append(folder / INDEX_FILE)
    keep = {p.name for p in written}
    stale = [
        entry
        for entry in sorted(os.listdir(folder))
        if _OURS.fullmatch(entry) and entry not in keep and (folder / entry).is_file()
    ]
    for entry in stale:
        _remove(folder / entry)
    if stale:
        fsync_folder(folder)
    return written
