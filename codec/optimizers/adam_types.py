"""The values an Adam checkpoint holds, shared by its reader and its writer.

:class:`AdamEntry` (one slot's step and moments) and :class:`AdamCheckpoint` (a checked file)
live here, not in the reader, so that the writer and other readers use them without importing
the reader; :class:`PayloadSink` (where a reader puts payloads, for either optimizer family) is
:mod:`.payload_sinks`'s, named here too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..values.config import AdamConfig
from ..values.schema import ParameterSchema

__all__ = ["AdamEntry", "AdamCheckpoint"]


@dataclass
class AdamEntry:
    """One slot's Adam state: step counter and flat moment arrays of the moment dtype."""

    step: int
    m: Any
    v: Any


@dataclass
class AdamCheckpoint:
    """A fully checked optimizer checkpoint.

    Attributes:
        version: the format version of the file.
        config: the stored configuration (already validated).
        entries: slot id → :class:`AdamEntry`, one per representative slot.
        random_counter: the stored counter, or ``None`` if the file has none.
        schema: the parameter schema stored in the file.
        fields: every other top-level header field a version defines, by name.
    """

    version: int
    config: AdamConfig
    entries: dict[int, AdamEntry]
    random_counter: int | None = None
    schema: ParameterSchema | None = None
    fields: dict[str, Any] = field(default_factory=dict)
