"""Adam / AdamW optimizer checkpoints (``TLADAMF``), read and written through the specs.

Reading follows FORMAT.md §3's rules in order, each the moment its field is decoded, so a
hostile header is rejected before anything it announces is allocated. Nothing is returned
until the whole file, trailing bytes included, has been checked.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
from construct import Container

from ..formats import registry
from ..formats.adam import layout_of
from ..formats.framing import ADAM_MAGIC
from ..formats.primitives import U64_MAX
from .atomic import output
from .batches import RecordBatch
from .config import AdamConfig, AdamKind, MomentDtype
from .errors import (
    CheckpointError,
    ConfigError,
    EntryError,
    SchemaMismatchError,
    names_the_file,
)
from .framed import check_trailing, read_framing
from .schema import ParameterSchema
from .schema_check import SchemaVisitorMixin, schema_values
from .source import PathOrFile, open_source
from .walker import Path, Visitor, parse
from .walker import build as build_spec

__all__ = [
    "AdamEntry",
    "AdamCheckpoint",
    "PayloadSink",
    "read_adam",
    "write_adam",
    "select_version",
]


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


class PayloadSink(Protocol):
    """Where moment payloads go while reading (for example pinned buffers and device copies)."""

    def buffer(self, record: int, field: str, count: int, dtype: np.dtype) -> Any:
        """A writable C-contiguous buffer for ``count`` elements, or ``None`` to skip."""

    def done(self, record: int, field: str, buffer: Any) -> Any:
        """Called once the buffer is filled; the result is what the entry keeps."""


_HEADER_FIELDS = ("dtype_tag", "kind", "config", "counter_flag", "random_counter")
_BLOCKS = frozenset({"magic", "version", "schema", "representatives", "entry_count", "entries"})


class _AdamReader(SchemaVisitorMixin, Visitor):
    """Checks each field against the destination as it is decoded (FORMAT.md §3 order)."""

    def __init__(
        self,
        spec: registry.FileSpec,
        schema: ParameterSchema | None,
        dtype: MomentDtype | None,
        expected_config: AdamConfig | None,
        sink: PayloadSink | None,
        skip_payloads: bool,
    ):
        self.layout = layout_of(spec.struct)
        self.version = spec.version
        self.expected = schema
        self.dtype = dtype
        self.expected_config = expected_config
        self.sink = sink
        self.skip_payloads = skip_payloads
        self.file_dtype = MomentDtype.FLOAT32
        self.config: AdamConfig | None = None
        self.random_counter: int | None = None
        self.entries: dict[int, AdamEntry] = {}
        self.fields: dict[str, Any] = {}
        self.init_schema_check(schema)

    def on_field(self, path: Path, value: Any, offset: int, ctx: Container) -> None:
        head = path[0]
        if head == "schema" or head == "representatives":
            self.check_schema_field(path, value, offset, ctx)
            return
        if head == "entries":
            self._entry_field(path, value, offset, ctx)
            return
        if len(path) != 1:
            return
        if head == "version":
            if (
                self.expected is not None
                and self.expected.has_aliases
                and not self.layout.representatives
            ):
                raise SchemaMismatchError(
                    f"version {value} cannot restore shared parameter histories: the"
                    " destination has tied parameters",
                    offset=offset,
                    field="version",
                    actual=value,
                )
        elif head == "dtype_tag":
            self.file_dtype = MomentDtype.from_tag(value)
            self._check_dtype(offset)
        elif head == "config":
            if "dtype_tag" not in ctx:
                self._check_dtype(offset)
            self._check_config(ctx, offset)
        elif head == "random_counter":
            self.random_counter = value
        elif head == "entry_count":
            want = self.schema.optimizer_state_count
            if value != want:
                raise EntryError(
                    f"entry_count is {value}, the schema has {want} representative slot(s)",
                    offset=offset,
                    field="entry_count",
                    actual=value,
                    expected=want,
                )
        elif head not in _BLOCKS and head not in _HEADER_FIELDS:
            self.fields[head] = value

    def batches(self, path: Path) -> bool:
        if path == ("schema", "slots"):
            return True
        return path == ("entries",) and self.skip_payloads

    def on_records(self, path: Path, batch: RecordBatch) -> bool:
        if path[0] == "schema":
            return self.schema_records(batch)
        # Every rule _entry_field applies, for the whole batch; any break: walk it instead.
        schema = self.schema
        ids, steps = batch.values("id"), batch.values("step")
        counts = batch.values("count")
        entries, seen, owners = self.entries, set(), schema.representative_set
        for slot, step, count in zip(ids, steps, counts):
            if (
                slot not in owners  # also out of range
                or slot in entries
                or slot in seen
                or step == 0
                or count != schema.element_count(slot)
            ):
                return False
            seen.add(slot)
        for slot, step in zip(ids, steps):
            entries[slot] = AdamEntry(step, None, None)
        return True

    def _check_dtype(self, offset: int) -> None:
        if self.dtype is not None and self.file_dtype is not self.dtype:
            raise ConfigError(
                f"moment dtype is {self.file_dtype.value} in the file, the destination"
                f" expects {self.dtype.value}",
                offset=offset,
                field="dtype_tag",
                actual=self.file_dtype.value,
                expected=self.dtype.value,
            )

    def _check_config(self, ctx: Container, offset: int) -> None:
        hp = ctx.config
        config = AdamConfig(
            AdamKind(ctx.kind), hp.beta1, hp.beta2, hp.epsilon, hp.weight_decay, self.file_dtype
        )
        try:
            config.validate()
        except ConfigError as exc:
            raise ConfigError(
                f"invalid config: {exc.reason}",
                offset=offset,
                field=f"config.{exc.field}",
                actual=exc.actual,
                expected=exc.expected,
            ) from None
        if self.expected_config is not None and not config.same_bits(self.expected_config):
            diffs = "; ".join(config.differences(self.expected_config))
            raise ConfigError(
                f"config differs from the destination's (file vs expected): {diffs}",
                offset=offset,
                field="config",
            )
        self.config = config

    def _entry_field(self, path: Path, value: Any, offset: int, ctx: Container) -> None:
        if len(path) == 1:  # the whole array: records were kept one by one
            return
        if len(path) == 2:  # a whole record: keep it
            self.entries[value.id] = AdamEntry(int(value.step), value.m, value.v)
            return
        name = path[2]
        where = f"entries[{path[1]}].{name}"
        schema = self.schema
        if name == "id":
            if not value < len(schema):
                raise EntryError(
                    f"entry id {value} is out of range: {len(schema)} slot(s)",
                    offset=offset,
                    field=where,
                    actual=value,
                )
            if value in self.entries:
                raise EntryError(f"duplicate entry id {value}", offset=offset, field=where)
            if not schema.is_representative(value):
                what = "frozen" if schema.representative(value) is None else "an alias"
                raise EntryError(
                    f"entry id {value} is {what}; only representative slots own moments",
                    offset=offset,
                    field=where,
                    actual=value,
                )
        elif name == "step":
            if value == 0:
                raise EntryError(
                    f"entry for slot {ctx.id} has step 0", offset=offset, field=where, actual=0
                )
        elif name == "count":
            want = schema.element_count(ctx.id)
            if value != want:
                raise EntryError(
                    f"entry for slot {ctx.id} has {value} elements, the slot has {want}",
                    offset=offset,
                    field=where,
                    actual=value,
                    expected=want,
                )

    def payload_buffer(
        self, path: Path, count: int, dtype: np.dtype, ctx: Container, offset: int
    ) -> Any:
        if self.skip_payloads:
            return None
        if self.sink is not None:
            return self.sink.buffer(int(ctx.id), path[-1], count, dtype)
        return np.empty(count, dtype=dtype)

    def payload_done(self, path: Path, buffer: Any, ctx: Container) -> Any:
        if self.sink is not None:
            return self.sink.done(int(ctx.id), path[-1], buffer)
        return buffer


def _read(
    path: PathOrFile,
    schema: ParameterSchema | None,
    dtype: MomentDtype | None,
    expected_config: AdamConfig | None,
    sink: PayloadSink | None,
    skip_payloads: bool,
) -> AdamCheckpoint:
    with open_source(path) as src:
        spec = read_framing(src, expect=ADAM_MAGIC)
        reader = _AdamReader(spec, schema, dtype, expected_config, sink, skip_payloads)
        parse(src, spec.struct, reader)
        check_trailing(src)
    if reader.config is None:  # every registered Adam spec has a config; a toy might not
        raise CheckpointError(f"version {spec.version} has no config field")
    return AdamCheckpoint(
        spec.version,
        reader.config,
        reader.entries,
        reader.random_counter,
        reader.stored_schema,
        reader.fields,
    )


@names_the_file()
def read_adam(
    path: PathOrFile,
    schema: ParameterSchema,
    *,
    dtype: MomentDtype = MomentDtype.FLOAT32,
    expected_config: AdamConfig | None = None,
    sink: PayloadSink | None = None,
) -> AdamCheckpoint:
    """Read and fully check an Adam/AdamW checkpoint for the destination ``schema``.

    Args:
        path: file path, or a seekable binary file object (read from its position).
        schema: the destination's parameter schema; the file's must equal it slot by slot.
        dtype: the destination's moment dtype.
        expected_config: the destination's already bound config, if it has one; the file's
            must equal it bit for bit.
        sink: where payloads go (default: fresh numpy arrays).

    Returns:
        The checked :class:`AdamCheckpoint`.

    Raises:
        CheckpointError: a subclass naming the rule, field/slot, offset and values.
        OSError: from the file system.

    Example:
        >>> ckpt = read_adam("opt.tladam", schema)          # doctest: +SKIP
        >>> ckpt.entries[0].m.dtype
        dtype('float32')
    """
    try:
        dtype = MomentDtype(dtype)
    except ValueError:
        raise ConfigError(
            f"dtype must be float32 or float64, got {dtype!r}", field="dtype", actual=dtype
        ) from None
    return _read(path, schema, dtype, expected_config, sink, skip_payloads=False)


@names_the_file()
def scan_adam(path: PathOrFile) -> AdamCheckpoint:
    """Check an Adam checkpoint against its own stored schema, skipping payloads.

    Used by ``inspect``/``validate``: every rule that does not need a destination applies
    (the stored schema must be well-formed); moments are ``None``.
    """
    return _read(path, None, None, None, None, skip_payloads=True)


def select_version(schema: ParameterSchema, config: AdamConfig, random_counter: int | None) -> int:
    """The version FORMAT.md's selection rule picks: the lowest registered one that fits.

    (float64 → 5; a counter → 4; aliases → 3; else 2.)
    """
    for version in registry.known_versions(ADAM_MAGIC):
        spec = registry.lookup(ADAM_MAGIC, version)
        if spec is not None and _fits(layout_of(spec.struct), schema, config, random_counter):
            return version
    raise CheckpointError("no registered Adam version can hold this state")


def _fits(layout: Any, schema: ParameterSchema, config: AdamConfig, counter: int | None) -> bool:
    if config.dtype.numpy.str not in layout.moment_dtypes:
        return False
    if counter is None and layout.counter == "always":
        return False
    if counter is not None and layout.counter == "never":
        return False
    return layout.representatives or not schema.has_aliases


def _check_entry(slot: int, entry: Any, schema: ParameterSchema, dtype: np.dtype) -> None:
    step = getattr(entry, "step", None)
    integral = isinstance(step, (int, np.integer)) and not isinstance(step, bool)
    if not integral or not 1 <= step <= U64_MAX:
        raise EntryError(f"entry for slot {slot}: step must be an integer >= 1, got {step!r}")
    count = schema.element_count(slot)
    for name in ("m", "v"):
        array = getattr(entry, name, None)
        if not isinstance(array, np.ndarray) or array.dtype != dtype or array.size != count:
            got = (
                f"{array.dtype} with {array.size} elements"
                if isinstance(array, np.ndarray)
                else type(array).__name__
            )
            raise EntryError(
                f"entry for slot {slot}: {name} must be {dtype} with {count} elements, got {got}",
                field=f"entries[{slot}].{name}",
            )


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
    if not isinstance(schema, ParameterSchema) or not schema.is_well_formed():
        raise SchemaMismatchError("the parameter schema is not well-formed", actual=schema)
    if not isinstance(config, AdamConfig):
        raise ConfigError(f"config must be an AdamConfig, got {type(config).__name__}")
    config.validate()
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
    want = set(schema.representative_slots)
    have = set(entries.keys())
    if have != want:
        missing, extra = sorted(want - have), sorted(have - want)
        raise EntryError(
            f"entries must cover exactly the representative slots {sorted(want)}"
            + (f"; missing {missing}" if missing else "")
            + (f"; not representative {extra}" if extra else ""),
            actual=sorted(have),
            expected=sorted(want),
        )
    dtype = config.dtype.numpy
    # A plain dict is already in memory: check all of it before the first byte is written.
    eager = isinstance(entries, dict)
    if eager:
        for slot in schema.representative_slots:
            _check_entry(slot, entries[slot], schema, dtype)

    chosen = select_version(schema, config, random_counter) if version is None else version
    spec = registry.lookup(ADAM_MAGIC, chosen)
    if spec is None:
        raise CheckpointError(
            f"unknown Adam version {chosen}; registered: {registry.known_versions(ADAM_MAGIC)}"
        )
    if not _fits(layout_of(spec.struct), schema, config, random_counter):
        raise CheckpointError(f"version {chosen} cannot hold this state")

    values = {
        "dtype_tag": config.dtype.tag,
        "kind": int(config.kind),
        "config": {
            "beta1": config.beta1,
            "beta2": config.beta2,
            "epsilon": config.epsilon,
            "weight_decay": config.weight_decay,
        },
        "counter_flag": 0 if random_counter is None else 1,
        "random_counter": None if random_counter is None else int(random_counter),
        **schema_values(schema),
        "entry_count": schema.optimizer_state_count,
        "entries": _entry_records(entries, schema, dtype, checked=eager),
    }
    with output(path) as f:
        build_spec(f, spec.struct, values)
    return chosen
