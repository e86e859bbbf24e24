"""Adam / AdamW optimizer checkpoints (``TLADAMF``), read and written through the specs.

Reading follows FORMAT.md §3's rules in order, each the moment its field is decoded, so a
hostile header is rejected before anything it announces is allocated. Nothing is returned
until the whole file, trailing bytes included, has been checked.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from construct import Container

from ...formats import registry
from ...formats.adam import (
    CONFIG,
    COUNTER_FLAG,
    DTYPE_TAG,
    ENTRIES,
    ENTRY_COUNT,
    KIND,
    RANDOM_COUNTER,
    REPRESENTATIVES,
    SCHEMA,
    SLOTS,
    VERSION,
    AdamKind,
    layout_of,
)
from ...formats.framing import ADAM_MAGIC, FRAMING
from ..errors import (
    CheckpointError,
    ConfigError,
    EntryError,
    SchemaMismatchError,
    differs,
    names_the_file,
)
from ..fileio.source import FileStamp, PathOrFile
from ..paths import Path, field_name
from ..spec.batches import RecordBatch
from ..spec.framed import read_framed
from ..values.config import AdamConfig, MomentDtype
from ..values.payload_sinks import PayloadSink
from ..values.schema import ParameterSchema
from .adam_types import AdamCheckpoint, AdamEntry
from .optimizer_reader import OptimizerReader

__all__ = ["read_adam", "validate_adam", "scan_adam"]


#: Top-level fields the reader knows; any other a version defines is reported by name.
_KNOWN = frozenset(
    [sc.name for sc in FRAMING.subcons]
    + [p[0] for p in (DTYPE_TAG, KIND, CONFIG, COUNTER_FLAG, RANDOM_COUNTER, ENTRY_COUNT)]
    + [SCHEMA[0], REPRESENTATIVES[0], ENTRIES[0]]
)
#: Path length of an entry record, ``(*ENTRIES, i)``.
_ENTRY_DEPTH = len(ENTRIES) + 1


class _AdamReader(OptimizerReader):
    """Checks each field against the destination as it is decoded (FORMAT.md §3 order)."""

    entries_field = ENTRIES[0]

    def __init__(
        self,
        spec: registry.FileSpec,
        schema: ParameterSchema | None,
        dtype: MomentDtype | None,
        expected_config: AdamConfig | None,
        sink: PayloadSink | None,
        skip_payloads: bool,
        adopt_config: bool = False,
    ):
        self.layout = layout_of(spec.struct)
        self.dtype = dtype
        self.expected_config = expected_config
        self.adopt_config = adopt_config
        self.file_dtype = MomentDtype.FLOAT32
        self.config: AdamConfig | None = None
        self.entries: dict[int, AdamEntry] = {}
        self.fields: dict[str, Any] = {}
        self.init_reader(spec, schema, sink, skip_payloads)

    def header_field(self, path: Path, value: Any, offset: int, ctx: Container) -> None:
        head = path[0]
        if len(path) > 1:
            return  # inside a header struct (config): judged whole, as ``config``
        elif path == VERSION:
            if (
                self.expected is not None
                and self.expected.has_aliases
                and not self.layout.representatives
            ):
                raise SchemaMismatchError(
                    f"version {value} cannot restore shared parameter histories: the"
                    " destination has tied parameters",
                    offset=offset,
                    field=field_name(VERSION),
                    actual=value,
                )
        elif path == DTYPE_TAG:
            self.file_dtype = MomentDtype.from_tag(value)
            self._check_dtype(offset)
        elif path == CONFIG:
            if DTYPE_TAG[0] not in ctx:
                self._check_dtype(offset)
            self._check_config(ctx, offset)
        elif path == RANDOM_COUNTER:
            self.random_counter = value
        elif path == ENTRY_COUNT:
            want = self.schema.optimizer_state_count
            if value != want:
                message = f"entry_count is {value}, the schema has {want} representative slot(s)"
                raise differs(EntryError, message, offset, path, value, want)
        elif head not in _KNOWN:
            self.fields[head] = value

    def batches(self, path: Path) -> bool:
        if path == SLOTS:
            return True
        return path == ENTRIES and self.skip_payloads

    def on_records(self, path: Path, batch: RecordBatch) -> bool:
        if path == SLOTS:
            return self.schema_records(batch)
        # Every rule entry_field applies, for the whole batch; any break: walk it instead.
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
        sizes = self.payload_bytes
        for slot, step, nbytes in zip(ids, steps, batch.payload_bytes()):
            entries[slot] = AdamEntry(step, None, None)
            sizes[slot] = nbytes
        for name, _at, _count, _dtype in batch.payloads:
            places = self.payload_offsets
            for slot, offset in zip(ids, batch.payload_offsets(name).tolist()):
                places[(int(slot), name)] = offset
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
        expected = self.expected_config
        if expected is not None and self.dtype is None:  # either dtype: compare in the file's
            expected = dataclasses.replace(expected, dtype=config.dtype)
        if expected is not None and self.adopt_config:
            # The file's floats are adopted (a set restore installs them); the kind is what
            # the optimizer is, and stays checked.
            expected = dataclasses.replace(
                expected,
                beta1=config.beta1,
                beta2=config.beta2,
                epsilon=config.epsilon,
                weight_decay=config.weight_decay,
            )
        if expected is not None and not config.same_bits(expected):
            diffs = "; ".join(config.differences(expected))
            raise ConfigError(
                f"config differs from the destination's (file vs expected): {diffs}",
                offset=offset,
                field="config",
            )
        self.config = config

    def entry_field(self, path: Path, value: Any, offset: int, ctx: Container) -> None:
        # Called for the paths under ENTRIES only: their length says which they are.
        depth = len(path)
        if depth == _ENTRY_DEPTH - 1:  # the whole array: records were kept one by one
            return
        if depth == _ENTRY_DEPTH:  # a whole record: keep it
            self.entries[value.id] = AdamEntry(int(value.step), value.m, value.v)
            return
        name = path[-1]
        schema = self.schema
        if name == "id":
            fresh = value < len(schema) and value not in self.entries
            if not (fresh and schema.is_representative(value)):
                self._bad_id(value, offset, field_name(path))
        elif name == "step":
            if value == 0:
                raise EntryError(
                    f"entry for slot {ctx.id} has step 0",
                    offset=offset,
                    field=field_name(path),
                    actual=0,
                )
        elif name == "count":
            self.check_entry_count(path, value, offset, ctx)

    def _bad_id(self, value: int, offset: int, where: str) -> None:
        """Raise for an entry id that is out of range, repeated, or not a representative's."""
        schema = self.schema
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


