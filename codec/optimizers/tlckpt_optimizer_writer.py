"""Writing tlckpt's own optimizer family (``TLCKOPT``): caller input checked, then streamed.

Everything the caller gives is checked before the first byte is written (entries given as a
lazy mapping are checked one by one as they are produced, and a failure then leaves the
previous file at the path, as every atomic write does).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from ...formats import registry
from ...formats.framing import OPTIMIZER_MAGIC
from ...formats.tlckpt_optimizer import FROZEN_STATE_VERSION, WRITTEN_VERSION
from ..errors import CheckpointError, ConfigError, EntryError, SchemaMismatchError, names_the_file
from ..fileio.atomic import output
from ..fileio.source import PathOrFile
from ..spec.builder import build as build_spec
from ..spec.schema_check import schema_values
from ..values.optimizer_types import (
    OptimizerEntry,
    ParamGroupConfig,
    moment_array_dtype,
    moment_tag,
    validate_group,
)
from ..values.schema import ParameterSchema
from .writer_checks import (
    check_entry_step,
    check_moments,
    check_random_counter,
    check_schema,
    counter_values,
)

__all__ = ["write_optimizer_state"]


def _check_groups(groups: Sequence[ParamGroupConfig]) -> None:
    if not isinstance(groups, Sequence):
        raise ConfigError("groups must be a sequence of ParamGroupConfig", field="groups")
    for index, group in enumerate(groups):
        if not isinstance(group, ParamGroupConfig):
            raise ConfigError(
                f"param group {index} must be a ParamGroupConfig, got {type(group).__name__}",
                field=f"groups[{index}]",
            )
        validate_group(group, index, "groups")


def _check_slot_groups(
    schema: ParameterSchema,
    slot_groups: Sequence[int | None],
    count: int,
    has_entry: frozenset[int],
) -> list[int]:
    """Check each slot's group; returns the frozen slots that have one (and state)."""
    if len(slot_groups) != len(schema):
        raise SchemaMismatchError(
            f"slot_groups has {len(slot_groups)} entries for {len(schema)} slot(s)",
            field="slot_groups",
        )
    frozen_with_state = []
    for i, group in enumerate(slot_groups):
        owner = schema.is_representative(i)
        # A frozen slot keeps the state it had before it was frozen: its group says where.
        holds = owner or (schema.representative(i) is None and i in has_entry)
        if holds:
            ok = isinstance(group, (int, np.integer)) and not isinstance(group, bool)
            if not ok or not 0 <= group < count:
                what = "trainable" if owner else "frozen with state (an entry)"
                raise SchemaMismatchError(
                    f"slot {i} is {what}: its group must be an index below {count}, got {group!r}",
                    field=f"slot_groups[{i}]",
                    actual=group,
                )
            if not owner:
                frozen_with_state.append(i)
        elif group is not None:
            raise SchemaMismatchError(
                f"slot {i} is frozen or an alias: its group must be None (a frozen slot has"
                f" one only when it has an entry), got {group!r}",
                field=f"slot_groups[{i}]",
                actual=group,
            )
    return frozen_with_state


def _check_entry(
    slot: int, entry: Any, schema: ParameterSchema, amsgrad: bool
) -> tuple[int, np.dtype]:
    """The entry's dtype tag and array dtype, once every part of it is checked."""
    check_entry_step(slot, entry)
    tag = moment_tag(getattr(entry, "dtype", None))
    dtype = moment_array_dtype(entry.dtype)
    names = ("m", "v", "max_exp_avg_sq") if amsgrad else ("m", "v")
    count = schema.element_count(slot)
    check_moments(slot, entry, names, dtype, count, f" ({entry.dtype} moments)")
    if not amsgrad and getattr(entry, "max_exp_avg_sq", None) is not None:
        raise EntryError(
            f"entry for slot {slot}: its group has no amsgrad, so it has no max_exp_avg_sq",
            field=f"entries[{slot}].max_exp_avg_sq",
        )
    return tag, dtype


