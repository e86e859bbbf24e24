"""Hostile-input and crash-safety tests: make ``hostile_support`` importable, vectors fixture.

pytest runs with ``--import-mode=importlib``, which does not put test folders on ``sys.path``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from hostile_support import VECTORS  # noqa: E402


@pytest.fixture(scope="session")
def vectors_path() -> Path:
    """The conformance vectors folder; a missing one fails the run (never skips)."""
    if not (VECTORS / "manifest.json").is_file():
        raise pytest.UsageError(f"conformance vectors not found in {VECTORS}")
    return VECTORS
