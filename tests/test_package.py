"""The package's public surface: API.md's names, lazily imported runtime."""

import subprocess
import sys

import tlckpt
from tlckpt import runtime


def test_runtime_names_are_re_exported() -> None:
    assert set(tlckpt.RUNTIME_NAMES) == set(runtime.__all__)
    for name in runtime.__all__:
        assert getattr(tlckpt, name) is getattr(runtime, name)


def test_api_md_names_are_public() -> None:
    promised = {
        "ParameterSchema", "AdamKind", "MomentDtype", "AdamConfig", "AdamEntry",
        "AdamCheckpoint", "write_adam", "read_adam", "write_float32_state",
        "read_float32_state", "is_float32_state", "write_state_bits", "read_state_bits",
        "inspect", "CheckpointError", "UnsupportedFormatError", "UnsupportedVersionError",
        "TruncatedError", "TrailingDataError", "SchemaMismatchError", "ConfigError",
        "EntryError", "MalformedError", "schema_of", "save_module_state",
        "load_module_state", "save_state_bits", "load_state_bits", "save_optimizer",
        "load_optimizer",
    }  # fmt: skip
    assert promised <= set(tlckpt.__all__)
    for name in promised:
        assert getattr(tlckpt, name) is not None
    assert issubclass(tlckpt.CheckpointError, ValueError)


def test_codec_import_does_not_import_torch() -> None:
    code = "import sys, tlckpt; tlckpt.inspect; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
