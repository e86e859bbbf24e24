"""Streaming, validating readers and writers compiled from the ``formats`` specs (numpy only).

Errors are re-exported here and from :mod:`tlckpt`. This file is the codec's face; the rooms
below it (``docs/architecture.md``), from the bottom up: :mod:`.fileio` (sources, atomic
writes, transfers), :mod:`.values` (configs, schemas, destinations), :mod:`.spec` (the
engine that turns a spec into a reader and a writer), :mod:`.exact_json` (the exact-bits
JSON codec), the families (:mod:`.model_state`, :mod:`.optimizers`), checkpoint sets
(:mod:`.sets`) and Hugging Face folders (:mod:`.hf_folders`). Face modules beside them:
:mod:`.errors`, :mod:`.paths`, :mod:`.sniffing` (a file's family from its first bytes),
:mod:`.families` (the registry), :mod:`.registrations` (the built-in families),
:mod:`.inspection`.
"""

from ..formats.adam import AdamKind
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
from .exact_json.json_document import DEFAULT_MAX_JSON_BYTES
from .fileio.atomic import atomic_output, clean_temporaries, is_temporary
from .hf_folders.hf_export import TiesUnknownWarning
from .inspection import inspect, sniff_family
from .model_state.float32_state import (
    is_float32_state,
    read_float32_state,
    scan_float32_state,
    validate_float32_state,
)
from .model_state.float32_state_writer import write_float32_state
from .model_state.state_bits import read_state_bits
from .model_state.state_bits_writer import write_state_bits
from .optimizers.adam import read_adam, scan_adam
from .optimizers.adam_types import AdamCheckpoint, AdamEntry
from .optimizers.adam_writer import write_adam
from .optimizers.tlckpt_optimizer import read_optimizer_state, scan_optimizer_state
from .optimizers.tlckpt_optimizer_writer import write_optimizer_state
from .registrations import register_built_in_families
from .safetensors import read_metadata
from .sets.checkpoint_set import verify_checkpoint
from .sets.set_folders import SkippedCheckpointWarning
from .sets.set_keys import read_key_file
from .values.config import AdamConfig, MomentDtype
from .values.optimizer_types import OptimizerCheckpoint, OptimizerEntry, ParamGroupConfig
from .values.payload_sinks import PayloadSink
from .values.schema import ParameterSchema

# The families inspect, validate and convert dispatch through (one explicit list).
register_built_in_families()

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
    "TiesUnknownWarning",
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
