"""Where the readers of both optimizer families put the moment payloads they read.

:class:`PayloadSink` is what a caller hands a reader (for example pinned buffers and device
copies); :class:`SkipPayloads` is the sink of a check that needs no moment values.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

__all__ = ["PayloadSink", "SkipPayloads"]


class PayloadSink(Protocol):
    """Where moment payloads go while reading (for example pinned buffers and device copies)."""

    def buffer(self, record: int, field: str, count: int, dtype: np.dtype) -> Any:
        """A writable C-contiguous buffer for ``count`` elements, or ``None`` to skip."""

    def done(self, record: int, field: str, buffer: Any) -> Any:
        """Called once the buffer is filled; the result is what the entry keeps."""


class SkipPayloads:
    """A payload sink that skips every moment (their bits cannot be wrong, only their size)."""

    def buffer(self, record: int, field: str, count: int, dtype: np.dtype) -> None:
        return None

    def done(self, record: int, field: str, buffer: Any) -> None:
        return None
