"""tlckpt — TorchLean checkpoints for PyTorch: exact, streaming, crash-safe, hostile-input-safe.

Layers: :mod:`tlckpt.formats` (declarative specs), :mod:`tlckpt.codec` (numpy readers and
writers), :mod:`tlckpt.runtime` (torch modules and optimizers). The codec's names are
re-exported here, and so are the runtime's: those import torch on first use only, so the
codec and the command line's codec-level commands start without it (without torch, a runtime
name is an ``AttributeError`` saying what to install).
"""

import os as _os
import sys as _sys

# Before anything else: the atomic writer needs a folder fsync (os.open on a folder) and
# flock(2), which Windows lacks; saving there would fail on every call, so refuse at once.
if _os.name != "posix":
    raise ImportError(
        "tlckpt supports POSIX systems only (Linux, macOS): its crash-safe saves need"
        " fsync of a folder and flock(2), which this platform"
        f" (os.name={_os.name!r}, sys.platform={_sys.platform!r}) does not provide"
    )

from typing import Any

from .codec import *  # noqa: F403
from .codec import __all__ as _codec_all
from .optional import MissingDependencyError
from .runtime_names import RUNTIME_NAMES  # served by __getattr__, importing torch then

__version__ = "0.1.0"


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
