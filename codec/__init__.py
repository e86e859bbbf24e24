"""Streaming, validating readers and writers compiled from the ``formats`` specs (numpy only).

Errors are re-exported here and from :mod:`tlckpt`.
"""

# The built-in families register themselves with the family registry (codec.families).
# safetensors first: its sniff is strict (a NUL-bearing length), exact-bits JSON's is not;
# optimizer trees before it: they are safetensors files whose metadata starts the header.
from . import optimizer_tree_family  # noqa: F401, I001
from .safetensors import family as _safetensors_family  # noqa: F401
from . import adam_family, model_state_families, tlckpt_optimizer_family  # noqa: F401
from .adam import AdamCheckpoint, AdamEntry, PayloadSink, read_adam, scan_adam, write_adam
from .atomic import atomic_output, clean_temporaries, is_temporary
from .checkpoint_set import SkippedCheckpointWarning, verify_checkpoint
from .config import AdamConfig, AdamKind, MomentDtype
from .errors import (
    CheckpointError,
    ConfigError,
    EntryError,
    FileChangedError,
    FileTooLargeError,
    IntegrityError,
    KeyRequiredError,
    MalformedError,
    PartialLoadError,
    SchemaMismatchError,
    TrailingDataError,
    TruncatedError,
    UnsupportedFormatError,
    UnsupportedVersionError,
)
from .float32_state import (
    is_float32_state,
    read_float32_state,
    scan_float32_state,
    validate_float32_state,
    write_float32_state,
)
from .inspection import inspect, sniff_family
from .optimizer_types import OptimizerCheckpoint, OptimizerEntry, ParamGroupConfig
from .schema import ParameterSchema
from .safetensors import read_metadata
from .set_keys import read_key_file
from .state_bits import DEFAULT_MAX_JSON_BYTES, read_state_bits, write_state_bits
from .tlckpt_optimizer import read_optimizer_state, scan_optimizer_state
from .tlckpt_optimizer_writer import write_optimizer_state

__all__ = [
    "DEFAULT_MAX_JSON_BYTES",
    "AdamCheckpoint",
    "AdamConfig",
    "AdamEntry",
    "AdamKind",
    "CheckpointError",
    "ConfigError",
    "EntryError",
    "FileChangedError",
    "FileTooLargeError",
    "IntegrityError",
    "KeyRequiredError",
    "MalformedError",
    "MomentDtype",
    "OptimizerCheckpoint",
    "OptimizerEntry",
    "ParamGroupConfig",
    "ParameterSchema",
    "PartialLoadError",
    "PayloadSink",
    "SchemaMismatchError",
    "SkippedCheckpointWarning",
    "TrailingDataError",
    "TruncatedError",
    "UnsupportedFormatError",
    "UnsupportedVersionError",
    "atomic_output",
    "clean_temporaries",
    "inspect",
    "is_float32_state",
    "is_temporary",
    "read_adam",
    "read_key_file",
    "read_metadata",
    "read_float32_state",
    "read_optimizer_state",
    "read_state_bits",
    "scan_adam",
    "scan_float32_state",
    "scan_optimizer_state",
    "sniff_family",
    "validate_float32_state",
    "verify_checkpoint",
    "write_adam",
    "write_float32_state",
    "write_optimizer_state",
    "write_state_bits",
]