def _entry_records(
    entries: Mapping[int, OptimizerEntry],
    slots: list[int],
    schema: ParameterSchema,
    amsgrad: Sequence[bool],
    checked: dict[int, int] | None,
) -> Iterator[dict[str, Any]]:
    for slot in slots:
        entry = entries[slot]
        tag = (
            checked[slot]
            if checked is not None
            else _check_entry(slot, entry, schema, amsgrad[slot])[0]
        )
        yield {
            "id": slot,
            "step": int(entry.step),
            "dtype_tag": tag,
            "count": schema.element_count(slot),
            "m": entry.m.reshape(-1),
            "v": entry.v.reshape(-1),
            "max_exp_avg_sq": entry.max_exp_avg_sq.reshape(-1) if amsgrad[slot] else None,
        }


@names_the_file()
def write_optimizer_state(
    path: PathOrFile,
    schema: ParameterSchema,
    groups: Sequence[ParamGroupConfig],
    slot_groups: Sequence[int | None],
    entries: Mapping[int, OptimizerEntry],
    random_counter: int | None = None,
) -> int:
    """Write a ``TLCKOPT`` file (tlckpt's optimizer family) atomically; returns its version.

    Args:
        path: destination path (written atomically), or a binary file object.
        schema: the parameters' schema; must be well-formed.
        groups: the optimizer's param groups, in order (each validated).
        slot_groups: per slot, the index of its group; ``None`` exactly for aliases and
            frozen slots without an entry (a frozen slot with an entry has its group).
        entries: one :class:`~tlckpt.codec.OptimizerEntry` per representative slot that has
            state (none for one that has not), and per frozen slot that kept state from
            before it was frozen (version 2). Accessed one at a time in increasing slot
            order, so a lazy mapping can produce each host array on demand.
        random_counter: a u64 to store, or ``None``.

    Returns:
        The version written: 2 when a frozen slot has an entry (TorchLean's schema forbids
        that, tlckpt's version 2 holds it), else 1.

    Raises:
        CheckpointError: invalid schema, groups, slot groups, entries or counter; nothing is
            left at ``path`` beyond the previous file.
        OSError: from the file system.
    """
    check_schema(schema)
    _check_groups(groups)
    slots = sorted(entries.keys())
    frozen = _check_slot_groups(schema, slot_groups, len(groups), frozenset(slots))
    check_random_counter(random_counter)
    amsgrad = [g is not None and groups[g].amsgrad for g in slot_groups]
    owners = schema.representative_set.union(frozen)
    strays = [s for s in slots if s not in owners]
    if strays:
        raise EntryError(
            "entries are for representative slots only (and frozen slots with a group);"
            f" not representative: {strays}",
            actual=strays,
            expected=sorted(owners),
        )
    # A plain dict is already in memory: check all of it before the first byte is written.
    checked = None
    if isinstance(entries, dict):
        checked = {s: _check_entry(s, entries[s], schema, amsgrad[s])[0] for s in slots}

    # Version 1 unless a frozen slot keeps state: files version 1 holds stay byte-identical.
    version = FROZEN_STATE_VERSION if frozen else WRITTEN_VERSION
    spec = registry.lookup(OPTIMIZER_MAGIC, version)
    if spec is None:  # pragma: no cover - registered by tlckpt.formats itself
        raise CheckpointError(f"TLCKOPT version {version} is not registered")
    values = {
        **counter_values(random_counter),
        "group_count": len(groups),
        "groups": [g.values() for g in groups],
        **schema_values(schema),
        "slot_groups": [0 if g is None else int(g) + 1 for g in slot_groups],
        "entry_count": len(slots),
        "entries": _entry_records(entries, slots, schema, amsgrad, checked),
    }
    with output(path) as f:
        build_spec(f, spec.struct, values)
    return version
