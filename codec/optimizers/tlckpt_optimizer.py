"""tlckpt's own optimizer family (``TLCKOPT``), read through its specs.

Each rule is applied the moment its field is decoded, so a hostile header is rejected before
anything it announces is allocated: the spec's own checks (tags, flags, hyperparameter
ranges, an entry's slot having a group, its step), then the rules that need the stored schema
or the destination, here. Nothing is returned until the whole file, trailing bytes included,
has been checked. The writer is :mod:`.tlckpt_optimizer_writer`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from construct import Container

from ...formats import registry
from ...formats.framing import OPTIMIZER_MAGIC
from ...formats.primitives import U64_SIZE, float_bits
from ...formats.tlckpt_optimizer import (
    ENTRIES,
    ENTRY_COUNT,
    GROUP_COUNT,
    GROUPS,
    MOMENT_DTYPES,
    RANDOM_COUNTER,
    SLOT_GROUPS,
    layout_of,
)
from ..errors import ConfigError, EntryError, SchemaMismatchError, differs, names_the_file
from ..fileio.source import PathOrFile
from ..paths import Path, field_name
from ..spec.framed import read_framed
from ..values.config import AdamConfig
from ..values.optimizer_types import OptimizerCheckpoint, OptimizerEntry, ParamGroupConfig
from ..values.payload_sinks import PayloadSink
from ..values.schema import ParameterSchema
from .optimizer_reader import OptimizerReader

__all__ = [
    "OptimizerExpectation",
    "read_optimizer_state",
    "scan_optimizer_state",
    "scan_optimizer_state_sizes",
]

_GROUPS = GROUPS[0]
#: Path lengths of a record of an array, ``(*ARRAY, i)``, and of one of its fields.
_RECORD, _RECORD_FIELD = len(ENTRIES) + 1, len(ENTRIES) + 2


@dataclass(frozen=True)
class _Layout:
    """What the shared schema check asks of a spec: the family always stores the alias map."""

    representatives: bool = True


@dataclass(frozen=True)
class OptimizerExpectation:
    """What a destination requires of a file, beyond its schema; ``None`` fields: anything.

    Attributes:
        groups: the destination's param groups; the file's must equal them in number and
            bit for bit, the learning rate aside.
        slot_groups: per slot, the index of its group (``None``: frozen or alias).
        dtypes: per slot, the moment dtype an entry of that slot must have (``None``: any).
        config: a TorchLean config every group must hold (the learning rate aside), with
            neither amsgrad nor maximize: what a ``TLADAMF`` destination means here.
        adopt_config: the file's betas, epsilon and weight decay are taken as they are (a
            set restore installs them): ``groups``/``config`` are held to their kind,
            amsgrad and maximize only.
    """

    groups: Sequence[ParamGroupConfig] | None = None
    slot_groups: Sequence[int | None] | None = None
    dtypes: Sequence[str | None] | None = None
    config: AdamConfig | None = None
    adopt_config: bool = False


_ANY = OptimizerExpectation()
#: The group values ``adopt_config`` takes from the file (kind, amsgrad and maximize say
#: what the optimizer is and what state it holds: always checked).
_ADOPTED = frozenset({"beta1", "beta2", "epsilon", "weight_decay"})


def _group_tag(group: int | None) -> int:
    return 0 if group is None else group + 1


class _OptimizerReader(OptimizerReader):
    """Checks each field against the stored schema and the destination as it is decoded."""

    layout = _Layout()
    entries_field = ENTRIES[0]

    def __init__(
        self,
        spec: registry.FileSpec,
        schema: ParameterSchema | None,
        expect: OptimizerExpectation,
        sink: PayloadSink | None,
        skip_payloads: bool,
    ):
        self.expect = expect
        self.groups: list[ParamGroupConfig] = []
        self.slot_groups: tuple[int | None, ...] = ()
        self.entries: dict[int, OptimizerEntry] = {}
        self.last_id = -1
        # Whether this version lets a frozen slot keep state; if so, the frozen slots that
        # have a group (each must have an entry) and where their tags are.
        self.frozen_state = layout_of(spec.struct).frozen_state
        self.frozen_holders: dict[int, int] = {}
        self.init_reader(spec, schema, sink, skip_payloads)

    def header_field(self, path: Path, value: Any, offset: int, ctx: Container) -> None:
        if path[0] == _GROUPS:
            self._group_field(path, value, offset)
        elif path == GROUP_COUNT:
            want = self.expect.groups
            if want is not None and value != len(want):
                message = f"the file has {value} param group(s), the optimizer {len(want)}"
                raise differs(ConfigError, message, offset, path, value, len(want))
        elif path == SLOT_GROUPS:
            self._check_slot_groups(value, offset)
        elif path == RANDOM_COUNTER:
            self.random_counter = value
        elif path == ENTRY_COUNT:
            most = self.schema.optimizer_state_count + len(self.frozen_holders)
            if value > most:
                owners = self.schema.optimizer_state_count
                message = f"entry_count is {value}, the schema has {owners} representative slot(s)"
                if self.frozen_holders:
                    message += f" and {len(self.frozen_holders)} frozen slot(s) with a group"
                raise differs(EntryError, message, offset, path, value, f"<= {most}")

    # ------------------------------------------------------------------ param groups

    def _group_field(self, path: Path, value: Any, offset: int) -> None:
        if len(path) == _RECORD:  # a whole group: keep it
            self.groups.append(ParamGroupConfig.from_values(value))
            return
        if len(path) != _RECORD_FIELD:
            return
        index, name = path[1], path[2]
        if name == "lr":
            return  # the live optimizer keeps its own learning rate
        if self.expect.adopt_config and name in _ADOPTED:
            return  # taken from the file; the record's own checks have passed
        want = self._expected_group_value(index, name)
        if want is None:
            return
        same = float_bits(value) == float_bits(want) if isinstance(want, float) else value == want
        if not same:
            shown = _shown(value, want)
            message = f"param group {index}: {name} is {shown[0]} in the file, {shown[1]} expected"
            raise differs(ConfigError, message, offset, path, value, want)

    def _expected_group_value(self, index: int, name: str) -> Any:
        expect = self.expect
        if expect.groups is not None:
            return expect.groups[index].values()[name]
        config = expect.config
        if config is None:
            return None
        if name in ("amsgrad", "maximize"):
            return 0  # a TorchLean config has neither
        if name == "kind":
            return int(config.kind)
        return getattr(config, name)

    # ------------------------------------------------------------------ slot groups

    def _check_slot_groups(self, tags: list[int], offset: int) -> None:
        schema, count = self.schema, len(self.groups)
        expected = self.expect.slot_groups
        want = None if expected is None else [_group_tag(g) for g in expected]
        if want is not None and tags == want:
            frozen = [j for j, grad in enumerate(schema.requires_grad) if not grad and tags[j]]
            if self.frozen_state or not frozen:
                self.slot_groups = tuple(expected)
                self.frozen_holders = {j: offset + U64_SIZE * j for j in frozen}
                return
        for j, tag in enumerate(tags):
            at, where = offset + U64_SIZE * j, f"{field_name(SLOT_GROUPS)}[{j}]"
            frozen = schema.representative(j) is None
            if schema.is_representative(j):
                if not 1 <= tag <= count:
                    raise _no_such_group(j, "trainable", tag, count, at, where, 1)
            elif frozen and self.frozen_state and tag != 0:
                self._check_frozen_group(j, tag, count, want, at, where)
                continue
            elif tag != 0:
                what = "frozen" if frozen else "an alias"
                only = (
                    "representative slots and frozen slots with state"
                    if self.frozen_state
                    else "representative slots"
                )
                raise SchemaMismatchError(
                    f"slot {j} is {what} and has param group tag {tag}; only {only} have a"
                    f" group{'' if self.frozen_state else ' in version 1'}",
                    offset=at,
                    field=where,
                    actual=tag,
                    expected=0,
                )
            elif frozen:
                continue  # no state: whichever group the destination has it in
            if want is not None and tag != want[j]:
                raise _other_group(j, tag, want[j], at, where)
        self.slot_groups = tuple(None if t == 0 else t - 1 for t in tags)

    def _check_frozen_group(
        self, j: int, tag: int, count: int, want: list[int] | None, at: int, where: str
    ) -> None:
        """A frozen slot with a group (version 2): it has state, kept in that group, which
        must be the destination's group of that parameter."""
        if not 1 <= tag <= count:
            raise _no_such_group(j, "frozen with state", tag, count, at, where, 0)
        if want is not None and tag != want[j]:
            if want[j] == 0:
                raise SchemaMismatchError(
                    f"slot {j} is frozen and has state in the file (param group {tag - 1}),"
                    " but the optimizer does not manage that parameter: it has nowhere to"
                    " keep the state",
                    offset=at,
                    field=where,
                    actual=tag - 1,
                    expected=None,
                )
            raise _other_group(j, tag, want[j], at, where)
        self.frozen_holders[j] = at

    # ------------------------------------------------------------------ entries

    def entry_field(self, path: Path, value: Any, offset: int, ctx: Container) -> None:
        depth = len(path)
        if path == ENTRIES:  # after the last entry
            self._check_frozen_entries()
            return
        if depth == _RECORD:  # a whole record: keep it
            self.entries[value.id] = OptimizerEntry(
                int(value.step),
                MOMENT_DTYPES[value.dtype_tag],
                value.m,
                value.v,
                value.get("max_exp_avg_sq"),
            )
            return
        if depth != _RECORD_FIELD:
            return
        name = path[-1]
        if name == "id":
            if value <= self.last_id:
                what = "repeats" if value == self.last_id else "comes after"
                raise EntryError(
                    f"entry id {value} {what} entry id {self.last_id}; ids must increase",
                    offset=offset,
                    field=field_name(path),
                    actual=value,
                    expected=f"> {self.last_id}",
                )
            self.last_id = value
        elif name == "dtype_tag":
            want = self._expected_dtype(ctx.id)
            got = MOMENT_DTYPES[value]
            if want is not None and got != want:
                message = f"entry for slot {ctx.id}: moments are {got} in the file, {want} expected"
                raise differs(ConfigError, message, offset, path, got, want)
        elif name == "count":
            self.check_entry_count(path, value, offset, ctx)

    def _check_frozen_entries(self) -> None:
        """A frozen slot has a group exactly when it has state: each has its entry."""
        for j, at in self.frozen_holders.items():
            if j not in self.entries:
                raise EntryError(
                    f"slot {j} is frozen and has param group tag {self.slot_groups[j] + 1},"
                    " but no entry; a frozen slot has a group only when it has state",
                    offset=at,
                    field=f"{field_name(SLOT_GROUPS)}[{j}]",
                    actual=self.slot_groups[j] + 1,
                    expected=0,
                )

    def _expected_dtype(self, slot: int) -> str | None:
        expect = self.expect
        if expect.dtypes is not None:
            return expect.dtypes[slot]
        if expect.config is not None:
            return expect.config.dtype.value
        return None


