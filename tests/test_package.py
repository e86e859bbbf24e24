"""The package's public surface: API.md's names, lazily imported runtime."""

import ast
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
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


def test_single_process_model_use_does_not_import_dtensor() -> None:
    # ``torch.distributed.tensor`` brings sympy (~0.6 s at first use): imported only where a
    # DTensor exists, never by a single process's model saves, loads and sets (serving
    # loads a model alone; torch's own optimizer step imports it for training anyway).
    code = (
        "import sys, tempfile, torch, tlckpt\n"
        "d = tempfile.mkdtemp()\n"
        "model = torch.nn.Linear(4, 3)\n"
        "for name in ('m.tlsf32', 'm.safetensors'):\n"
        "    tlckpt.save_module_state(model, d + '/' + name)\n"
        "    tlckpt.load_module_state(model, d + '/' + name)\n"
        "manager = tlckpt.CheckpointManager(d + '/sets')\n"
        "manager.save(1, model=model)\n"
        "manager.save(2, model=model, blocking=False).wait()\n"
        "manager.restore(model=model)\n"
        "print(sorted(m for m in ('torch.distributed.tensor', 'sympy') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


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


# ---------------------------------------------------------------- what the wheel holds

#: Top-level folders of the repository that are not the library (nothing in it imports them).
DEVELOPMENT_ONLY = {"tests", "fuzz", "bench", "docs"}
REPOSITORY = Path(tlckpt.__file__).resolve().parent


def _packages_on_disk() -> dict[str, Path]:
    """``tlckpt.…`` → folder, for every folder with an ``__init__.py`` reached through
    folders that have one, the development-only trees aside."""
    found = {"tlckpt": REPOSITORY}

    def walk(folder: Path, dotted: str) -> None:
        for path in sorted(folder.iterdir()):
            if path.is_dir() and (path / "__init__.py").is_file():
                if folder == REPOSITORY and path.name in DEVELOPMENT_ONLY:
                    continue
                found[f"{dotted}.{path.name}"] = path
                walk(path, f"{dotted}.{path.name}")

    walk(REPOSITORY, "tlckpt")
    return found


def _build_wheel(tmp_path: Path) -> list[str]:
    """The file names of a wheel built from a copy of the repository (the build writes
    ``build/`` and ``*.egg-info`` beside the sources, so not in the checkout itself)."""
    source = tmp_path / "src"
    ignore = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", "__pycache__")
    shutil.copytree(REPOSITORY, source, ignore=ignore)
    command = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
    out = subprocess.run(
        [*command, "-w", str(tmp_path / "dist"), str(source)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    (wheel,) = (tmp_path / "dist").glob("tlckpt-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        return archive.namelist()


def test_wheel_holds_every_subpackage_and_module(tmp_path: Path) -> None:
    # A hand-written package list once left tlckpt.runtime.collectives (now in placement/)
    # out of every wheel.
    names = _build_wheel(tmp_path)
    shipped = {n.rpartition("/")[0].replace("/", ".") for n in names if n.endswith("__init__.py")}
    on_disk = _packages_on_disk()
    assert "tlckpt.runtime.placement.collectives" in on_disk
    assert sorted(set(on_disk) - shipped) == [], "subpackages missing from the wheel"
    assert sorted(shipped - set(on_disk)) == [], "development-only packages in the wheel"
    modules = {
        f"{package.replace('.', '/')}/{path.name}"
        for package, folder in on_disk.items()
        for path in folder.glob("*.py")
        if not (folder == REPOSITORY and path.name == "setup.py")
    }
    sources = {n for n in names if n.endswith(".py")}
    assert sorted(modules - sources) == [], "modules missing from the wheel"
    assert sorted(sources - modules) == [], "files in the wheel that are not the library's"


def _imported_names(path: Path, package: str) -> Iterator[str]:
    """Every module name ``path`` (a module of ``package``) imports, relative ones resolved
    (``from .x import y`` yields ``package.x`` and ``package.x.y``)."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            parts = package.split(".")
            base = parts[: len(parts) - node.level + 1] if node.level else []
            target = ".".join([*base, *([node.module] if node.module else [])])
            yield target
            yield from (f"{target}.{alias.name}" for alias in node.names)


def test_the_library_never_imports_the_development_trees() -> None:
    # They are left out of the wheel, so an import of them would work in a checkout only.
    offenders = [
        f"{path.relative_to(REPOSITORY)}: {name}"
        for package, folder in _packages_on_disk().items()
        for path in sorted(folder.glob("*.py"))
        if not (folder == REPOSITORY and path.name == "setup.py")
        for name in _imported_names(path, package)
        if name.split(".")[:2] in (["tlckpt", top] for top in DEVELOPMENT_ONLY)
    ]
    assert offenders == []


def test_the_wheel_smoke_knows_every_test_helper_with_a_development_import() -> None:
    """``.ci/wheel_smoke.py`` lets a ``tlckpt.testing`` module fail to import only for the
    packages it lists: a helper that imports a development-only package (hypothesis,
    transformers) and is missing there fails CI after the suite, on the installed wheel."""
    import importlib.util

    root = Path(tlckpt.__file__).resolve().parent
    spec = importlib.util.spec_from_file_location("wheel_smoke", root / ".ci" / "wheel_smoke.py")
    assert spec is not None and spec.loader is not None
    smoke = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(smoke)
    development = {"hypothesis", "transformers"}
    for path in sorted((root / "testing").glob("*.py")):
        imported = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                imported |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imported.add(node.module.split(".")[0])
        needed = imported & development
        if needed and path.stem != "__init__":
            module = f"tlckpt.testing.{path.stem}"
            assert needed <= smoke.NEEDS.get(module, set()), (module, needed)
