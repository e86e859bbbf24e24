"""``tlckpt export-hf`` and ``tlckpt import-hf``: Hugging Face model folders.

``export-hf`` writes a checkpoint set's model (a set's folder, or a manager's directory: its
newest set that verifies) or a model file as ``huggingface_hub`` would save the same state,
tensor by tensor, without torch. ``import-hf`` reads a Hugging Face folder (one file or
shards and their index, every path confined to the folder) and writes all its tensors, exactly,
as one model file of the family its suffix names (as ``save_module_state`` chooses it).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..codec.hf_folders.hf_export import TiesUnknownWarning, export_source
from ..optional import require

__all__ = ["export_hf_folder", "import_hf_folder"]


def export_hf_folder(
    src: str,
    out: str,
    *,
    max_shard_size: int | str,
    model: str | None = None,
    key: Any = None,
    warn: Callable[[str], None] = print,
) -> list[Path]:
    """Export ``src`` to the folder ``out``; a source that records no ties is exported name
    by name, and ``warn`` is told so.

    Returns:
        The files written, the index last.

    Raises:
        CheckpointError: see :func:`tlckpt.export_hf`.
        OSError: from the file system.
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", TiesUnknownWarning)
        written = export_source(src, out, max_shard_size=max_shard_size, model=model, key=key)
    for w in caught:
        if issubclass(w.category, TiesUnknownWarning):
            warn(str(w.message))
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return written


def import_hf_folder(hf_dir: str, out: str | os.PathLike) -> int:
    """Write every tensor of the Hugging Face folder ``hf_dir`` to the model file ``out``
    (``.safetensors``: the safetensors layout, tied tensors once; ``.json``: exact-bits JSON;
    else ``TLSF32B``), exactly or not at all.

    Returns:
        The number of tensors written.

    Raises:
        CheckpointError: an unsafe or malformed folder; a value the chosen family cannot
            hold exactly (bf16 in ``TLSF32B``, mixed dtypes in JSON).
        OSError: from the file system.
    """
    require("torch", "tlckpt import-hf")
    from ..codec.hf_folders.hf_index import read_hf_folder
    from ..runtime.module_state import save_module_state
    from ..runtime.ops.hf_modules import hf_folder_tensors

    tensors = hf_folder_tensors(read_hf_folder(hf_dir))
    save_module_state(tensors, out)
    return len(tensors)
