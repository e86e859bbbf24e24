"""tlckpt — TorchLean checkpoints for PyTorch: exact, streaming, crash-safe, hostile-input-safe.

Layers: :mod:`tlckpt.formats` (declarative specs), :mod:`tlckpt.codec` (numpy readers and
writers), :mod:`tlckpt.runtime` (torch modules and optimizers). The codec's names are
re-exported here, and so are the runtime's: those import torch on first use only, so the
codec and the command line's codec-level commands start without it (without torch, a runtime
name is an ``AttributeError`` saying what to install).
"""

from typing import Any

from .codec import *  # noqa: F403
from .codec import __all__ as _codec_all
from .optional import MissingDependencyError

__version__ = "0.1.0"

#: The runtime's public names (``tlckpt.runtime.__all__``; a test keeps the two equal).
RUNTIME_NAMES = (
    "schema_of",
    "save_module_state",
    "load_module_state",
    "save_state_bits",
    "load_state_bits",
    "save_optimizer",
    "load_optimizer",
    "MissingRandomCounterWarning",
)


def __getattr__(name: str) -> Any:
    if name in RUNTIME_NAMES:
        try:
            from . import runtime  # imports torch
        except MissingDependencyError as exc:
            # An AttributeError, so that hasattr() answers False instead of raising; the
            # message says what to install.
            raise AttributeError(f"tlckpt.{name}: {exc}", name=name, obj=None) from None
        return getattr(runtime, name)
    raise AttributeError(f"module 'tlckpt' has no attribute {name!r}")


__all__ = [*_codec_all, "MissingDependencyError", *RUNTIME_NAMES]
