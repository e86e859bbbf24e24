"""§2 of FORMAT.md: the parameter-schema block and the representatives block.

The schema lists the destination's parameter slots in module order. Every Adam version
stores it; versions from 3 on add one representative tag per slot (0 = frozen,
``representative + 1`` otherwise) so that tied weights share one moment history.
"""

from __future__ import annotations

from construct import Array, Struct, this

from .primitives import U64, Valid, product

__all__ = ["SHAPE_FIELDS", "SLOT", "SCHEMA_BLOCK", "REPRESENTATIVES_BLOCK"]

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
    "requires_grad"
    / Valid(U64, lambda value, ctx: value in (0, 1), expected="0 or 1", category="schema")
    * "1 if the slot is trainable, else 0",
)

SCHEMA_BLOCK = Struct(
    "slot_count" / U64 * "number of parameter slots",
    "slots" / Array(this.slot_count, SLOT) * "one record per slot, in module order",
)

#: One tag per slot of the schema block that precedes it: 0 frozen, ``rep + 1`` otherwise.
REPRESENTATIVES_BLOCK = Array(this.schema.slot_count, U64)
