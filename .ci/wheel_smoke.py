"""First use of an installed tlckpt, run by ``.ci/check_wheel.sh`` in a fresh virtual
environment, from a folder outside the checkout (so ``import tlckpt`` is the installed copy).

1. The installed copy is the one imported, and it holds every module of the checkout's
   package folders (the development-only trees aside, :data:`DEVELOPMENT_ONLY`).
2. Every installed source file compiles, and every module imports. Without torch
   (``--no-torch``), the runtime's modules fail with the one-line
   :class:`tlckpt.MissingDependencyError` naming ``tlckpt[torch]``, the test helpers
   documented as needing a test dependency fail with that package missing (see
   :data:`NEEDS`), and everything else imports; the runtime's names on ``tlckpt`` are an
   ``AttributeError`` saying what to install.
3. With torch: a model and AdamW through ``save_module_state``/``save_optimizer`` and back,
   bit for bit; a ``CheckpointManager`` background save, waited for, restored; the set
   verified by the command line (``python -m tlckpt`` and the ``tlckpt`` console script);
   ``tlckpt demo``. Without torch: the codec's writers and readers on numpy arrays (NaN
   payloads, -0.0 and subnormals bit for bit), ``inspect`` and ``validate`` on the command
   line, ``tlckpt demo --codec``, and ``verify``/``ls`` of the set the torch run wrote.

Exits non-zero on the first failure, saying what failed.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import pkgutil
import subprocess
import sys
import time
from pathlib import Path

#: Test helpers shipped in ``tlckpt.testing`` that need a package no extra installs (their
#: docstrings say so): module → the top-level packages it may find missing.
NEEDS = {
    "tlckpt.testing.strategies": {"hypothesis"},
    "tlckpt.testing.value_strategies": {"hypothesis"},
    "tlckpt.testing.models": {"torch"},
    "tlckpt.testing.bitwise": {"torch"},
    "tlckpt.testing.recipes": {"torch", "transformers"},
    "tlckpt.testing.s3_server": {"moto", "fsspec", "s3fs"},
}

#: Top-level folders of the checkout that are not the library (as in setup.py, stated again
#: here so that the check does not take the build's word for what the package is).
DEVELOPMENT_ONLY = {"tests", "fuzz", "bench", "docs"}

#: The hint every torch-less failure of a runtime module or name must carry.
TORCH_HINT = "pip install 'tlckpt[torch]'"


class SmokeFailure(Exception):
    """A check failed; the message says which and why."""


def check(condition: bool, message: str) -> None:
    """Raise :class:`SmokeFailure` with ``message`` unless ``condition`` holds."""
    if not condition:
        raise SmokeFailure(message)


def package_modules(root: Path, skip: set[str]) -> set[str]:
    """Every module of the package whose folder is ``root``, as ``tlckpt.…`` names: the
    ``.py`` files of ``root`` and of its subfolders that are packages (an ``__init__.py``
    in each folder on the way), top-level folders in ``skip`` left out."""
    modules: set[str] = set()

    def walk(folder: Path, prefix: str) -> None:
        for path in sorted(folder.iterdir()):
            if path.is_dir() and (path / "__init__.py").is_file():
                if not (folder == root and path.name in skip):
                    walk(path, f"{prefix}.{path.name}")
            elif path.suffix == ".py" and not (folder == root and path.name == "setup.py"):
                name = prefix if path.stem == "__init__" else f"{prefix}.{path.stem}"
                modules.add(name)

    walk(root, "tlckpt")
    return modules


def installed_modules(package_path: list[str]) -> set[str]:
    """Every module of the installed package, found with :mod:`pkgutil` without importing."""
    modules = {"tlckpt"}

    def walk(paths: list[str], prefix: str) -> None:
        for info in pkgutil.iter_modules(paths, prefix):
            modules.add(info.name)
            if info.ispkg:
                walk([os.path.join(paths[0], info.name.rpartition(".")[2])], info.name + ".")

    walk(package_path, "tlckpt.")
    return modules


def check_installed_copy(checkout: Path) -> set[str]:
    """The imported ``tlckpt`` is this environment's, and it holds the checkout's modules.

    Returns:
        The installed modules' names.
    """
    import tlckpt

    where = Path(tlckpt.__file__).resolve()
    check(
        where.is_relative_to(Path(sys.prefix).resolve()),
        f"tlckpt imported from {where}, not from this environment ({sys.prefix})",
    )
    check(
        not where.is_relative_to(checkout.resolve()),
        f"tlckpt imported from the checkout ({where})",
    )
    installed = installed_modules(list(tlckpt.__path__))
    wanted = package_modules(checkout, DEVELOPMENT_ONLY)
    missing = sorted(wanted - installed)
    check(not missing, f"the wheel lacks modules of the checkout: {missing}")
    extra = sorted(installed - wanted)
    check(not extra, f"the wheel holds modules the checkout's package does not: {extra}")
    print(f"installed copy: {where.parent} ({len(installed)} modules, as in the checkout)")
    return installed


def compile_everything(package_path: list[str]) -> None:
    """Every installed source file compiles with this Python (the runtime's modules too,
    which an environment without torch cannot import: 3.11-only syntax shows here)."""
    files = sorted(Path(package_path[0]).rglob("*.py"))
    for path in files:
        try:
            compile(path.read_bytes(), str(path), "exec", dont_inherit=True)
        except SyntaxError as exc:
            raise SmokeFailure(f"{path} does not compile on Python {sys.version}: {exc}") from exc
    print(f"compiled {len(files)} source files")


def import_everything(modules: set[str], with_torch: bool) -> None:
    """Import each module; without torch, only the documented failures are accepted."""
    from tlckpt.optional import MissingDependencyError

    imported, refused = 0, []
    for name in sorted(modules - {"tlckpt.__main__"}):  # __main__ runs the command line
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            top = (exc.name or "").partition(".")[0]
            if with_torch:
                raise SmokeFailure(f"import {name}: {exc!r}") from exc
            if name == "tlckpt.runtime" or name.startswith("tlckpt.runtime."):
                check(
                    isinstance(exc, MissingDependencyError) and TORCH_HINT in str(exc),
                    f"import {name} without torch: {exc!r} (want the MissingDependencyError"
                    f" naming {TORCH_HINT})",
                )
            else:
                check(
                    top in NEEDS.get(name, set()),
                    f"import {name} without torch: {exc!r} (it must import)",
                )
            refused.append(f"{name} ({top})")
        else:
            imported += 1
    print(f"imported {imported} modules" + (f"; refused as documented: {len(refused)}"))
    if with_torch:
        return
    import tlckpt

    for name in tlckpt.RUNTIME_NAMES:
        try:
            getattr(tlckpt, name)
        except AttributeError as exc:
            check(TORCH_HINT in str(exc), f"tlckpt.{name} without torch: {exc!r}")
        else:
            raise SmokeFailure(f"tlckpt.{name} resolved without torch")
    check(not hasattr(tlckpt, "save_module_state"), "hasattr(tlckpt, runtime name) is True")


def run(*args: str | os.PathLike, expect: int = 0) -> str:
    """Run a command; its standard output (fail on another exit status)."""
    out = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=300)
    check(
        out.returncode == expect,
        f"{' '.join(map(str, args))}: exit {out.returncode}, want {expect}\n"
        f"stdout: {out.stdout[-2000:]}\nstderr: {out.stderr[-2000:]}",
    )
    return out.stdout


def cli(*args: str | os.PathLike, expect: int = 0) -> str:
    """``python -m tlckpt ARGS``."""
    return run(sys.executable, "-m", "tlckpt", *args, expect=expect)


def console_script() -> Path:
    """The ``tlckpt`` entry point installed next to this interpreter."""
    script = Path(sys.executable).parent / "tlckpt"
    check(script.is_file(), f"no console script at {script}")
    return script


def torch_smoke(work: Path, set_dir: Path) -> None:
    """First use with torch: files, a background set save and restore, the command line."""
    import torch

    import tlckpt

    check(torch.version.cuda is None, f"a CUDA build of torch was installed: {torch.__file__}")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(5, 16)).square().sum().backward()
        opt.step()
    tlckpt.save_module_state(model, work / "model.tlsf32")
    tlckpt.save_optimizer(opt, model, work / "opt.tladam")

    fresh = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=1e-2, weight_decay=0.01)
    tlckpt.load_module_state(fresh, work / "model.tlsf32")
    tlckpt.load_optimizer(fresh_opt, fresh, work / "opt.tladam")
    same_model = all(
        torch.equal(a, b) for a, b in zip(model.state_dict().values(), fresh.state_dict().values())
    )
    check(same_model, "the model loaded from TLSF32B differs from the saved one")
    for p, q in zip(model.parameters(), fresh.parameters()):
        for key in ("exp_avg", "exp_avg_sq"):
            check(torch.equal(opt.state[p][key], fresh_opt.state[q][key]), f"AdamW {key} differs")
    print("save/load of a model and AdamW: bit-exact")

    manager = tlckpt.CheckpointManager(set_dir, keep_last=2)
    handle = manager.save(3, model=model, optimizer=opt, extra={"epoch": 1}, blocking=False)
    manager.wait()
    check(handle.done(), "the background save is not done after wait()")
    again = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    again_opt = torch.optim.AdamW(again.parameters(), lr=1e-2, weight_decay=0.01)
    restored = tlckpt.CheckpointManager(set_dir).restore(model=again, optimizer=again_opt)
    check(restored.step == 3 and restored.extra == {"epoch": 1}, f"restored {restored}")
    for a, b in zip(model.parameters(), again.parameters()):
        check(torch.equal(a, b), "a restored parameter differs")
    print("CheckpointManager: background save, wait, restore: bit-exact")

    check("TLADAMF" in cli("inspect", work / "opt.tladam"), "inspect does not name TLADAMF")
    run(console_script(), "inspect", work / "model.tlsf32")
    committed = [p for p in set_dir.iterdir() if p.is_dir()]
    check(len(committed) == 1, f"{set_dir} holds {committed}, want the set of step 3")
    run(console_script(), "verify", committed[0])
    check("3" in cli("ls", set_dir), "tlckpt ls does not list step 3")
    started = time.monotonic()
    demo = cli("demo")
    check("BIT-IDENTICAL" in demo, f"tlckpt demo: {demo[-1000:]}")
    print(f"tlckpt demo: bit-identical ({time.monotonic() - started:.1f} s)")


def codec_smoke(work: Path, set_dir: Path | None) -> None:
    """First use without torch: the codec on numpy arrays, the command line."""
    import numpy as np

    import tlckpt

    words = np.array([0x7FC00001, 0x80000000, 0x00000001, 0x3F800000, 0xFF800000], np.uint32)
    state = [words.view(np.float32).reshape(5), np.arange(6, dtype=np.float32).reshape(2, 3)]
    tlckpt.write_float32_state(work / "state.tlsf32", state)
    back = tlckpt.read_float32_state(work / "state.tlsf32", [a.shape for a in state])
    for a, b in zip(state, back):
        check(a.tobytes() == np.asarray(b).tobytes(), "TLSF32B round trip is not bit-exact")
    tlckpt.write_state_bits(work / "state.json", state, "float32")
    back = tlckpt.read_state_bits(work / "state.json", [a.shape for a in state], "float32")
    for a, b in zip(state, back):
        check(a.tobytes() == np.asarray(b).tobytes(), "exact-bits JSON round trip differs")
    schema = tlckpt.ParameterSchema([(5,), (2, 3)], [True, True])
    config = tlckpt.AdamConfig(
        tlckpt.AdamKind.ADAMW, 0.9, 0.999, 1e-8, 0.01, tlckpt.MomentDtype.FLOAT32
    )
    entries = {
        0: tlckpt.AdamEntry(7, state[0], np.abs(state[1]).reshape(-1)[:5]),
        1: tlckpt.AdamEntry(7, state[1].reshape(-1), state[1].reshape(-1)),
    }
    tlckpt.write_adam(work / "opt.tladam", schema, config, entries)
    read = tlckpt.read_adam(work / "opt.tladam", schema)
    for slot, entry in entries.items():
        got = read.entries[slot]
        check(got.step == entry.step, f"slot {slot}: step {got.step}")
        check(np.asarray(got.m).tobytes() == np.asarray(entry.m).tobytes(), f"slot {slot}: m")
    print("codec round trips (TLSF32B, exact-bits JSON, TLADAMF): bit-exact")

    check("TLADAMF" in cli("inspect", work / "opt.tladam"), "inspect does not name TLADAMF")
    run(console_script(), "inspect", work / "state.tlsf32")
    cli("validate", work / "opt.tladam", "--against", work / "opt.tladam")
    (work / "broken.tladam").write_bytes((work / "opt.tladam").read_bytes()[:-3])
    cli("validate", work / "broken.tladam", expect=1)
    check("bit-exact: True" in cli("demo", "--codec"), "tlckpt demo --codec is not bit-exact")
    cli("demo", expect=1)  # the training demo says torch is needed
    print("command line: inspect, validate, demo --codec")
    if set_dir is not None:
        committed = sorted(p for p in set_dir.iterdir() if p.is_dir())
        check(bool(committed), f"no set in {set_dir}")
        tlckpt.verify_checkpoint(committed[-1])
        cli("verify", committed[-1])
        check("3" in cli("ls", set_dir), "tlckpt ls does not list step 3")
        print(f"the set written with torch verifies here ({committed[-1].name})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("--checkout", type=Path, required=True, help="the repository root")
    parser.add_argument("--work", type=Path, required=True, help="a scratch folder")
    parser.add_argument(
        "--set-dir",
        type=Path,
        required=True,
        help="checkpoint sets: written with torch, verified without",
    )
    parser.add_argument("--no-torch", action="store_true", help="an environment without torch")
    args = parser.parse_args()
    if str(args.checkout.resolve()) in map(os.path.abspath, sys.path):
        print("the checkout is on sys.path", file=sys.stderr)
        return 1
    try:
        modules = check_installed_copy(args.checkout)
        compile_everything(list(importlib.import_module("tlckpt").__path__))
        import_everything(modules, with_torch=not args.no_torch)
        if args.no_torch:
            check(importlib.util.find_spec("torch") is None, "torch is installed here")
            codec_smoke(args.work, args.set_dir if args.set_dir.is_dir() else None)
        else:
            torch_smoke(args.work, args.set_dir)
    except SmokeFailure as exc:
        print(f"FAILED (Python {sys.version.split()[0]}): {exc}", file=sys.stderr)
        return 1
    print(f"Python {sys.version.split()[0]}: the installed tlckpt works")
    return 0


if __name__ == "__main__":
    sys.exit(main())
