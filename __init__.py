"""tlckpt — TorchLean checkpoints for PyTorch: exact, streaming, crash-safe, hostile-input-safe.

Layers: :mod:`tlckpt.formats` (declarative specs), :mod:`tlckpt.codec` (numpy readers and
writers), :mod:`tlckpt.runtime` (torch modules and optimizers). The codec's names are
re-exported here; the runtime's are too when torch is installed.
"""

from .codec import *  # noqa: F403
from .codec import __all__ as _codec_all

__version__ = "0.1.0"

try:
    from .runtime import *  # noqa: F403
    from .runtime import __all__ as _runtime_all
except ModuleNotFoundError as _exc:  # torch missing: the codec works without it
    if not (_exc.name or "").startswith("torch"):
        raise
    _runtime_all = []

__all__ = [*_codec_all, *_runtime_all]
