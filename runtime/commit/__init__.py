"""The commit: the one step that writes live tensors and optimizer state.

Holds :mod:`.plans` (a load's new values off to the side, committed with Ctrl-C held back)
and :mod:`.rollback` (live state put back when a commit of several parts fails).

May import: ``tlckpt.codec``, torch. Nothing else of the runtime.
"""