def _shown(value: Any, want: Any) -> tuple[str, str]:
    if isinstance(want, float):
        return tuple(f"{x!r} (0x{float_bits(x):016x})" for x in (value, want))  # type: ignore[return-value]
    return repr(value), repr(want)


def _read(
    path: PathOrFile,
    schema: ParameterSchema | None,
    expect: OptimizerExpectation,
    sink: PayloadSink | None,
    skip_payloads: bool,
) -> tuple[OptimizerCheckpoint, _OptimizerReader]:
    reader, _ = read_framed(
        path,
        OPTIMIZER_MAGIC,
        lambda spec: _OptimizerReader(spec, schema, expect, sink, skip_payloads),
    )
    checkpoint = OptimizerCheckpoint(
        reader.version,
        tuple(reader.groups),
        reader.slot_groups,
        reader.entries,
        reader.random_counter,
        reader.stored_schema,
    )
    return checkpoint, reader


@names_the_file()
def read_optimizer_state(
    path: PathOrFile,
    schema: ParameterSchema,
    *,
    groups: Sequence[ParamGroupConfig] | None = None,
    slot_groups: Sequence[int | None] | None = None,
    dtypes: Sequence[str | None] | None = None,
    config: AdamConfig | None = None,
    sink: PayloadSink | None = None,
    adopt_config: bool = False,
) -> OptimizerCheckpoint:
    """Read and fully check a ``TLCKOPT`` file (tlckpt's optimizer family) for ``schema``.

    Args:
        path: file path, or a seekable binary file object (read from its position).
        schema: the destination's parameter schema; the file's must equal it slot by slot.
        groups: the destination's param groups, if known: the file's must be as many and
            equal them bit for bit, the learning rate aside.
        slot_groups: per slot, the index of its param group (``None``: frozen or alias).
        dtypes: per slot, the dtype an entry's moments must have (``None``: any).
        config: a TorchLean config every group must hold (lr aside; no amsgrad, no
            maximize), as a destination that takes ``TLADAMF`` files has.
        sink: where payloads go (default: fresh numpy arrays).
        adopt_config: take the file's betas, epsilon and weight decay as they are (a set
            restore installs them); ``groups``/``config`` are then held to their kind,
            amsgrad and maximize only.

    Returns:
        The checked :class:`~tlckpt.codec.OptimizerCheckpoint`.

    Raises:
        CheckpointError: a subclass naming the rule, field/slot, offset and values.
        OSError: from the file system.

    Example:
        >>> ckpt = read_optimizer_state("opt.tlckopt", schema)   # doctest: +SKIP
        >>> ckpt.entries[0].dtype
        'bfloat16'
    """
    expect = OptimizerExpectation(
        None if groups is None else tuple(groups),
        None if slot_groups is None else tuple(slot_groups),
        None if dtypes is None else tuple(dtypes),
        config,
        adopt_config,
    )
    for name, given in (("slot_groups", expect.slot_groups), ("dtypes", expect.dtypes)):
        if given is not None and len(given) != len(schema):
            raise SchemaMismatchError(
                f"{name} has {len(given)} entries for {len(schema)} slot(s)", field=name
            )
    return _read(path, schema, expect, sink, skip_payloads=False)[0]


