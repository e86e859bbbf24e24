"""Editing a checkpoint set's training-state document as an attacker would: change a value,
then recompute the member's size and digest and the manifest's own digest, so that the set
still verifies (xxh3 digests catch damage, not tampering).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import xxhash

from tlckpt.formats.checkpoint_set import MANIFEST_FILE, TRAINING_STATE_FILE

__all__ = ["edit_training_state"]


def _reseal(folder: Path, data: bytes) -> None:
    (folder / TRAINING_STATE_FILE).write_bytes(data)
    manifest = orjson.loads((folder / MANIFEST_FILE).read_bytes())
    record = manifest["members"]["training_state"]
    record["size"] = len(data)
    record["digest"] = xxhash.xxh3_128(data).hexdigest()
    body = {k: v for k, v in manifest.items() if k != "self_digest"}
    manifest["self_digest"] = xxhash.xxh3_128(orjson.dumps(body)).hexdigest()
    (folder / MANIFEST_FILE).write_bytes(orjson.dumps(manifest))


def edit_training_state(folder: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    """Apply ``edit`` to the set's training-state document (its JSON, tags as written) and
    reseal the set."""
    document = orjson.loads((folder / TRAINING_STATE_FILE).read_bytes())
    edit(document)
    _reseal(folder, orjson.dumps(document))
