"""§3 of FORMAT.md: Adam / AdamW optimizer checkpoints, family ``TLADAMF``.

One module-level spec per version; each docstring-comment says what changed and why.
Field order is the byte order of the file.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from construct import Array, Construct, If, IfThenElse, Struct, this

from .framing import ADAM_MAGIC, VERSION, framed
from .primitives import F64, U64, Payload, TextEnum, Valid, field_path, flag, unwrap
from .schema import REPRESENTATIVES, SCHEMA, SLOT_COUNT, SLOTS, schema_fields

__all__ = [
    "AdamKind",
    "DtypeTag",
    "KIND_TAGS",
    "DTYPE_TAGS",
    "HYPERPARAMETERS",
    "OPTIONAL_COUNTER",
    "kind_tag",
    "adam_entry",
    "ADAM_V2",
    "ADAM_V3",
    "ADAM_V4",
    "ADAM_V5",
    "ADAM_VERSIONS",
    "CounterPresence",
    "AdamLayout",
    "layout_of",
    "VERSION",
    "DTYPE_TAG",
    "KIND",
    "CONFIG",
    "COUNTER_FLAG",
    "RANDOM_COUNTER",
    "SCHEMA",
    "SLOT_COUNT",
    "SLOTS",
    "REPRESENTATIVES",
    "ENTRY_COUNT",
    "ENTRIES",
]


class AdamKind(enum.IntEnum):
    """The update rule; the value is the file's kind tag."""

    ADAM = 0
    ADAMW = 1


class DtypeTag(enum.IntEnum):
    """v5's moment dtype tag."""

    FLOAT32 = 0
    FLOAT64 = 1


#: kind tag → name. Any other tag is an error; an unknown tag never defaults to Adam.
KIND_TAGS = {int(kind): kind.name.lower() for kind in AdamKind}
#: v5 moment dtype tag → numpy dtype of the payloads; v2 to v4 store the first.
DTYPE_TAGS = {int(DtypeTag.FLOAT32): "<f4", int(DtypeTag.FLOAT64): "<f8"}


def kind_tag() -> Valid:
    """The u64 kind tag of an update rule: a key of :data:`KIND_TAGS` (``TLADAMF``'s
    ``kind``, and each ``TLCKOPT`` param group's)."""
    return Valid(
        U64, lambda v, _: v in KIND_TAGS, expected="0 (Adam) or 1 (AdamW)", category="config"
    )


_DTYPE_TAG = Valid(
    U64, lambda v, _: v in DTYPE_TAGS, expected="0 (float32) or 1 (float64)", category="config"
)

#: v5's optional random counter: a flag, then the counter only where the flag is 1 (the
#: ``TLCKOPT`` family stores it the same way).
OPTIONAL_COUNTER = (
    "counter_flag" / flag("config") * "0 = absent, 1 = present",
    "random_counter" / If(this.counter_flag == 1, U64) * "random-number counter, if flagged",
)

#: The four moment-defining floats, stored as their exact binary64 bits.
HYPERPARAMETERS = Struct(
    "beta1" / F64 * "f64bits",
    "beta2" / F64 * "f64bits",
    "epsilon" / F64 * "f64bits",
    "weight_decay" / F64 * "f64bits",
)


def adam_entry(dtype) -> Struct:
    """One moment entry: slot id, Adam step, element count, then the m and v payloads."""
    return Struct(
        "id" / U64 * "parameter slot",
        "step" / U64 * "Adam step counter t of that slot",
        "count" / U64 * "element count",
        "m" / Payload(this.count, dtype) * "first moment",
        "v" / Payload(this.count, dtype) * "second moment",
    )


def _entries(dtype) -> list:
    return [
        "entry_count" / U64 * "must equal the schema's optimizer_state_count",
        "entries" / Array(this.entry_count, adam_entry(dtype)) * "in increasing id when written",
    ]


