"""Shared test fixtures: where the conformance vectors are, and parametrisation over them.

The vectors live in ``tests/vectors`` (:func:`tlckpt.testing.vectors.vectors_dir`).

* ``VECTORS_DIR`` / the ``vectors_dir`` fixture: that folder; ``manifest`` fixture: its
  ``manifest.json`` parsed.
* ``@pytest.mark.vectors("state_bits")`` parametrises a test's ``vector`` argument with every
  entry of that manifest section (``vectors("adam", "float32_state")``: of several, in that
  order); ``@pytest.mark.vectors("invalid", kind="state_bits")`` with the entries of
  ``invalid[]`` of that kind (``kind=("adam", "float32_state")`` for several).
  Test ids are the file names. The ``vector_path`` fixture is the parametrised file's path.
* ``vector_usage`` fixture: file name → node ids of the collected test functions that were
  parametrised with it (tests check that no vector goes unexercised).
* Turning entries into codec values (``ParameterSchema``, ``AdamConfig``, arrays) lives in
  :mod:`tlckpt.testing.vectors`, importable from any test module.
"""

from __future__ import annotations

import json
from collections import defaultdict
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from tlckpt.testing.vectors import vectors_dir

VECTORS_DIR = vectors_dir()

#: file name → node ids of the test functions parametrised with it (filled during collection).
VECTOR_USAGE: defaultdict[str, set[str]] = defaultdict(set)


@cache
def load_manifest() -> dict[str, Any]:
    """``manifest.json`` of the conformance vectors (read once per session)."""
    path = VECTORS_DIR / "manifest.json"
    if not path.is_file():
        # A missing vector folder must fail the run, never skip the conformance cases.
        raise pytest.UsageError(f"conformance vectors not found: {path} does not exist")
    return json.loads(path.read_text())


def select_vectors(
    sections: tuple[str, ...], kind: str | tuple[str, ...] | None = None
) -> list[dict]:
    """Entries of ``manifest[section]`` for each section in turn, optionally only those of
    the given kind(s)."""
    kinds = (kind,) if isinstance(kind, str) else kind
    manifest = load_manifest()
    return [e for s in sections for e in manifest[s] if kinds is None or e.get("kind") in kinds]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "vectors(*sections, kind=None): parametrise `vector` with manifest[section] entries",
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    marker = metafunc.definition.get_closest_marker("vectors")
    if marker is None or "vector" not in metafunc.fixturenames:
        return
    sections = marker.args
    kind = marker.kwargs.get("kind")
    entries = select_vectors(sections, kind)
    if not entries:
        raise pytest.UsageError(f"no vectors in manifest{list(sections)} of kind {kind!r}")
    for entry in entries:
        VECTOR_USAGE[entry["file"]].add(metafunc.definition.nodeid)
    metafunc.parametrize("vector", entries, ids=[entry["file"] for entry in entries])


@pytest.fixture(scope="session")
def vectors_dir() -> Path:
    """The conformance vectors folder (``tests/vectors``)."""
    return VECTORS_DIR


@pytest.fixture(scope="session")
def manifest() -> dict[str, Any]:
    """The conformance vectors' manifest."""
    return load_manifest()


@pytest.fixture
def vector_path(vector: dict[str, Any]) -> Path:
    """Path of the file of the parametrised ``vector``."""
    return VECTORS_DIR / vector["file"]


@pytest.fixture(scope="session")
def vector_usage() -> dict[str, set[str]]:
    """File name → node ids of the collected tests parametrised with that vector."""
    return VECTOR_USAGE