@names_the_file()
def scan_optimizer_state(path: PathOrFile) -> OptimizerCheckpoint:
    """Check a ``TLCKOPT`` file against its own stored schema, skipping payloads.

    Used by ``inspect``/``validate``: every rule that does not need a destination applies;
    moments are ``None``.
    """
    return _read(path, None, _ANY, None, skip_payloads=True)[0]


def scan_optimizer_state_sizes(path: PathOrFile) -> tuple[OptimizerCheckpoint, dict[int, int]]:
    """:func:`scan_optimizer_state`, and the bytes of each entry's payloads (slot → bytes)."""
    checkpoint, reader = _read(path, None, _ANY, None, skip_payloads=True)
    return checkpoint, reader.payload_bytes


def _no_such_group(
    j: int, kind: str, tag: int, count: int, at: int, where: str, lowest: int
) -> SchemaMismatchError:
    """Slot ``j`` (``kind``) names a group tag beyond the file's ``count`` groups."""
    return SchemaMismatchError(
        f"slot {j} is {kind} and names param group tag {tag}; the file has {count} group(s)"
        f" (tags 1 to {count})",
        offset=at,
        field=where,
        actual=tag,
        expected=f"{lowest} to {count}",
    )


def _other_group(j: int, tag: int, want: int, at: int, where: str) -> SchemaMismatchError:
    """Slot ``j`` is in group tag ``tag`` in the file, in ``want`` at the destination."""
    return SchemaMismatchError(
        f"slot {j}: param group {tag - 1} in the file, {want - 1} expected",
        offset=at,
        field=where,
        actual=tag - 1,
        expected=want - 1,
    )
