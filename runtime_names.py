"""The runtime's public names, in one list that needs no torch.

``tlckpt.runtime`` exports exactly these (its ``__all__``); the root package re-exports them
lazily, importing the runtime (and torch) on first use only, so ``import tlckpt`` stays
torch-free. A name added to the runtime is added here, once.
"""

__all__ = ["RUNTIME_NAMES"]

#: ``tlckpt.runtime.__all__``, and the names ``tlckpt`` resolves through the runtime.
RUNTIME_NAMES = (
    "schema_of",
    "save_module_state",
    "load_module_state",
    "save_state_bits",
    "load_state_bits",
    "save_optimizer",
    "load_optimizer",
    "MissingRandomCounterWarning",
    "last_sharded_io",
    "ShardedIO",
    "CheckpointManager",
    "SaveHandle",
    "Restored",
    "save_checkpoint",
    "load_checkpoint",
    "save_tensors",
    "load_tensors",
    "save_state",
    "load_state",
    "open_checkpoint",
    "CheckpointFile",
    "export_hf",
    "load_hf",
)
