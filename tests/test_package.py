"""The package's public surface: API.md's names, lazily imported runtime."""

import subprocess
import sys
from pathlib import Path

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


def test_import_on_a_non_posix_platform_says_which_are_supported() -> None:
    # The package is found first (the import machinery itself needs the real os.name for
    # its paths), then executed as on Windows.
    code = (
        "import importlib.util, os, sys\n"
        "spec = importlib.util.find_spec('tlckpt')\n"
        "module = importlib.util.module_from_spec(spec)\n"
        "sys.modules['tlckpt'] = module\n"
        "os.name, sys.platform = 'nt', 'win32'\n"
        "try:\n"
        "    spec.loader.exec_module(module)\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
        "else:\n"
        "    print('imported')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    message = out.stdout.strip()
    assert "\n" not in message, message
    assert message.startswith("tlckpt supports POSIX systems only (Linux, macOS)"), message
    assert "fsync of a folder and flock(2)" in message
    assert "os.name='nt'" in message and "sys.platform='win32'" in message


def test_supported_platforms_are_declared() -> None:
    text = (Path(tlckpt.__file__).parent / "pyproject.toml").read_text()
    for wanted in (
        "Operating System :: POSIX",
        "Operating System :: POSIX :: Linux",
        "Operating System :: MacOS",
    ):
        assert f'"{wanted}"' in text
    assert "Windows" not in text
