"""Reading a Hugging Face model folder's layout: which files hold which tensors.

A folder with ``model.safetensors.index.json`` is sharded: the index is read within bounds
(at most :data:`MAX_INDEX_BYTES`, UTF-8 JSON, no name given twice with different files) and
every file it names is confined to the folder — a relative path without ``..``, whose real
path (symlinks followed) lies inside the folder's, naming a regular file that exists. A
folder without an index holds ``model.safetensors``. Nothing here reads a tensor: the
shards' headers are checked by the safetensors reader when they are opened.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from ..errors import FileTooLargeError, IntegrityError, MalformedError, names_the_file
from ..fileio.source import open_source
from .shard_plan import INDEX_FILE, SINGLE_FILE

__all__ = ["MAX_INDEX_BYTES", "HFFolder", "read_hf_folder", "confined"]

#: The largest index read (an index names each tensor once: megabytes for the largest
#: models).
MAX_INDEX_BYTES = 64 << 20


@dataclass(frozen=True)
class HFFolder:
    """A Hugging Face folder's layout.

    Attributes:
        folder: the folder.
        files: each weights file (its name as the folder's index gives it → its path), in
            the order the index first names them; ``{"model.safetensors": …}`` unsharded.
        weight_map: tensor name → its file's name, for a sharded folder (``None`` for one
            file: its header names its tensors).
        metadata: the index's ``metadata`` strings (``dropped → kept`` names of tied
            tensors among them); ``{}`` unsharded.
    """

    folder: Path
    files: dict[str, Path]
    weight_map: dict[str, str] | None = None
    metadata: dict[str, str] = field(default_factory=dict)


def _malformed(path: Path, message: str, **kwargs: Any) -> MalformedError:
    return MalformedError(message, path=path, **kwargs)


def confined(folder: Path, name: Any, index: Path) -> Path:
    """The path of file ``name`` of the index at ``index``, confined to ``folder``.

    Raises:
        MalformedError: not a string, empty, absolute, a ``..`` or a backslash in it, or a
            path whose real path leaves the folder (through a symlink).
        IntegrityError: no regular file there (``check`` is ``"present"``).
    """
    if type(name) is not str or not name or "\x00" in name or "\\" in name:
        raise _malformed(index, f"a weight_map file name is not a plain relative path: {name!r}")
    parts = PurePosixPath(name).parts
    if PurePosixPath(name).is_absolute() or ".." in parts or (parts and ":" in parts[0]):
        raise _malformed(
            index,
            f"weight_map names {name!r}, outside the folder (absolute paths and '..' are refused)",
            field="weight_map",
            actual=name,
        )
    path = folder / name
    real = Path(os.path.realpath(path))
    if not real.is_relative_to(Path(os.path.realpath(folder))):
        raise _malformed(
            index,
            f"{name!r} is a link to {str(real)!r}, outside the folder",
            field="weight_map",
            actual=name,
        )
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        mode = None
    if mode is None or not stat.S_ISREG(mode):
        raise IntegrityError(
            f"{name!r} is {'missing' if mode is None else 'not a file'}",
            check="present",
            path=path,
            field="weight_map",
            actual=name,
        )
    return path


def _pairs(path: Path, where: str) -> Any:
    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out and out[key] != value:
                raise _malformed(
                    path,
                    f"{where} names {key!r} twice, with different values",
                    field=key,
                    actual=[out[key], value],
                )
            out[key] = value
        return out

    return hook


def _read_index(path: Path) -> dict[str, Any]:
    with open_source(path) as src:
        if src.remaining > MAX_INDEX_BYTES:
            raise FileTooLargeError(
                f"the index has {src.remaining} bytes; at most {MAX_INDEX_BYTES} are read",
                path=path,
                actual=src.remaining,
                expected=MAX_INDEX_BYTES,
            )
        raw = src.read(src.remaining, "index")
    try:
        document = json.loads(raw.decode("utf-8"), object_pairs_hook=_pairs(path, "the index"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        if isinstance(exc, MalformedError):
            raise
        raise _malformed(path, f"the index is not UTF-8 JSON: {type(exc).__name__}") from None
    if type(document) is not dict or type(document.get("weight_map")) is not dict:
        raise _malformed(path, "the index is not an object with a weight_map object")
    return document


@names_the_file("folder")
def read_hf_folder(folder: str | os.PathLike) -> HFFolder:
    """The layout of the Hugging Face folder ``folder``, every file it names checked to be
    there and inside the folder.

    Raises:
        MalformedError: an index that is not UTF-8 JSON within bounds, whose ``weight_map``
            is not an object of names → file names, names a tensor twice with different
            files, or names a file outside the folder.
        FileTooLargeError: an index over :data:`MAX_INDEX_BYTES`.
        IntegrityError: a file it names is missing; neither an index nor
            ``model.safetensors`` is there.
        OSError: from the file system.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise IntegrityError(f"{str(folder)!r} is not a folder", check="present", path=folder)
    index = folder / INDEX_FILE
    if not os.path.lexists(index):
        single = folder / SINGLE_FILE
        if not single.is_file():
            raise IntegrityError(
                f"the folder has neither {INDEX_FILE} nor {SINGLE_FILE}",
                check="present",
                path=folder,
            )
        return HFFolder(folder, {SINGLE_FILE: confined(folder, SINGLE_FILE, single)})
    document = _read_index(confined(folder, INDEX_FILE, index))
    weight_map: dict[str, str] = document["weight_map"]
    files: dict[str, Path] = {}
    for name in weight_map.values():
        if type(name) is not str or name not in files:  # a list is refused, not hashed
            files[name] = confined(folder, name, index)
    if not files:
        raise _malformed(index, "the index's weight_map names no tensor", field="weight_map")
    raw_metadata = document.get("metadata")
    metadata = (
        {k: v for k, v in raw_metadata.items() if type(v) is str}
        if type(raw_metadata) is dict
        else {}
    )
    return HFFolder(folder, files, dict(weight_map), metadata)
