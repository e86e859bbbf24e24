"""§2 of FORMAT.md: the parameter-schema block and the representatives block.

The schema lists the destination's parameter slots in module order. Every Adam version
stores it; versions from 3 on add one representative tag per slot (0 = frozen,
``representative + 1`` otherwise) so that tied weights share one moment history.
"""

from __future__ import annotations

from construct import Array, Construct, Struct, this

from .primitives import U64, Valid, field_path, flag, product

__all__ = [
    "SHAPE_FIELDS",
    "SLOT",
    "SCHEMA_BLOCK",
    "REPRESENTATIVES_BLOCK",
    "schema_fields",
    "SCHEMA",
    "SLOT_COUNT",
    "SLOTS",
    "REPRESENTATIVES",
]

#: A tensor's shape as every record that carries one stores it (a schema slot, a ``TLSF32B``
#: tensor): rank, the dims, and their product, checked.
SHAPE_FIELDS = (
    "rank" / U64 * "number of dims (0 for a scalar)",
    "dims" / Array(this.rank, U64) * "u64 per dim",
    "element_count"
    / Valid(
        U64,
        lambda value, ctx: value == product(ctx.dims),
        expected="the product of the dims",
        category="schema",
    )
    * "product of dims (1 for rank 0)",
)

SLOT = Struct(
    *SHAPE_FIELDS,
    "requires_grad" / flag("schema") * "1 if the slot is trainable, else 0",
)

SCHEMA_BLOCK = Struct(
    "slot_count" / U64 * "number of parameter slots",
    "slots" / Array(this.slot_count, SLOT) * "one record per slot, in module order",
)

#: One tag per slot of the schema block that precedes it: 0 frozen, ``rep + 1`` otherwise.
REPRESENTATIVES_BLOCK = Array(this.schema.slot_count, U64)


def schema_fields(representatives: bool = True) -> tuple[Construct, ...]:
    """The top-level ``schema`` field, and the ``representatives`` field after it unless
    ``representatives`` is false, as every optimizer file stores them (``TLADAMF`` v2 has no
    alias map; its later versions and ``TLCKOPT`` have one).
    """
    schema = "schema" / SCHEMA_BLOCK
    if not representatives:
        return (schema,)
    return (
        schema,
        "representatives" / REPRESENTATIVES_BLOCK * "0 frozen, representative + 1 otherwise",
    )


# Spec paths of the two blocks, the same in every file that stores them (at its top level,
# through schema_fields): the schema check the optimizer families share dispatches on these.
_STORED = Struct(*schema_fields())
SCHEMA = field_path(_STORED, "schema")
SLOT_COUNT = field_path(_STORED, "schema", "slot_count")
SLOTS = field_path(_STORED, "schema", "slots")
REPRESENTATIVES = field_path(_STORED, "representatives")
