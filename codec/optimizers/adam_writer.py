"""Writing Adam / AdamW checkpoints (``TLADAMF``): caller input checked, version selected.

Everything the caller gives is checked before the first byte is written (entries given as a
lazy mapping are checked one by one as they are produced); the version is FORMAT.md's
selection rule, read off each registered spec's layout (:func:`~tlckpt.formats.adam.layout_of`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

from ...formats import registry
from ...formats.adam import AdamLayout, CounterPresence, layout_of
from ...formats.framing import ADAM_MAGIC
from ..errors import CheckpointError, ConfigError, EntryError, names_the_file
from ..fileio.atomic import output
from ..fileio.source import PathOrFile
from ..spec.builder import Reserved
from ..spec.builder import build as build_spec
from ..spec.layout import FileLayout, layout_of_spec
from ..spec.schema_check import schema_values
from ..values.config import AdamConfig
from ..values.schema import ParameterSchema
from .adam_types import AdamEntry
from .writer_checks import (
    check_entry_step,
    check_moments,
    check_random_counter,
    check_schema,
    counter_values,
)

__all__ = ["select_version", "write_adam", "adam_layout"]


def select_version(schema: ParameterSchema, config: AdamConfig, random_counter: int | None) -> int:
    """The version FORMAT.md's selection rule picks: the lowest registered one that fits.

    (float64 → 5; a counter → 4; aliases → 3; else 2.)
    """
    for version in registry.known_versions(ADAM_MAGIC):
        spec = registry.lookup(ADAM_MAGIC, version)
        if spec is not None and _fits(layout_of(spec.struct), schema, config, random_counter):
            return version
    raise CheckpointError("no registered Adam version can hold this state")


def _fits(
    layout: AdamLayout, schema: ParameterSchema, config: AdamConfig, counter: int | None
) -> bool:
    if config.dtype.numpy.str not in layout.moment_dtypes:
        return False
    if counter is None and layout.counter is CounterPresence.ALWAYS:
        return False
    if counter is not None and layout.counter is CounterPresence.NEVER:
        return False
    return layout.representatives or not schema.has_aliases


def _check_entry(slot: int, entry: Any, schema: ParameterSchema, dtype: np.dtype) -> None:
    check_entry_step(slot, entry)
    check_moments(slot, entry, ("m", "v"), dtype, schema.element_count(slot))


def _entry_records(
    entries: Mapping[int, Any], schema: ParameterSchema, dtype: np.dtype, checked: bool
):
    for slot in schema.representative_slots:
        entry = entries[slot]
        if not checked:
            _check_entry(slot, entry, schema, dtype)
        yield {
            "id": slot,
            "step": int(entry.step),
            "count": schema.element_count(slot),
            "m": entry.m.reshape(-1),
            "v": entry.v.reshape(-1),
        }


def _check_inputs(schema: ParameterSchema, config: AdamConfig, random_counter: int | None) -> None:
    check_schema(schema)
    if not isinstance(config, AdamConfig):
        raise ConfigError(f"config must be an AdamConfig, got {type(config).__name__}")
    config.validate()
    check_random_counter(random_counter)


def _check_slots(schema: ParameterSchema, have: set[int]) -> None:
    want = set(schema.representative_slots)
    if have != want:
        missing, extra = sorted(want - have), sorted(have - want)
        raise EntryError(
            f"entries must cover exactly the representative slots {sorted(want)}"
            + (f"; missing {missing}" if missing else "")
            + (f"; not representative {extra}" if extra else ""),
            actual=sorted(have),
            expected=sorted(want),
        )


def _spec(
    schema: ParameterSchema, config: AdamConfig, random_counter: int | None, version: int | None
) -> tuple[int, Any]:
    """The version to write (FORMAT.md's selection, or the forced one) and its spec."""
    chosen = select_version(schema, config, random_counter) if version is None else version
    spec = registry.lookup(ADAM_MAGIC, chosen)
    if spec is None:
        raise CheckpointError(
            f"unknown Adam version {chosen}; registered: {registry.known_versions(ADAM_MAGIC)}"
        )
    if not _fits(layout_of(spec.struct), schema, config, random_counter):
        raise CheckpointError(f"version {chosen} cannot hold this state")
    return chosen, spec


def _values(
    schema: ParameterSchema, config: AdamConfig, random_counter: int | None, records: Any
) -> dict[str, Any]:
    return {
        "dtype_tag": config.dtype.tag,
        "kind": int(config.kind),
        "config": {
            "beta1": config.beta1,
            "beta2": config.beta2,
            "epsilon": config.epsilon,
            "weight_decay": config.weight_decay,
        },
        **counter_values(random_counter),
        **schema_values(schema),
        "entry_count": schema.optimizer_state_count,
        "entries": records,
    }


class _Step(NamedTuple):
    """An entry's step alone, for the entry checks."""

    step: Any


def adam_layout(
    schema: ParameterSchema,
    config: AdamConfig,
    steps: Mapping[int, int],
    random_counter: int | None = None,
    *,
    version: int | None = None,
) -> tuple[int, FileLayout]:
    """The version and the layout of the file :func:`write_adam` writes for entries with
    these steps (payloads in file order: ``m`` then ``v`` of each representative slot, in
    increasing slot order).

    Args:
        schema, config, random_counter, version: as for :func:`write_adam`.
        steps: each representative slot's step.

    Raises:
        CheckpointError: what :func:`write_adam` raises for these inputs.
    """
    _check_inputs(schema, config, random_counter)
    _check_slots(schema, set(steps))
    dtype = config.dtype.numpy
    for slot in schema.representative_slots:
        check_entry_step(slot, _Step(steps[slot]))
    chosen, spec = _spec(schema, config, random_counter, version)
    records = (
        {
            "id": slot,
            "step": int(steps[slot]),
            "count": schema.element_count(slot),
            "m": Reserved(schema.element_count(slot), dtype),
            "v": Reserved(schema.element_count(slot), dtype),
        }
        for slot in schema.representative_slots
    )
    return chosen, layout_of_spec(spec.struct, _values(schema, config, random_counter, records))


@names_the_file()
def write_adam(
    path: PathOrFile,
    schema: ParameterSchema,
    config: AdamConfig,
    entries: Mapping[int, AdamEntry],
    random_counter: int | None = None,
    *,
    version: int | None = None,
) -> int:
    """Write an Adam/AdamW checkpoint atomically; returns the version written.

    Args:
        path: destination path (written atomically), or a binary file object.
        schema: the parameters' schema; must be well-formed.
        config: the bound configuration; validated.
        entries: one :class:`AdamEntry` per representative slot and no others. Accessed one at
            a time in increasing slot order, so a lazy mapping can produce each host array
            on demand.
        random_counter: a u64 to store (selects version 4, or 5 for float64), or ``None``.
        version: force a registered version instead of FORMAT.md's selection.

    Returns:
        The version written.

    Raises:
        CheckpointError: invalid schema/config/entries/counter; nothing is left at ``path``
            beyond the previous file.
        OSError: from the file system.
    """
    _check_inputs(schema, config, random_counter)
    _check_slots(schema, set(entries.keys()))
    dtype = config.dtype.numpy
    # A plain dict is already in memory: check all of it before the first byte is written.
    eager = isinstance(entries, dict)
    if eager:
        for slot in schema.representative_slots:
            _check_entry(slot, entries[slot], schema, dtype)

    chosen, spec = _spec(schema, config, random_counter, version)
    values = _values(
        schema, config, random_counter, _entry_records(entries, schema, dtype, checked=eager)
    )
    with output(path) as f:
        build_spec(f, spec.struct, values)
    return chosen
