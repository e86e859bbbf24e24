"""Checking a stored schema (or a tensor's shape) against the destination, field by field."""

from __future__ import annotations

from typing import Any

from construct import Container

from ..formats.primitives import product
from .batches import RecordBatch
from .errors import SchemaMismatchError
from .schema import ParameterSchema
from .walker import Path, field_name

__all__ = ["check_shape_field", "SchemaVisitorMixin", "schema_values"]


def _fmt(shape: Any) -> str:
    return "(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"


def check_shape_field(
    name: str, value: Any, shape: tuple[int, ...], offset: int, label: str, path: Path
) -> None:
    """Compare one decoded ``rank`` / ``dims`` / ``element_count`` with the expected shape.

    ``label`` names the record kind ("slot", "tensor"); its index is ``path[-2]``. ``path``
    is the field's spec path, rendered only when there is an error.
    """
    label = f"{label} {path[-2]}"
    if name == "rank":
        if value != len(shape):
            raise SchemaMismatchError(
                f"{label}: rank {value} in the file, {len(shape)} expected (shape {_fmt(shape)})",
                offset=offset,
                field=field_name(path),
                actual=value,
                expected=len(shape),
            )
    elif name == "dims":
        for j, (got, want) in enumerate(zip(value, shape)):
            if got != want:
                raise SchemaMismatchError(
                    f"{label}: dim {j} is {got} in the file, {want} expected"
                    f" (shape {_fmt(value)} vs {_fmt(shape)})",
                    offset=offset + 8 * j,
                    field=f"{field_name(path)}[{j}]",
                    actual=tuple(value),
                    expected=shape,
                )
    elif name == "element_count":
        want = product(shape)
        if value != want:
            raise SchemaMismatchError(
                f"{label}: element count {value} in the file, {want} expected",
                offset=offset,
                field=field_name(path),
                actual=value,
                expected=want,
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
        if path == ("schema", "slot_count"):
            if expected is not None and value != len(expected):
                raise SchemaMismatchError(
                    f"slot count {value} in the file, {len(expected)} expected",
                    offset=offset,
                    field="schema.slot_count",
                    actual=value,
                    expected=len(expected),
                )
        elif path[:2] == ("schema", "slots") and len(path) == 4:
            slot, name = path[2], path[3]
            if expected is not None:
                check_shape_field(name, value, expected.shapes[slot], offset, "slot", path)
                if name == "requires_grad" and bool(value) != expected.requires_grad[slot]:
                    raise SchemaMismatchError(
                        f"slot {slot}: requires_grad {bool(value)} in the file,"
                        f" {expected.requires_grad[slot]} expected",
                        offset=offset,
                        field=field_name(path),
                        actual=bool(value),
                        expected=expected.requires_grad[slot],
                    )
        elif path[:2] == ("schema", "slots") and len(path) == 3:
            self._shapes.append(tuple(value.dims))
            self._grads.append(bool(value.requires_grad))
        elif path == ("schema",) and not self.layout.representatives:
            self._adopt(None, offset)
        elif path == ("representatives",):
            if expected is not None:
                tags = expected.representative_tags()
                for i, (got, want) in enumerate(zip(value, tags)):
                    if got != want:
                        raise SchemaMismatchError(
                            f"slot {i}: representative is {_rep_text(got)} in the file,"
                            f" {_rep_text(want)} expected",
                            offset=offset + 8 * i,
                            field=f"representatives[{i}]",
                            actual=got,
                            expected=want,
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
            shapes = list(map(tuple, batch.values("dims")))
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
                    field="representatives" if representatives is not None else "schema",
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
