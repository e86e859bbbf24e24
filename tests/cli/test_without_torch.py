"""Without torch (or the safetensors package): the codec and the CLI's TorchLean commands
work, and convert needs no safetensors package; what needs a missing
package ends with one line naming the extra to install, exit 1, no traceback.

Each case runs in a child process whose ``sys.modules`` blocks the packages, which is exactly
what an environment without them looks like to ``import``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tlckpt.testing.vectors import vectors_dir

VECTORS = vectors_dir()

_RUN_CLI = """
import runpy, sys
for name in {blocked!r}:
    sys.modules[name] = None
sys.argv = ["tlckpt", *{args!r}]
runpy.run_module("tlckpt", run_name="__main__", alter_sys=True)
"""


def _cli(*args: str, blocked: tuple[str, ...] = ("torch",)) -> subprocess.CompletedProcess:
    code = _RUN_CLI.format(blocked=blocked, args=list(args))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def _one_line_failure(out: subprocess.CompletedProcess, *needles: str) -> None:
    assert out.returncode == 1, out
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr  # one line: no traceback
    for needle in needles:
        assert needle in lines[0]


@pytest.mark.parametrize("args", [(), ("demo",)], ids=["no-command", "demo"])
def test_training_demo_says_torch_is_needed(args: tuple[str, ...]) -> None:
    out = _cli(*args)
    _one_line_failure(out, "needs torch", "pip install 'tlckpt[torch]'", "demo --codec")


def test_codec_demo_runs_without_torch() -> None:
    out = _cli("demo", "--codec")
    assert out.returncode == 0, out.stderr
    assert "bit-exact: True" in out.stdout
    assert "bit-exact: False" not in out.stdout


@pytest.mark.parametrize(
    "name", ["adam_v5_f64_tied_counter.tladam", "state_basic.tlsf32", "bits_bfloat16.json"]
)
def test_inspect_and_validate_without_torch(name: str) -> None:
    path = str(VECTORS / name)
    out = _cli("inspect", path)
    assert out.returncode == 0, out.stderr
    out = _cli("validate", path, "--against", path)
    assert out.returncode == 0, out.stderr
    assert ": ok (" in out.stdout


def test_convert_between_torchlean_formats_without_torch(tmp_path: Path) -> None:
    source = VECTORS / "state_basic.tlsf32"
    json_file, back = tmp_path / "state.json", tmp_path / "back.tlsf32"
    assert _cli("convert", str(source), str(json_file)).returncode == 0
    assert _cli("convert", str(json_file), str(back)).returncode == 0
    assert back.read_bytes() == source.read_bytes()


def test_convert_to_safetensors_says_what_to_install(tmp_path: Path) -> None:
    source = str(VECTORS / "state_basic.tlsf32")
    out = _cli("convert", source, str(tmp_path / "s.safetensors"))
    _one_line_failure(out, "needs torch", "tlckpt[torch]")
    assert not list(tmp_path.iterdir())


def test_convert_needs_no_safetensors_package(tmp_path: Path) -> None:
    """The repository's own codec reads and writes the layout, both ways (with torch, which
    a safetensors conversion needs: an installed copy without torch skips this)."""
    pytest.importorskip("torch")
    source = str(VECTORS / "state_basic.tlsf32")
    there, back = tmp_path / "s.safetensors", tmp_path / "back.tlsf32"
    blocked = ("safetensors",)
    assert _cli("convert", source, str(there), blocked=blocked).returncode == 0
    assert _cli("convert", str(there), str(back), blocked=blocked).returncode == 0
    assert back.read_bytes() == Path(source).read_bytes()


def test_runtime_names_without_torch() -> None:
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import tlckpt\n"
        "print(hasattr(tlckpt, 'save_module_state'))\n"
        "try:\n"
        "    tlckpt.load_optimizer\n"
        "except AttributeError as exc:\n"
        "    print(exc)\n"
        "try:\n"
        "    import tlckpt.runtime\n"
        "except tlckpt.MissingDependencyError as exc:\n"
        "    print(type(exc).__name__, exc.name)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    has, attribute_error, import_error = out.stdout.strip().splitlines()
    assert has == "False"
    assert attribute_error.startswith("tlckpt.load_optimizer: ")
    assert "needs torch" in attribute_error and "tlckpt[torch]" in attribute_error
    assert import_error == "MissingDependencyError torch"


def test_checkpoint_sets_are_listed_and_verified_without_torch(tmp_path: Path) -> None:
    import torch

    import tlckpt
    from tlckpt.formats.checkpoint_set import folder_name

    model = torch.nn.Linear(3, 2)
    folder = tlckpt.save_checkpoint(tmp_path / folder_name(4), model=model, step=4)
    out = _cli("verify", str(folder))
    assert out.returncode == 0, out.stderr
    assert ": ok (step 4" in out.stdout
    (folder / "model.tlsf32").write_bytes(b"TLSF32B" + bytes(40))
    out = _cli("verify", str(folder))
    _one_line_failure(out, "IntegrityError", "model.tlsf32")
    out = _cli("ls", str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert "NOT VERIFIED: IntegrityError (size)" in out.stdout
