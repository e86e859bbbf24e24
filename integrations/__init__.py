"""Plug-ins that bring tlckpt's checkpoint sets to training frameworks.

Each framework has a module of its own (:mod:`.lightning`: a Lightning ``CheckpointIO``;
:mod:`.transformers`: the Hugging Face ``Trainer``), which imports the framework itself,
guarded: this package imports no optional package, and each module imports without its
framework (and without torch) installed, raising
:class:`~tlckpt.optional.MissingDependencyError` naming what to install on first use.

May import: ``tlckpt.runtime``, ``tlckpt.codec`` and :mod:`tlckpt.optional` (like the
command line); the frameworks. Nothing in the library imports it.
"""