_HEADER = ["kind" / kind_tag() * "0 = Adam, 1 = AdamW", "config" / HYPERPARAMETERS]

#: v2: float32 moments, no alias map. Cannot describe tied weights.
ADAM_V2 = Struct(
    *framed(ADAM_MAGIC, 2),
    *_HEADER,
    *schema_fields(representatives=False),
    *_entries(DTYPE_TAGS[DtypeTag.FLOAT32]),
)

#: v3: adds the representatives block so tied weights share one moment history.
ADAM_V3 = Struct(
    *framed(ADAM_MAGIC, 3),
    *_HEADER,
    *schema_fields(),
    *_entries(DTYPE_TAGS[DtypeTag.FLOAT32]),
)

#: v4: adds the random counter, so stochastic training resumes exactly.
ADAM_V4 = Struct(
    *framed(ADAM_MAGIC, 4),
    *_HEADER,
    "random_counter" / U64 * "random-number counter",
    *schema_fields(),
    *_entries(DTYPE_TAGS[DtypeTag.FLOAT32]),
)

#: v5: the moment dtype becomes a field (float64 moments) and the counter optional.
ADAM_V5 = Struct(
    *framed(ADAM_MAGIC, 5),
    "dtype_tag" / _DTYPE_TAG * "0 = float32, 1 = float64",
    *_HEADER,
    *OPTIONAL_COUNTER,
    *schema_fields(),
    *_entries(lambda ctx: DTYPE_TAGS[ctx._root.dtype_tag]),
)

ADAM_VERSIONS = {2: ADAM_V2, 3: ADAM_V3, 4: ADAM_V4, 5: ADAM_V5}

# Spec paths readers act on (a reader dispatches on these, never on a path's depth); the
# version's is formats.framing's, those of the schema blocks (SCHEMA, SLOT_COUNT, SLOTS,
# REPRESENTATIVES) formats.schema's. COUNTER_FLAG and RANDOM_COUNTER are OPTIONAL_COUNTER's.
DTYPE_TAG = field_path(ADAM_V5, "dtype_tag")
KIND = field_path(ADAM_V2, "kind")
CONFIG = field_path(ADAM_V2, "config")
COUNTER_FLAG = field_path(ADAM_V5, "counter_flag")
RANDOM_COUNTER = field_path(ADAM_V4, "random_counter")
ENTRY_COUNT = field_path(ADAM_V2, "entry_count")
ENTRIES = field_path(ADAM_V2, "entries")


class CounterPresence(TextEnum):
    """Whether a version stores the random counter."""

    NEVER = "never"
    ALWAYS = "always"
    OPTIONAL = "optional"


@dataclass(frozen=True)
class AdamLayout:
    """What a version spec can hold, read off its fields (not declared a second time).

    Attributes:
        moment_dtypes: payload dtypes the version can store.
        counter: whether the version stores the random counter.
        representatives: whether the version stores an alias map.
    """

    moment_dtypes: frozenset[str]
    counter: CounterPresence
    representatives: bool


def _field(spec: Struct, path: tuple[str, ...]) -> Construct | None:
    (name,) = path
    for sc in spec.subcons:
        if sc.name == name:
            return sc
    return None


def layout_of(spec: Struct) -> AdamLayout:
    """Derive an Adam version's capabilities from its spec's fields."""
    counter_field = _field(spec, RANDOM_COUNTER)
    if counter_field is None:
        counter = CounterPresence.NEVER
    elif isinstance(unwrap(counter_field), IfThenElse):
        counter = CounterPresence.OPTIONAL
    else:
        counter = CounterPresence.ALWAYS
    if _field(spec, DTYPE_TAG) is not None:
        dtypes = frozenset(DTYPE_TAGS.values())
    else:
        dtypes = frozenset({DTYPE_TAGS[DtypeTag.FLOAT32]})
    return AdamLayout(
        moment_dtypes=dtypes,
        counter=counter,
        representatives=_field(spec, REPRESENTATIVES) is not None,
    )
