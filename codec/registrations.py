"""The built-in checkpoint families, registered in one explicit list.

Like :mod:`tlckpt.formats.registry` for format versions: the families the library reads and
writes are named here, in the order they are tried and listed, and registered by
:func:`register_built_in_families`, which the codec's ``__init__`` calls once. A family of
one's own is registered the same way, with :func:`~.families.register_family`
(``docs/extending.md``).
"""

from __future__ import annotations

from .families import FamilyHandler, family_named, register_family
from .model_state.model_state_families import FLOAT32_STATE_FAMILY, STATE_BITS_FAMILY
from .optimizers.adam_family import ADAM_FAMILY
from .optimizers.optimizer_tree_family import OPTIMIZER_TREE_FAMILY
from .optimizers.tlckpt_optimizer_family import OPTIMIZER_FAMILY
from .safetensors.family import SAFETENSORS_FAMILY

__all__ = ["BUILT_IN_FAMILIES", "register_built_in_families"]

#: Every built-in family, in registration order. safetensors comes first: its sniff is
#: strict (a header length with NUL bytes), exact-bits JSON's is not; optimizer trees before
#: it: they are safetensors files whose metadata starts the header.
BUILT_IN_FAMILIES: tuple[FamilyHandler, ...] = (
    OPTIMIZER_TREE_FAMILY,
    SAFETENSORS_FAMILY,
    ADAM_FAMILY,
    FLOAT32_STATE_FAMILY,
    STATE_BITS_FAMILY,
    OPTIMIZER_FAMILY,
)


def register_built_in_families() -> None:
    """Register each of :data:`BUILT_IN_FAMILIES` that is not registered yet."""
    for handler in BUILT_IN_FAMILIES:
        if family_named(handler.name) is None:
            register_family(handler)
