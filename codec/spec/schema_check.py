"""Checking a stored schema (or a tensor's shape) against the destination, field by field."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from construct import Container

from ...formats.primitives import U64_SIZE, product
from ...formats.schema import REPRESENTATIVES, SCHEMA, SLOT_COUNT, SLOTS
from ..errors import SchemaMismatchError, differs
from ..paths import Path, field_name
from ..values.schema import ParameterSchema
from .batches import RecordBatch

__all__ = ["check_shape_field", "SCHEMA_BLOCKS", "SchemaVisitorMixin", "schema_values"]

#: The top-level fields whose values :meth:`SchemaVisitorMixin.check_schema_field` judges.
SCHEMA_BLOCKS = frozenset({SCHEMA[0], REPRESENTATIVES[0]})


def _fmt(shape: Any) -> str:
    return "(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"


def _first_difference(
    stored: Sequence[int],
    wanted: Sequence[int],
    offset: int,
    field: str,
    message: Callable[[int, int, int], str],
    actual: Any,
    expected: Any,
) -> None:
    """Raise for the first u64 of an array (stored from byte ``offset``) that differs."""
    for j, (got, want) in enumerate(zip(stored, wanted)):
        if got != want:
            raise SchemaMismatchError(
                message(j, got, want),
                offset=offset + U64_SIZE * j,
                field=f"{field}[{j}]",
                actual=got if actual is None else actual,
                expected=want if expected is None else expected,
            )


#: The shape fields that count something, and what they count of a shape.
_COUNTS = {"rank": len, "element_count": product}


def check_shape_field(
    name: str, value: Any, shape: tuple[int, ...], offset: int, label: str, path: Path
) -> None:
    """Compare one decoded ``rank`` / ``dims`` / ``element_count`` with the expected shape.

    ``label`` names the record kind ("slot", "tensor"); its index is ``path[-2]``. ``path``
    is the field's spec path, rendered only when there is an error.
    """
    label = f"{label} {path[-2]}"
    if name in _COUNTS:
        want = _COUNTS[name](shape)
        if value != want:
            what = f"{name.replace('_', ' ')} {value} in the file, {want} expected"
            shown = f" (shape {_fmt(shape)})" if name == "rank" else ""
            raise differs(SchemaMismatchError, f"{label}: {what}{shown}", offset, path, value, want)
    elif name == "dims":
        _first_difference(
            value,
            shape,
            offset,
            field_name(path),
            lambda j, got, want: (
                f"{label}: dim {j} is {got} in the file, {want} expected"
                f" (shape {_fmt(value)} vs {_fmt(shape)})"
            ),
            tuple(value),
            shape,
        )


def _rep_text(tag: int) -> str:
    return "frozen" if tag == 0 else f"slot {tag - 1}"


class SchemaVisitorMixin:
    """Visitor part for the schema and representatives blocks of Adam files.

    With a destination schema every field is compared the moment it is read; without one
    (``inspect``), the stored schema becomes the expectation and must be well-formed.
    Needs ``self.layout`` (an ``AdamLayout``) set before parsing starts.
    """

    layout: Any

    def init_schema_check(self, expected: ParameterSchema | None) -> None:
        self.expected = expected
        self.schema: ParameterSchema | None = expected
        self._shapes: list[tuple[int, ...]] = []
        self._grads: list[bool] = []

    def check_schema_field(self, path: Path, value: Any, offset: int, ctx: Container) -> None:
        expected = self.expected
        if path == SLOT_COUNT:
            if expected is not None and value != len(expected):
                message = f"slot count {value} in the file, {len(expected)} expected"
                raise differs(SchemaMismatchError, message, offset, path, value, len(expected))
        elif path[:-2] == SLOTS:  # a field of a slot
            slot, name = path[-2], path[-1]
            if expected is not None:
                check_shape_field(name, value, expected.shapes[slot], offset, "slot", path)
                wanted = expected.requires_grad[slot]
                if name == "requires_grad" and bool(value) != wanted:
                    message = (
                        f"slot {slot}: requires_grad {bool(value)} in the file, {wanted} expected"
                    )
                    raise differs(SchemaMismatchError, message, offset, path, bool(value), wanted)
        elif path[:-1] == SLOTS:  # a whole slot
            self._shapes.append(tuple(value.dims))
            self._grads.append(bool(value.requires_grad))
        elif path == SCHEMA and not self.layout.representatives:
            self._adopt(None, offset)
        elif path == REPRESENTATIVES:
            if expected is not None:
                _first_difference(
                    value,
                    expected.representative_tags(),
                    offset,
                    field_name(REPRESENTATIVES),
                    lambda i, got, want: (
                        f"slot {i}: representative is {_rep_text(got)} in the"
                        f" file, {_rep_text(want)} expected"
                    ),
                    None,
                    None,
                )
            self._adopt([None if t == 0 else t - 1 for t in value], offset)

    def schema_records(self, batch: RecordBatch) -> bool:
        """A batch of schema slots (see ``Visitor.on_records``): taken if every slot fits the
        destination, if there is one; declined otherwise, so the slot-by-slot walk names the
        first difference."""
        first, count = batch.first, batch.count
        if "dims" in batch.constants:
            shapes = [tuple(batch.constants["dims"])] * count
        else:
            shapes = batch.values("dims", tuple)
        grads = [bool(g) for g in batch.values("requires_grad")]
        expected = self.expected
        if expected is not None and (
            list(expected.shapes[first : first + count]) != shapes
            or list(expected.requires_grad[first : first + count]) != grads
        ):
            return False
        self._shapes.extend(shapes)
        self._grads.extend(grads)
        return True

    def _adopt(self, representatives: list[int | None] | None, offset: int) -> None:
        stored = ParameterSchema(self._shapes, self._grads, representatives)
        if self.expected is None:
            if not stored.is_well_formed():
                raise SchemaMismatchError(
                    "the stored parameter schema is not well-formed (frozen slots with"
                    " moments, or representatives that are later, frozen or of another shape)",
                    offset=offset,
                    field=field_name(REPRESENTATIVES if representatives is not None else SCHEMA),
                )
            self.schema = stored
        self.stored_schema = stored


def schema_values(schema: ParameterSchema) -> dict[str, Any]:
    """The values of the schema and representatives blocks, ready for the spec builder."""
    return {
        "schema": {
            "slot_count": len(schema),
            "slots": [
                {
                    "rank": len(shape),
                    "dims": list(shape),
                    "element_count": product(shape),
                    "requires_grad": int(grad),
                }
                for shape, grad in zip(schema.shapes, schema.requires_grad)
            ],
        },
        "representatives": schema.representative_tags(),
    }
