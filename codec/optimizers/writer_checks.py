"""The caller-input checks both optimizer writers (``TLADAMF`` and ``TLCKOPT``) apply before
a byte is written, and the header values they both build.

Each check raises a :class:`~tlckpt.codec.CheckpointError` subclass naming what is wrong, so
a writer that runs them all first leaves nothing behind at its path.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ...formats.primitives import U64_MAX
from ..errors import ConfigError, EntryError, SchemaMismatchError
from ..values.schema import ParameterSchema

__all__ = [
    "check_schema",
    "check_random_counter",
    "counter_values",
    "check_entry_step",
    "check_moments",
]


def check_schema(schema: Any) -> None:
    """Raise :class:`SchemaMismatchError` unless ``schema`` is a well-formed
    :class:`ParameterSchema`."""
    if not isinstance(schema, ParameterSchema) or not schema.is_well_formed():
        raise SchemaMismatchError("the parameter schema is not well-formed", actual=schema)


def check_random_counter(random_counter: Any) -> None:
    """Raise :class:`ConfigError` unless ``random_counter`` is ``None`` or a u64."""
    if random_counter is not None and (
        isinstance(random_counter, bool)
        or not isinstance(random_counter, (int, np.integer))
        or not 0 <= random_counter <= U64_MAX
    ):
        raise ConfigError(
            f"random_counter must be an integer in [0, 2^64), got {random_counter!r}",
            field="random_counter",
            actual=random_counter,
        )


def counter_values(random_counter: int | None) -> dict[str, Any]:
    """The counter's fields (``counter_flag``, ``random_counter``) for the builder; a version
    without one of them ignores it."""
    return {
        "counter_flag": 0 if random_counter is None else 1,
        "random_counter": None if random_counter is None else int(random_counter),
    }


def check_entry_step(slot: int, entry: Any) -> None:
    """Raise :class:`EntryError` unless the entry's ``step`` is an integer in [1, 2^64)."""
    step = getattr(entry, "step", None)
    integral = isinstance(step, (int, np.integer)) and not isinstance(step, bool)
    if not integral or not 1 <= step <= U64_MAX:
        raise EntryError(f"entry for slot {slot}: step must be an integer >= 1, got {step!r}")


def check_moments(
    slot: int,
    entry: Any,
    names: Sequence[str],
    dtype: np.dtype,
    count: int,
    note: str = "",
) -> None:
    """Raise :class:`EntryError` unless each moment array ``names`` of the entry is a numpy
    array of ``dtype`` with ``count`` elements (``note`` is added to the message)."""
    for name in names:
        array = getattr(entry, name, None)
        if not isinstance(array, np.ndarray) or array.dtype != dtype or array.size != count:
            got = (
                f"{array.dtype} with {array.size} elements"
                if isinstance(array, np.ndarray)
                else type(array).__name__
            )
            raise EntryError(
                f"entry for slot {slot}: {name} must be {dtype} with {count} elements{note},"
                f" got {got}",
                field=f"entries[{slot}].{name}",
            )
