"""Adam/AdamW state that TorchLean's versions cannot hold, in tlckpt's own family (not TorchLean's).

This family is tlckpt's, not TorchLean's: TorchLean neither writes nor reads it, and its magic
is not ``TLADAMF``, so no TorchLean reader mistakes one of its files for its own.
``save_optimizer`` writes it only when an optimizer's state does not fit any ``TLADAMF``
version: param groups whose kind, betas, eps or weight decay differ, ``amsgrad``,
``maximize``, ``torch.optim.Adam`` with (L2) weight decay, moments of another dtype than
float32/float64 or of several dtypes, trainable parameters without state yet, frozen
parameters with state. Whenever the state fits, the file is TorchLean's version, byte for
byte as TorchLean writes it.

A file holds what TorchLean's version 5 holds (the optional random counter, TorchLean's schema
block and representatives block, unchanged) and in addition: the table of param groups, with
every hyperparameter that decides what the moments mean as exact binary64 bits (like
TorchLean's config) and the learning rate at the time of the save; each slot's group; per
entry its moment dtype (float32, float64, bfloat16 as its uint16 storage words, float16) and,
where its group has amsgrad, ``max_exp_avg_sq``. Entries exist only for slots that have state,
in increasing slot order: a trainable slot without state yet (a parameter that has never had
a gradient in an optimizer step) simply has no entry. A frozen parameter that kept its state
(torch keeps it when a layer is frozen, as gradual unfreezing does) has an entry and a group
from version 2 on: TorchLean's schema forbids a frozen slot owning state, so ``save_optimizer``
writes this family for it. Execution settings (``foreach``, ``fused``, ``capturable``,
``differentiable``) are not stored: a load installs the state in the form the live
optimizer's own settings expect.

How versions evolve: a new version is a new named spec in this module, registered beside the
others (``OPTIMIZER_VERSIONS``, ``formats/registry.py``). Readers keep every registered
version, so every file ever written stays readable; the writer writes ``WRITTEN_VERSION``,
or ``FROZEN_STATE_VERSION`` when a frozen slot has state (the only thing version 1 cannot
hold), so a file version 1 holds is written as version 1, byte for byte.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from construct import Array, If, Struct, this

from .adam import COUNTER_FLAG, OPTIONAL_COUNTER, RANDOM_COUNTER, kind_tag
from .framing import OPTIMIZER_MAGIC, VERSION, framed
from .primitives import F64, U64, Payload, Valid, field_path, flag
from .schema import REPRESENTATIVES, SCHEMA, SLOTS, schema_fields
from .state_bits import encoding_by_name

__all__ = [
    "MomentTag",
    "MOMENT_DTYPES",
    "MOMENT_ARRAYS",
    "GroupFlag",
    "PARAM_GROUP",
    "OPTIMIZER_ENTRY",
    "OPTIMIZER_V1",
    "OPTIMIZER_V2",
    "OPTIMIZER_VERSIONS",
    "WRITTEN_VERSION",
    "FROZEN_STATE_VERSION",
    "SLOT_GROUPS_V1",
    "SLOT_GROUPS_V2",
    "OptimizerLayout",
    "layout_of",
    "GROUP_FLOATS",
    "GROUP_FLAGS",
    "MOMENTS",
    "VERSION",
    "COUNTER_FLAG",
    "RANDOM_COUNTER",
    "GROUP_COUNT",
    "GROUPS",
    "SCHEMA",
    "SLOTS",
    "REPRESENTATIVES",
    "SLOT_GROUPS",
    "ENTRY_COUNT",
    "ENTRIES",
]


class MomentTag(enum.IntEnum):
    """An entry's moment dtype tag (0 and 1 as TorchLean's v5 ``dtype_tag``)."""

    FLOAT32 = 0
    FLOAT64 = 1
    BFLOAT16 = 2
    FLOAT16 = 3


#: moment dtype tag → the dtype's name, which is also its exact-bits encoding's short name.
MOMENT_DTYPES = {int(tag): tag.name.lower() for tag in MomentTag}
#: moment dtype tag → numpy dtype of the payloads: the encoding's array dtype (bfloat16 as its
#: uint16 storage words, the others native).
MOMENT_ARRAYS = {tag: encoding_by_name(name).array_dtype for tag, name in MOMENT_DTYPES.items()}


def _beta(value: float, _: Any) -> bool:
    return 0.0 <= value < 1.0  # NaN fails


def _non_negative(value: float, _: Any) -> bool:
    return value >= 0.0  # NaN fails; -0.0 and +inf pass, as torch.optim.Adam accepts them


#: One param group: every hyperparameter that decides what its moments mean, and its learning
#: rate. The checks are torch.optim.Adam's own rules, so any group torch accepts is stored.
PARAM_GROUP = Struct(
    "kind"
    / kind_tag()
    * "0 = Adam (weight decay added to the gradient), 1 = AdamW (decoupled weight decay)",
    "beta1"
    / Valid(F64, _beta, expected="0 <= beta1 < 1", category="config")
    * "first-moment decay, binary64 bits",
    "beta2"
    / Valid(F64, _beta, expected="0 <= beta2 < 1", category="config")
    * "second-moment decay, binary64 bits",
    "epsilon"
    / Valid(F64, _non_negative, expected=">= 0 (not NaN)", category="config")
    * "eps, binary64 bits",
    "weight_decay"
    / Valid(F64, _non_negative, expected=">= 0 (not NaN)", category="config")
    * "weight decay, binary64 bits",
    "lr"
    / Valid(F64, _non_negative, expected=">= 0 (not NaN)", category="config")
    * "learning rate when saved, binary64 bits (a load keeps the live optimizer's)",
    "amsgrad" / flag("config") * "1: the group's entries hold max_exp_avg_sq",
    "maximize" / flag("config") * "1: the group maximises its objective (steps along the gradient)",
)

#: The group fields that are binary64 values, and those that are 0/1 flags, in file order.
GROUP_FLOATS = ("beta1", "beta2", "epsilon", "weight_decay", "lr")
GROUP_FLAGS = ("amsgrad", "maximize")


class GroupFlag:
    """A spec condition: whether the param group of the record's slot has ``flag`` set.

    It reads ``groups[slot_groups[id] - 1].<flag>``; it is false where that names no group
    (the record's ``id`` check has rejected such a record before the condition is asked).

    Args:
        flag: a field of :data:`PARAM_GROUP` that is 0 or 1.
    """

    def __init__(self, flag: str):
        self.flag = flag

    def __call__(self, ctx: Any) -> bool:
        try:
            root = ctx._root
            tag = root.slot_groups[ctx.id]
            return tag > 0 and root.groups[tag - 1][self.flag] == 1
        except (AttributeError, IndexError, KeyError, TypeError):
            return False

    def __repr__(self) -> str:
        return f"groups[slot_groups[id] - 1].{self.flag} == 1"


def _has_group(value: int, ctx: Any) -> bool:
    try:
        tags = ctx._root.slot_groups
        return value < len(tags) and tags[value] != 0
    except (AttributeError, TypeError):
        return False


def _moment_array(ctx: Any) -> str:
    return MOMENT_ARRAYS[ctx.dtype_tag]


#: One slot's state. ``count`` is checked against the slot's shape by the reader.
OPTIMIZER_ENTRY = Struct(
    "id"
    / Valid(
        U64,
        _has_group,
        expected="a slot with a param group (slot_groups[id] > 0)",
        category="entry",
    )
    * "parameter slot (a representative slot; from v2 also a frozen slot with a group),"
    " increasing from entry to entry",
    "step"
    / Valid(U64, lambda v, _: v >= 1, expected=">= 1", category="entry")
    * "Adam step counter t of that slot",
    "dtype_tag"
    / Valid(
        U64,
        lambda v, _: v in MOMENT_DTYPES,
        expected="0 (float32), 1 (float64), 2 (bfloat16) or 3 (float16)",
        category="config",
    )
    * "moment dtype: the parameter's",
    "count" / U64 * "element count (the slot's)",
    "m" / Payload(this.count, _moment_array) * "first moment (exp_avg)",
    "v" / Payload(this.count, _moment_array) * "second moment (exp_avg_sq)",
    "max_exp_avg_sq"
    / If(GroupFlag("amsgrad"), Payload(this.count, _moment_array))
    * "amsgrad's running maximum of v: present exactly when the slot's group has amsgrad",
)

#: The moment payloads of an entry, in file order.
MOMENTS = ("m", "v", "max_exp_avg_sq")

_HEADER = (
    *OPTIONAL_COUNTER,
    "group_count" / U64 * "number of param groups: the optimizer's param_groups, in order",
    "groups" / Array(this.group_count, PARAM_GROUP) * "one record per param group",
    *schema_fields(),
)

#: v1's slot groups: only representative slots have a group (and so an entry).
SLOT_GROUPS_V1 = (
    "slot_groups"
    / Array(this.schema.slot_count, U64)
    * "per slot: g + 1 for a representative slot in param group g, 0 for the others"
)
#: v2's slot groups: a frozen slot that has state has its group too.
SLOT_GROUPS_V2 = (
    "slot_groups"
    / Array(this.schema.slot_count, U64)
    * "per slot: g + 1 for a representative slot in param group g and for a frozen slot"
    " that has state (an entry) in param group g; 0 for the others (aliases, frozen slots"
    " without state)"
)


def _entries(owners: str) -> tuple:
    return (
        "entry_count" / U64 * f"slots that have state: at most {owners}",
        "entries"
        / Array(this.entry_count, OPTIMIZER_ENTRY)
        * "in increasing id; a slot without state has no entry",
    )


#: v1: TorchLean v5's content plus param groups, each slot's group, per-entry moment dtypes,
#: amsgrad's ``max_exp_avg_sq``, and no entry for a slot without state.
OPTIMIZER_V1 = Struct(
    *framed(OPTIMIZER_MAGIC, 1),
    *_HEADER,
    SLOT_GROUPS_V1,
    *_entries("the representative slots"),
)

#: v2: v1's layout, and a frozen slot may keep state (an entry, under its param group):
#: torch keeps a parameter's moments when it is frozen (gradual unfreezing) and uses them again
#: once it is unfrozen; TorchLean's schema forbids a frozen slot owning state. Written only
#: when a frozen slot has state, so every other file stays version 1, byte for byte.
OPTIMIZER_V2 = Struct(
    *framed(OPTIMIZER_MAGIC, 2),
    *_HEADER,
    SLOT_GROUPS_V2,
    *_entries("the representative slots and the frozen slots with a group"),
)

OPTIMIZER_VERSIONS = {1: OPTIMIZER_V1, 2: OPTIMIZER_V2}
#: The version writers produce when no frozen slot has state.
WRITTEN_VERSION = 1
#: The version writers produce when a frozen slot has state.
FROZEN_STATE_VERSION = 2


@dataclass(frozen=True)
class OptimizerLayout:
    """What a version can hold, read off its fields (not declared a second time).

    Attributes:
        frozen_state: whether a frozen slot may have a param group and an entry.
    """

    frozen_state: bool


def layout_of(spec: Struct) -> OptimizerLayout:
    """Derive a ``TLCKOPT`` version's capabilities from its spec's fields."""
    slot_groups = [sc for sc in spec.subcons if sc.name == "slot_groups"]
    return OptimizerLayout(frozen_state=bool(slot_groups) and slot_groups[0] is SLOT_GROUPS_V2)


# Spec paths readers act on. The schema blocks are TorchLean's, under TorchLean's names
# (schema_fields), so their paths (SCHEMA, SLOTS, REPRESENTATIVES) are formats.schema's and
# the schema check shared with TLADAMF applies to them unchanged; VERSION is the framing's,
# COUNTER_FLAG and RANDOM_COUNTER those of TLADAMF v5's OPTIONAL_COUNTER, stored here too.
GROUP_COUNT = field_path(OPTIMIZER_V1, "group_count")
GROUPS = field_path(OPTIMIZER_V1, "groups")
SLOT_GROUPS = field_path(OPTIMIZER_V1, "slot_groups")
ENTRY_COUNT = field_path(OPTIMIZER_V1, "entry_count")
ENTRIES = field_path(OPTIMIZER_V1, "entries")
for _name in MOMENTS:
    field_path(OPTIMIZER_V1, "entries", _name)
for _path in (GROUP_COUNT, GROUPS, SLOT_GROUPS, ENTRY_COUNT, ENTRIES):
    # Every version stores these fields under the same paths: the readers dispatch on them.
    field_path(OPTIMIZER_V2, *_path)
