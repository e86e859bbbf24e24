"""Helpers for the hostile-input and crash-safety tests (short CI versions of fuzz/).

The full campaigns live in ``fuzz/`` at the repository root (one command each, see
``fuzz/README.md``); these tests run them briefly, as subprocesses where they fork, kill or
install audit hooks, so that the test process itself stays clean.

``fuzz`` is not an installed package: :func:`fuzz_module` imports its modules from the
repository by path (without putting the repository root, and so bare ``codec``/``runtime``
names, on ``sys.path``), under a package name of their own: ``fuzz`` itself may already name
something else here (pytest names the repository root's package after its folder).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tlckpt.testing.vectors import vectors_dir

REPO = Path(__file__).resolve().parents[2]
VECTORS = vectors_dir()


#: The name the harness package is imported under in the test process.
FUZZ_PACKAGE = "_tlckpt_fuzz_harness"


def fuzz_module(name: str) -> ModuleType:
    """``fuzz.<name>`` imported from ``<repo>/fuzz`` (as ``FUZZ_PACKAGE.<name>``)."""
    if FUZZ_PACKAGE not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            FUZZ_PACKAGE,
            REPO / "fuzz" / "__init__.py",
            submodule_search_locations=[str(REPO / "fuzz")],
        )
        if spec is None or spec.loader is None:  # pragma: no cover - the folder is there
            raise ImportError("cannot find the fuzz package")
        module = importlib.util.module_from_spec(spec)
        sys.modules[FUZZ_PACKAGE] = module
        spec.loader.exec_module(module)
    return importlib.import_module(f"{FUZZ_PACKAGE}.{name}")


def child_env() -> dict[str, str]:
    """Environment for campaign subprocesses: one thread each (the CI machine has 2 cores)."""
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("MKL_NUM_THREADS", "1")
    env["TLCKPT_VECTORS"] = str(VECTORS)
    return env


def run_python(
    args: list[str], timeout: float, what: str | None = None
) -> subprocess.CompletedProcess:
    """``python args`` in a child process from the repository root (:func:`child_env`), its
    output captured as text; a child still running after ``timeout`` seconds is killed and
    fails the test (naming ``what`` it was, by default its command line), whatever its
    exit status would have been."""
    try:
        return subprocess.run(
            [sys.executable, *args],
            cwd=REPO,
            env=child_env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:  # a hang is a failure, with what it printed
        out = exc.stdout[-4000:] if isinstance(exc.stdout, bytes) else exc.stdout
        pytest.fail(f"{what or ' '.join(args)} did not finish in {timeout} s; output: {out}")


def run_campaign(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    """``python -m fuzz.<...> args`` from the repository root; fails the test on timeout."""
    return run_python(["-m", *args], timeout)


def campaign_report(args: list[str], timeout: float) -> tuple[dict, subprocess.CompletedProcess]:
    """:func:`run_campaign`, then the JSON report it printed; fails the test (with the
    campaign's output) when it printed none."""
    proc = run_campaign(args, timeout)
    report = last_json(proc.stdout)
    if not report:
        pytest.fail(proc.stdout + proc.stderr[-3000:])
    return report, proc


def last_json(text: str) -> dict:
    """The first JSON object a campaign prints on a line of its own (``{`` then newline)."""
    start = text.find("{\n")
    if start < 0:
        return {}
    value, _ = json.JSONDecoder().raw_decode(text[start:])
    return value
