"""tlckpt's own optimizer family (``TLCKOPT``) in the registry: description, destinations,
checks.

The reader and writer are :mod:`.tlckpt_optimizer` and :mod:`.tlckpt_optimizer_writer`;
this module tells the family registry (:mod:`.families`) how ``inspect``, ``tlckpt
validate`` and the fuzzing harness use them. A destination of either optimizer family fits
the other's files (:meth:`FamilyHandler.takes`): a ``TLADAMF`` reference's optimizer holds one
TorchLean config, which each group of a ``TLCKOPT`` file must then hold.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...formats.adam import AdamKind
from ...formats.framing import OPTIMIZER_MAGIC
from ...formats.tlckpt_optimizer import GROUP_FLAGS, GROUP_FLOATS
from ..families import FamilyExample, FamilyHandler
from ..fileio.source import PathOrFile
from ..inspection import file_size, float_entry, optimizer_contents
from ..values.destinations import AdamTarget, OptimizerTarget, parse_optimizer_target
from ..values.optimizer_types import (
    MOMENT_DTYPE_NAMES,
    OptimizerCheckpoint,
    OptimizerEntry,
    ParamGroupConfig,
    moment_array_dtype,
)
from ..values.payload_sinks import SkipPayloads
from ..values.schema import ParameterSchema
from .tlckpt_optimizer import read_optimizer_state, scan_optimizer_state, scan_optimizer_state_sizes
from .tlckpt_optimizer_writer import write_optimizer_state

__all__ = ["OPTIMIZER_FAMILY"]


def _group_entry(index: int, group: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"group": index, "kind": group.kind.name.lower()}
    out.update((name, float_entry(getattr(group, name))) for name in GROUP_FLOATS)
    out.update((name, getattr(group, name)) for name in GROUP_FLAGS)
    return out


#: The examples' param groups: decay and no decay (AdamW), amsgrad with maximize and L2 decay
#: (Adam), differing betas and eps.
_GROUPS = (
    ParamGroupConfig(AdamKind.ADAMW, 0.9, 0.999, 1e-8, 0.01, 1e-3),
    ParamGroupConfig(AdamKind.ADAMW, 0.9, 0.999, 1e-8, 0.0, 1e-3),
    ParamGroupConfig(AdamKind.ADAM, 0.8, 0.95, 0.0, 0.5, 2e-3, amsgrad=True, maximize=True),
)


def _example(
    name: str,
    rng: np.random.Generator,
    shapes: list[tuple[int, ...]],
    grads: list[bool],
    reps: list[int | None],
    counter: int | None,
    frozen_state: bool = False,
) -> FamilyExample:
    """A file of random moments of every dtype: each representative slot in a random group,
    about one in five without state; with ``frozen_state``, every frozen slot with state in
    a random group too (version 2)."""
    schema = ParameterSchema(shapes, grads, reps)
    holds = [
        schema.is_representative(i) or (frozen_state and schema.representative(i) is None)
        for i in range(len(schema))
    ]
    slot_groups = [int(rng.integers(0, len(_GROUPS))) if h else None for h in holds]
    entries = {}
    for slot in (i for i, h in enumerate(holds) if h):
        if schema.is_representative(slot) and rng.integers(0, 5) == 0:
            continue
        dtype = MOMENT_DTYPE_NAMES[int(rng.integers(0, len(MOMENT_DTYPE_NAMES)))]
        words = moment_array_dtype(dtype)
        count = schema.element_count(slot)
        moments = 3 if _GROUPS[slot_groups[slot]].amsgrad else 2
        arrays = [
            rng.integers(0, 256, count * words.itemsize, dtype=np.uint8).view(words)
            for _ in range(moments)
        ]
        entries[slot] = OptimizerEntry(int(rng.integers(1, 2**40)), dtype, *arrays)
    buffer = io.BytesIO()
    write_optimizer_state(buffer, schema, _GROUPS, slot_groups, entries, counter)
    dtypes = tuple(entries[i].dtype if i in entries else None for i in range(len(schema)))
    target = OptimizerTarget(schema, _GROUPS, tuple(slot_groups), dtypes)
    return FamilyExample(name, buffer.getvalue(), target)


@dataclass(frozen=True)
class _OptimizerFamily(FamilyHandler):
    def describe(self, file: PathOrFile, max_json_bytes: int = 0) -> dict[str, Any]:
        """``inspect``'s description of a ``TLCKOPT`` file (``max_json_bytes``: unused)."""
        ckpt, payload_bytes = scan_optimizer_state_sizes(file)
        return {
            **self.header(ckpt.version),
            "groups": [_group_entry(i, g) for i, g in enumerate(ckpt.groups)],
            **optimizer_contents(
                ckpt, payload_bytes, slot_groups=ckpt.slot_groups, entry_fields=("dtype",)
            ),
            "bytes": file_size(file),
        }

    def destination(self, file: PathOrFile, max_json_bytes: int) -> OptimizerTarget:
        """The optimizer that wrote the file: its schema, groups, each slot's group, and the
        moment dtype of each slot that has state (the others: unknown, any fits)."""
        ckpt = scan_optimizer_state(file)
        dtypes = [None] * len(ckpt.schema)
        for slot, entry in ckpt.entries.items():
            dtypes[slot] = entry.dtype
        return OptimizerTarget(ckpt.schema, ckpt.groups, ckpt.slot_groups, tuple(dtypes))

    def parse_destination(self, description: Mapping[str, Any], source: str) -> OptimizerTarget:
        return parse_optimizer_target(description, source)

    def examples(self) -> tuple[FamilyExample, ...]:
        """Small files (a tied, frozen, scalar and zero-size slot; a counter), a file of many
        small slots, one of large payloads, and a version 2 file (frozen slots with state)."""
        rng = np.random.default_rng(20250101)
        many = [tuple(int(d) for d in rng.integers(0, 4, rng.integers(0, 3))) for _ in range(300)]
        return (
            _example(
                "tlckopt_small",
                rng,
                [(2, 3), (2, 3), (4,), (), (0, 5), (3,)],
                [True, True, False, True, True, True],
                [0, 0, None, 3, 4, 5],
                2**64 - 1,
            ),
            _example("tlckopt_many_slots", rng, many, [True] * 300, list(range(300)), None),
            _example(
                "tlckopt_large",
                rng,
                [(128, 256), (256,), (128, 256)],
                [True, True, True],
                [0, 1, 0],
                12345,
            ),
            _example(
                "tlckopt_frozen_state",
                rng,
                [(3, 4), (4,), (2, 3), (2, 3), (), (5,)],
                [False, False, True, True, False, True],
                [None, None, 2, 2, None, 5],
                None,
                frozen_state=True,
            ),
        )

    def takes(self, target: Any) -> bool:
        """A ``TLADAMF`` destination: its optimizer's one config, in every group."""
        return isinstance(target, AdamTarget)

    def read(
        self, file: PathOrFile, target: OptimizerTarget | AdamTarget, payloads: bool, _: int
    ) -> OptimizerCheckpoint:
        sink = None if payloads else SkipPayloads()
        if isinstance(target, AdamTarget):
            dtype = None if target.dtype is None else target.dtype.value
            return read_optimizer_state(
                file,
                target.schema,
                dtypes=None if dtype is None else (dtype,) * len(target.schema),
                config=target.config,
                sink=sink,
            )
        return read_optimizer_state(
            file,
            target.schema,
            groups=target.groups,
            slot_groups=target.slot_groups,
            dtypes=target.dtypes,
            sink=sink,
        )


OPTIMIZER_FAMILY = _OptimizerFamily(
    contents="tlckpt's own optimizer state, not TorchLean's",
    title="tlckpt's own Adam/AdamW optimizer state; TorchLean cannot read it",
    magic=OPTIMIZER_MAGIC,
)
