"""Object-storage tests: a moto S3 server on 127.0.0.1 per test module (dummy credentials,
bounded requests), and the shared helpers (``remote_support``) on ``sys.path``.

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

pytest.importorskip("s3fs")
pytest.importorskip("moto.server")

from tlckpt.testing.s3_server import S3Endpoint, local_s3  # noqa: E402


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Endpoint]:
    """A moto S3 server for the module, stopped after it."""
    with local_s3() as endpoint:
        yield endpoint


@pytest.fixture(autouse=True)
def _float32_default_dtype() -> Iterator[None]:
    with default_dtype(torch.float32):
        yield
