"""Integrations with training frameworks: each module binds tlckpt's checkpoint sets to one
framework's own checkpointing (:mod:`.transformers`: the Hugging Face ``Trainer``).

Every module here imports without its framework (and without torch) installed, and raises
:class:`~tlckpt.optional.MissingDependencyError` naming what to install on first use.

May import: ``tlckpt.runtime``, ``tlckpt.codec`` and :mod:`tlckpt.optional` (like the
command line); nothing in the library imports it.
"""
