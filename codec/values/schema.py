"""``ParameterSchema``: the destination's parameter slots (FORMAT.md §2)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

from ...formats.primitives import product

__all__ = ["ParameterSchema"]


@dataclass(frozen=True, eq=True)
class ParameterSchema:
    """Parameter shapes in module order, trainability, and the optional alias map.

    Args:
        shapes: one tuple of dims per slot (``()`` for a scalar).
        requires_grad: one bool per slot.
        representatives: ``None`` (independent parameters), or per slot ``None`` for a frozen
            slot, else the index of the first trainable slot sharing its storage.

    Example:
        >>> s = ParameterSchema([(2, 3), (2, 3), (4,)], [True, True, True], [0, 0, 2])
        >>> s.optimizer_state_count, s.has_aliases
        (2, True)
    """

    shapes: tuple[tuple[int, ...], ...]
    requires_grad: tuple[bool, ...]
    representatives: tuple[int | None, ...] | None = None

    def __init__(
        self,
        shapes: Sequence[Sequence[int]],
        requires_grad: Sequence[bool],
        representatives: Sequence[int | None] | None = None,
    ):
        object.__setattr__(self, "shapes", tuple(tuple(int(d) for d in s) for s in shapes))
        object.__setattr__(self, "requires_grad", tuple(bool(r) for r in requires_grad))
        object.__setattr__(
            self,
            "representatives",
            None
            if representatives is None
            else tuple(None if r is None else int(r) for r in representatives),
        )

    def __len__(self) -> int:
        return len(self.shapes)

    def element_count(self, i: int) -> int:
        """Number of elements of slot ``i`` (1 for a scalar, 0 with a zero dim)."""
        return product(self.shapes[i])

    def representative(self, i: int) -> int | None:
        """The slot whose moment history slot ``i`` uses; ``None`` if frozen or invalid."""
        if self.representatives is None:
            if 0 <= i < len(self.requires_grad) and self.requires_grad[i]:
                return i
            return None
        if 0 <= i < len(self.representatives):
            return self.representatives[i]
        return None

    def is_representative(self, i: int) -> bool:
        """Whether slot ``i`` owns a moment entry."""
        return self.representative(i) == i

    def is_well_formed(self) -> bool:
        """Lengths agree; frozen ⇔ no representative; representatives precede, are
        trainable, have the same shape and represent themselves (no chains, no cycles)."""
        n = len(self.shapes)
        if len(self.requires_grad) != n:
            return False
        if self.representatives is not None and len(self.representatives) != n:
            return False
        for i in range(n):
            r = self.representative(i)
            if r is None:
                if self.requires_grad[i]:
                    return False
                continue
            if not self.requires_grad[i] or not 0 <= r <= i:
                return False
            if not self.requires_grad[r] or self.shapes[r] != self.shapes[i]:
                return False
            if self.representative(r) != r:
                return False
        return True

    @cached_property
    def representative_slots(self) -> tuple[int, ...]:
        """Slots that own a moment entry, ascending."""
        return tuple(i for i in range(len(self.shapes)) if self.is_representative(i))

    @cached_property
    def representative_set(self) -> frozenset[int]:
        """:attr:`representative_slots` as a set."""
        return frozenset(self.representative_slots)

    @property
    def optimizer_state_count(self) -> int:
        """Number of moment entries a checkpoint of this schema holds."""
        return len(self.representative_slots)

    @property
    def has_aliases(self) -> bool:
        """Whether some trainable slot borrows another slot's moment history."""
        return any(
            self.requires_grad[i] and self.representative(i) != i for i in range(len(self.shapes))
        )

    def representative_tags(self) -> list[int]:
        """The representatives block as stored: 0 frozen, ``representative + 1`` otherwise."""
        return [0 if (r := self.representative(i)) is None else r + 1 for i in range(len(self))]
