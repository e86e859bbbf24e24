"""Optional dependencies: one message, naming the extra that installs them.

The codec needs numpy, construct and orjson only. The runtime needs torch (``tlckpt[torch]``);
the command line's progress bars need ``tlckpt[cli]`` (its safetensors conversions need torch
only: the layout is the repository's own codec). A feature
that needs a missing package raises :class:`MissingDependencyError`, whose message is one line
a user can act on, instead of a bare ``ModuleNotFoundError`` from deep inside.
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["EXTRAS", "MissingDependencyError", "require", "missing_message"]

#: Top-level package → the ``tlckpt`` extra that installs it.
EXTRAS = {
    "torch": "torch",
    "tqdm": "cli",
    "fsspec": "remote",
    "s3fs": "remote",
}


class MissingDependencyError(ModuleNotFoundError):
    """A feature needs an optional package that is not installed.

    ``name`` is the missing package (as for ``ModuleNotFoundError``).
    """


def missing_message(package: str, feature: str, instead: str | None = None) -> str:
    """``"<feature> needs <package>, which is not installed: pip install 'tlckpt[x]'"``,
    then ``instead`` (what works without it), if given."""
    extra = EXTRAS.get(package)
    hint = f"pip install 'tlckpt[{extra}]'" if extra else f"pip install {package}"
    message = f"{feature} needs {package}, which is not installed: {hint}"
    return f"{message} ({instead})" if instead else message


def require(module: str, feature: str, instead: str | None = None) -> ModuleType:
    """Import ``module`` for ``feature``, or raise :class:`MissingDependencyError`.

    Args:
        module: the module to import (``"torch"``, ``"safetensors.torch"``).
        feature: what needs it, for the message (``"the demo"``, ``"converting .pt files"``).
        instead: what works without it, appended to the message.

    Returns:
        The imported module.

    Raises:
        MissingDependencyError: the module's top-level package is not installed. Any other
            import failure (a broken installation) propagates unchanged.
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        package = module.partition(".")[0]
        if exc.name is None or exc.name.partition(".")[0] != package:
            raise
        message = missing_message(package, feature, instead)
        raise MissingDependencyError(message, name=package) from None
