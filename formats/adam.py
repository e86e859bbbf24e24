"""§3 of FORMAT.md: Adam / AdamW optimizer checkpoints, family ``TLADAMF``.

One module-level spec per version; each docstring-comment says what changed and why.
Field order is the byte order of the file.
"""

from __future__ import annotations

from dataclasses import dataclass

from construct import Array, Construct, Float64l, If, IfThenElse, Struct, this

from .framing import ADAM_MAGIC, framed
from .primitives import U64, Payload, Valid
from .schema import REPRESENTATIVES_BLOCK, SCHEMA_BLOCK

__all__ = [
    "KIND_TAGS",
    "DTYPE_TAGS",
    "HYPERPARAMETERS",
    "adam_entry",
    "ADAM_V2",
    "ADAM_V3",
    "ADAM_V4",
    "ADAM_V5",
    "ADAM_VERSIONS",
    "AdamLayout",
    "layout_of",
]

#: kind tag → name. Any other tag is an error; an unknown tag never defaults to Adam.
KIND_TAGS = {0: "adam", 1: "adamw"}
#: v5 moment dtype tag → numpy dtype of the payloads.
DTYPE_TAGS = {0: "<f4", 1: "<f8"}

KIND = Valid(U64, lambda v, _: v in KIND_TAGS, expected="0 (Adam) or 1 (AdamW)", category="config")
DTYPE_TAG = Valid(
    U64, lambda v, _: v in DTYPE_TAGS, expected="0 (float32) or 1 (float64)", category="config"
)
COUNTER_FLAG = Valid(U64, lambda v, _: v in (0, 1), expected="0 or 1", category="config")

#: The four moment-defining floats, stored as their exact binary64 bits.
HYPERPARAMETERS = Struct(
    "beta1" / Float64l * "f64bits",
    "beta2" / Float64l * "f64bits",
    "epsilon" / Float64l * "f64bits",
    "weight_decay" / Float64l * "f64bits",
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


_HEADER = ["kind" / KIND * "0 = Adam, 1 = AdamW", "config" / HYPERPARAMETERS]

#: v2: float32 moments, no alias map. Cannot describe tied weights.
ADAM_V2 = Struct(
    *framed(ADAM_MAGIC, 2),
    *_HEADER,
    "schema" / SCHEMA_BLOCK,
    *_entries("<f4"),
)

#: v3: adds the representatives block so tied weights share one moment history.
ADAM_V3 = Struct(
    *framed(ADAM_MAGIC, 3),
    *_HEADER,
    "schema" / SCHEMA_BLOCK,
    "representatives" / REPRESENTATIVES_BLOCK * "0 frozen, representative + 1 otherwise",
    *_entries("<f4"),
)

#: v4: adds the random counter, so stochastic training resumes exactly.
ADAM_V4 = Struct(
    *framed(ADAM_MAGIC, 4),
    *_HEADER,
    "random_counter" / U64 * "random-number counter",
    "schema" / SCHEMA_BLOCK,
    "representatives" / REPRESENTATIVES_BLOCK * "0 frozen, representative + 1 otherwise",
    *_entries("<f4"),
)

#: v5: the moment dtype becomes a field (float64 moments) and the counter optional.
ADAM_V5 = Struct(
    *framed(ADAM_MAGIC, 5),
    "dtype_tag" / DTYPE_TAG * "0 = float32, 1 = float64",
    *_HEADER,
    "counter_flag" / COUNTER_FLAG * "0 = absent, 1 = present",
    "random_counter" / If(this.counter_flag == 1, U64) * "random-number counter, if flagged",
    "schema" / SCHEMA_BLOCK,
    "representatives" / REPRESENTATIVES_BLOCK * "0 frozen, representative + 1 otherwise",
    *_entries(lambda ctx: DTYPE_TAGS[ctx._root.dtype_tag]),
)

ADAM_VERSIONS = {2: ADAM_V2, 3: ADAM_V3, 4: ADAM_V4, 5: ADAM_V5}


@dataclass(frozen=True)
class AdamLayout:
    """What a version spec can hold, read off its fields (not declared a second time).

    Attributes:
        moment_dtypes: payload dtypes the version can store.
        counter: ``"never"``, ``"always"`` or ``"optional"``.
        representatives: whether the version stores an alias map.
    """

    moment_dtypes: frozenset[str]
    counter: str
    representatives: bool


def _field(spec: Struct, name: str) -> Construct | None:
    for sc in spec.subcons:
        if sc.name == name:
            return sc
    return None


def _unwrap(sc: Construct) -> Construct:
    # Renamed and doc wrappers hold the real construct in `.subcon`.
    while type(sc).__name__ == "Renamed":
        sc = sc.subcon
    return sc


def layout_of(spec: Struct) -> AdamLayout:
    """Derive an Adam version's capabilities from its spec's fields."""
    counter_field = _field(spec, "random_counter")
    if counter_field is None:
        counter = "never"
    elif isinstance(_unwrap(counter_field), IfThenElse):
        counter = "optional"
    else:
        counter = "always"
    dtypes = frozenset(DTYPE_TAGS.values()) if _field(spec, "dtype_tag") else frozenset({"<f4"})
    return AdamLayout(
        moment_dtypes=dtypes,
        counter=counter,
        representatives=_field(spec, "representatives") is not None,
    )
