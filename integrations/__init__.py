"""Plug-ins that bring tlckpt's checkpoint sets to training frameworks.

Each framework has a module of its own (:mod:`.lightning`: a Lightning ``CheckpointIO``),
which imports the framework itself, guarded: this package imports no optional package, and
each module imports without its framework, failing with a one-line message only when used.

May import: ``tlckpt.runtime``, ``tlckpt.codec``, :mod:`tlckpt.optional`; the frameworks.
"""
