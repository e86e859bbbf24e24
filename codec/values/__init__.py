"""The values a caller hands to the codec and gets back: configs, schemas, destinations.

Holds :mod:`.config` (Adam/AdamW hyperparameters), :mod:`.schema` (TorchLean's parameter
schema), :mod:`.optimizer_types` (optimizer checkpoints and their entries),
:mod:`.destinations` (what a file is read against) and :mod:`.payload_sinks` (the protocol a
reader hands payloads to).

May import: ``formats``, :mod:`..errors`.
"""
