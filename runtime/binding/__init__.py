"""Binding torch objects to the codec's values: tensors, DTensors, slots, Adam state.

Holds :mod:`.tensors` (dtypes, host buffers), :mod:`.dtensors` (what is sharded and how),
:mod:`.slots` (a module's parameter slots and tied weights), :mod:`.adam_binding` and
:mod:`.adam_moments` (a torch optimizer's state as the codec's entries and back).

May import: ``tlckpt.codec`` (any room), torch. Nothing else of the runtime.
"""
