"""The ``TLADAMF`` family in the registry: description, destinations, checks.

The reader and writer are :mod:`.adam` and :mod:`.adam_writer`; this module tells the
family registry (:mod:`.families`) how ``inspect``, ``tlckpt validate`` and the fuzzing
harness use them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...formats.framing import ADAM_MAGIC
from ..families import FamilyHandler
from ..fileio.source import PathOrFile
from ..inspection import file_size, float_entry, optimizer_contents
from ..values.destinations import AdamTarget, OptimizerTarget, parse_adam_target
from ..values.payload_sinks import SkipPayloads
from .adam import read_adam, scan_adam, scan_adam_sizes
from .adam_types import AdamCheckpoint
from .torchlean_fit import adam_target_of

__all__ = ["ADAM_FAMILY"]


@dataclass(frozen=True)
class _AdamFamily(FamilyHandler):
    def describe(self, file: PathOrFile, max_json_bytes: int = 0) -> dict[str, Any]:
        """``inspect``'s description of a ``TLADAMF`` file (``max_json_bytes``: unused)."""
        ckpt, payload_bytes = scan_adam_sizes(file)
        cfg = ckpt.config
        return {
            **self.header(ckpt.version),
            "kind": cfg.kind.name.lower(),
            "moment_dtype": cfg.dtype.value,
            "config": {
                "beta1": float_entry(cfg.beta1),
                "beta2": float_entry(cfg.beta2),
                "epsilon": float_entry(cfg.epsilon),
                "weight_decay": float_entry(cfg.weight_decay),
            },
            **optimizer_contents(ckpt, payload_bytes),
            **({"fields": ckpt.fields} if ckpt.fields else {}),
            "bytes": file_size(file),
        }

    def destination(self, file: PathOrFile, max_json_bytes: int) -> AdamTarget:
        """The optimizer that wrote the file: its schema, moment dtype and config."""
        ckpt = scan_adam(file)
        return AdamTarget(ckpt.schema, ckpt.config.dtype, ckpt.config)

    def parse_destination(self, description: Mapping[str, Any], source: str) -> AdamTarget:
        return parse_adam_target(description)

    def takes(self, target: Any) -> bool:
        """An optimizer destination of tlckpt's family: a ``TLADAMF`` file loads into that
        optimizer when its state fits TorchLean's versions."""
        return isinstance(target, OptimizerTarget)

    def read(
        self, file: PathOrFile, target: AdamTarget | OptimizerTarget, payloads: bool, _: int
    ) -> AdamCheckpoint:
        if isinstance(target, OptimizerTarget):
            target = adam_target_of(target)
        return read_adam(
            file,
            target.schema,
            dtype=target.dtype,
            expected_config=target.config,
            sink=None if payloads else SkipPayloads(),
        )


ADAM_FAMILY = _AdamFamily(contents="Adam/AdamW optimizer state", magic=ADAM_MAGIC, marker="schema")
