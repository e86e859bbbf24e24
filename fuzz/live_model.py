"""A model's live state, set to named versions of values, saved and loaded through the
library in each load mode, and checked for which version it holds afterwards.

The harness of the load campaigns (:mod:`fuzz.load_interrupts`, :mod:`fuzz.load_races`) and
of their deterministic tests in ``tests/hostile``: a load must leave the model holding one
version whole (the old values, or the file's), never a mix, unless it says so.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["LOAD_MODES", "model_for", "values_of", "LiveModel"]

#: The load modes: a ``TLSF32B`` file loaded staged (the default) or in place
#: (``staged=False``), and an exact-bits JSON file.
LOAD_MODES = ("tlsf32-staged", "tlsf32-in-place", "json")


def model_for(mode: str) -> Any:
    """The model a load mode loads: 2,000 small tensors for JSON, else 48 tensors."""
    import torch

    if mode == "json":
        return torch.nn.ParameterList(torch.nn.Parameter(torch.empty(16)) for _ in range(2000))
    layers: list[torch.nn.Module] = []
    for _ in range(6):
        layers += [torch.nn.Linear(512, 512), torch.nn.BatchNorm1d(512)]
    layers += [torch.nn.Linear(512, 512) for _ in range(3)]
    return torch.nn.Sequential(*layers)  # 6 x (2 + 5) + 3 x 2 = 48 state tensors


def values_of(model: Any, seed: int) -> list[Any]:
    """Values for every state tensor of ``model``, distinct per seed: floats in
    ``[seed, seed + 1)``, integers ``seed``. Every float32 word of a value >= 1 has ten
    decimal digits, so the JSON files of any two seeds >= 1 have the same size."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    values = []
    for t in model.state_dict().values():
        if t.is_floating_point():
            values.append(torch.rand(t.shape, generator=generator) + seed)
        else:
            values.append(torch.full(t.shape, seed, dtype=t.dtype))
    return values


class LiveModel:
    """A model, named versions of values for its state tensors, and one load mode.

    Args:
        mode: One of :data:`LOAD_MODES`.
        path: The file :meth:`load` reads.
        seeds: Version name → the seed of its values (:func:`values_of`).
        model: The model (default: :func:`model_for` the mode).
    """

    def __init__(self, mode: str, path: Path, seeds: Mapping[str, int], model: Any = None) -> None:
        if mode not in LOAD_MODES:
            raise ValueError(f"unknown load mode {mode!r}; known: {', '.join(LOAD_MODES)}")
        self.mode = mode
        self.path = path
        self.model = model_for(mode) if model is None else model
        self.live = list(self.model.state_dict().values())
        self.versions = {name: values_of(self.model, seed) for name, seed in seeds.items()}

    def set(self, name: str) -> None:
        """Copy version ``name`` into the live tensors."""
        import torch

        with torch.no_grad():
            for t, v in zip(self.live, self.versions[name]):
                t.copy_(v)

    def save(self, name: str, path: Path | None = None) -> bytes:
        """Set version ``name`` and save the model in the mode's format (at ``path``,
        default :attr:`path`); the file's bytes."""
        import tlckpt

        target = self.path if path is None else path
        self.set(name)
        if self.mode == "json":
            tlckpt.save_state_bits(self.model, target)
        else:
            tlckpt.save_module_state(self.model, target)
        return target.read_bytes()

    def load(self) -> None:
        """Load :attr:`path` into the model in the mode."""
        import tlckpt

        if self.mode == "json":
            tlckpt.load_state_bits(self.model, self.path)
        else:
            tlckpt.load_module_state(self.model, self.path, staged=self.mode == "tlsf32-staged")

    def holds(self) -> str:
        """The name of the version the live tensors hold, all of them; else ``"mix"``."""
        import torch

        for name, values in self.versions.items():
            if all(torch.equal(t, v) for t, v in zip(self.live, values)):
                return name
        return "mix"

    def whole_tensors(self) -> bool:
        """Whether every live tensor holds its value in some version (a mix of whole
        tensors: none torn, none foreign)."""
        import torch

        return all(
            any(torch.equal(t, values[k]) for values in self.versions.values())
            for k, t in enumerate(self.live)
        )
