"""The file formats ``tlckpt convert`` knows, by name and by extension.

The positional formats are the model-state families of the family registry (each handler's
:class:`~tlckpt.codec.families.ModelStateFamily` gives its name and extensions); the named
formats are safetensors and torch state_dicts (:mod:`.named_formats`).
"""

from __future__ import annotations

import os

from ..codec.families import ModelStateFamily, families

__all__ = [
    "NAMED_FORMATS",
    "POSITIONAL_FAMILIES",
    "FORMATS",
    "EXTENSIONS",
    "POSITIONAL",
    "format_of_path",
]

#: Named formats (tensors known by name) and what they are.
NAMED_FORMATS: dict[str, str] = {"safetensors": "safetensors", "pt": "torch state_dict"}
_NAMED_EXTENSIONS = {".safetensors": "safetensors", ".pt": "pt", ".pth": "pt"}

#: Positional formats (TorchLean's model-state families) by format name.
POSITIONAL_FAMILIES: dict[str, ModelStateFamily] = {
    f.format: f for f in families() if isinstance(f, ModelStateFamily)
}
#: Format names (``--to``) and what they are.
FORMATS: dict[str, str] = {
    **{name: f.label for name, f in POSITIONAL_FAMILIES.items()},
    **NAMED_FORMATS,
}
#: File extension → format name.
EXTENSIONS: dict[str, str] = {
    **{ext: name for name, f in POSITIONAL_FAMILIES.items() for ext in f.extensions},
    **_NAMED_EXTENSIONS,
}
#: Formats whose tensors are known by position only.
POSITIONAL = frozenset(POSITIONAL_FAMILIES)


def format_of_path(path: str | os.PathLike) -> str | None:
    """The format name for a path's extension, or ``None``."""
    return EXTENSIONS.get(os.path.splitext(os.fspath(path))[1].lower())