def _read(path: PathOrFile, *args: Any, **kwargs: Any) -> tuple[AdamCheckpoint, _AdamReader]:
    """Read the file with an :class:`_AdamReader` made of ``args`` and ``kwargs`` (its
    arguments after the spec)."""
    reader, stamp = read_framed(path, ADAM_MAGIC, lambda spec: _AdamReader(spec, *args, **kwargs))
    reader.stamp = stamp  # for the reads by position that may follow (validate_adam)
    if reader.config is None:  # every registered Adam spec has a config; a toy might not
        raise CheckpointError(f"version {reader.version} has no config field")
    checkpoint = AdamCheckpoint(
        reader.version,
        reader.config,
        reader.entries,
        reader.random_counter,
        reader.stored_schema,
        reader.fields,
    )
    return checkpoint, reader


@names_the_file()
def read_adam(
    path: PathOrFile,
    schema: ParameterSchema,
    *,
    dtype: MomentDtype | None = MomentDtype.FLOAT32,
    expected_config: AdamConfig | None = None,
    sink: PayloadSink | None = None,
    adopt_config: bool = False,
) -> AdamCheckpoint:
    """Read and fully check an Adam/AdamW checkpoint for the destination ``schema``.

    Args:
        path: file path, or a seekable binary file object (read from its position).
        schema: the destination's parameter schema; the file's must equal it slot by slot.
        dtype: the destination's moment dtype (``None``: either).
        expected_config: the destination's already bound config, if it has one; the file's
            must equal it bit for bit.
        sink: where payloads go (default: fresh numpy arrays).
        adopt_config: the file's betas, epsilon and weight decay are taken as they are
            (a set restore installs them in the optimizer): only ``expected_config``'s kind
            and dtype are checked.

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
    if dtype is not None:
        try:
            dtype = MomentDtype(dtype)
        except ValueError:
            raise ConfigError(
                f"dtype must be float32 or float64, got {dtype!r}", field="dtype", actual=dtype
            ) from None
    return _read(
        path, schema, dtype, expected_config, sink, skip_payloads=False, adopt_config=adopt_config
    )[0]


@names_the_file()
def validate_adam(
    path: PathOrFile,
    schema: ParameterSchema,
    *,
    dtype: MomentDtype = MomentDtype.FLOAT32,
    expected_config: AdamConfig | None = None,
    adopt_config: bool = False,
) -> tuple[AdamCheckpoint, dict[tuple[int, str], int], FileStamp]:
    """:func:`read_adam`'s checks without reading a moment: the first pass of a load whose
    payloads are read by position afterwards (each rank of a sharded load its own part).

    Args:
        adopt_config: as :func:`read_adam`'s.

    Returns:
        The checked file (moments ``None``), each moment payload's offset by ``(slot,
        "m" | "v")``, and the file's stamp from before its first byte was read.

    Raises:
        CheckpointError: as :func:`read_adam`.
        OSError: from the file system.
    """
    dtype = MomentDtype(dtype)
    checkpoint, reader = _read(
        path, schema, dtype, expected_config, None, skip_payloads=True, adopt_config=adopt_config
    )
    return checkpoint, reader.payload_offsets, reader.stamp


@names_the_file()
def scan_adam(path: PathOrFile) -> AdamCheckpoint:
    """Check an Adam checkpoint against its own stored schema, skipping payloads.

    Used by ``inspect``/``validate``: every rule that does not need a destination applies
    (the stored schema must be well-formed); moments are ``None``.
    """
    return _read(path, None, None, None, None, skip_payloads=True)[0]


def scan_adam_sizes(path: PathOrFile) -> tuple[AdamCheckpoint, dict[int, int]]:
    """:func:`scan_adam`, and the bytes of each entry's payloads as the file's spec sizes
    them (slot id → bytes), for a description of the file."""
    checkpoint, reader = _read(path, None, None, None, None, skip_payloads=True)
    return checkpoint, reader.payload_bytes
