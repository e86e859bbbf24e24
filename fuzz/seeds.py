"""Seed files for the campaigns: every conformance vector, plus larger generated files.

A :class:`~fuzz.seed.Seed` is a file's bytes, the family it belongs to (and its report key),
and the destination a reader is given for it, so that each mutated copy can be read both
against its destination and by ``inspect``.

The vectors are read from ``<repo>/tests/vectors`` (override with ``TLCKPT_VECTORS``); the
manifest has one section per family, named as the family, and ``invalid[]`` entries name
theirs in ``kind``. Generated files are in :mod:`fuzz.generated`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .generated import crafted_seeds, generated_seeds, max_record_seeds
from .seed import LARGE_LIMIT, REPO, Reader, Seed, format_keys, readers, report_key

__all__ = [
    "LARGE_LIMIT",
    "REPO",
    "Reader",
    "Seed",
    "all_seeds",
    "crafted_seeds",
    "format_keys",
    "generated_seeds",
    "max_record_seeds",
    "readers",
    "report_key",
    "vector_seeds",
]


def _destination(kind: str, entry: dict[str, Any], source: str) -> Any:
    """A manifest entry's destination, through its family's description parser. A valid
    Adam vector's own config (and its dtype) is the destination's."""
    from tlckpt.codec.families import family_named

    config = entry.get("config")
    if config is not None:
        entry = {**entry, "dtype": config["dtype"], "expected_config": config}
    return family_named(kind).parse_destination(entry, source)


def vector_seeds(folder: Path | None = None) -> list[Seed]:
    """Every file of the manifest (valid and invalid) as a seed.

    Args:
        folder: the vectors folder (default: :func:`tlckpt.testing.vectors.vectors_dir`,
            imported here so that importing this module does not import the library before
            the atheris runner instruments it).
    """
    from tlckpt.codec.families import families

    if folder is None:
        from tlckpt.testing.vectors import vectors_dir

        folder = vectors_dir()
    manifest = json.loads((folder / "manifest.json").read_text())
    sections = [(f.name, entry, True) for f in families() for entry in manifest.get(f.name, [])]
    sections += [(entry["kind"], entry, False) for entry in manifest["invalid"]]
    seeds = []
    for kind, entry, valid in sections:
        data = (folder / entry["file"]).read_bytes()
        dest = _destination(kind, entry, entry["file"])
        seeds.append(Seed(entry["file"], report_key(kind, data), kind, data, dest, valid=valid))
    return seeds


def all_seeds() -> list[Seed]:
    """Vectors first, then generated, max-record and crafted seeds."""
    return vector_seeds() + generated_seeds() + max_record_seeds() + crafted_seeds()
