"""Runtime tests: make the shared helpers (``runtime_support``) importable by the test modules.

pytest runs with ``--import-mode=importlib``, which does not put test folders on ``sys.path``.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tlckpt.testing.models import default_dtype

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)


@pytest.fixture(autouse=True)
def _float32_default_dtype() -> Iterator[None]:
    """Every runtime test starts with float32 as torch's default dtype; restored after."""
    with default_dtype(torch.float32):
        yield
