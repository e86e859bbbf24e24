"""Load paths execute no code: no pickle, no eval/exec/compile, no imports, no processes.

``audit_loads.py`` runs in a fresh interpreter: it calls every TorchLean load path (codec
readers, ``inspect``, runtime loaders, the command line's ``inspect``/``validate``, the
converter's TLSF32B/JSON/safetensors readers) and every checkpoint-set path (``restore``,
``load_checkpoint``, ``verify_checkpoint``, ``tlckpt ls``/``verify``) on valid files, every
invalid vector and mutated files, once to warm up and once under ``sys.addaudithook`` with
tripwires on ``pickle``/``_pickle``/``marshal`` loaders and ``torch.load``. A canary (one
``compile``, one ``pickle.loads``) proves the hook and tripwires are live. The ``.pt``
converter is the one torch deserialisation; it must call ``torch.load`` with
``weights_only=True``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hostile_support import REPO, run_python

SCRIPT = Path(__file__).with_name("audit_loads.py")


@pytest.fixture(scope="module")
def audit(vectors_path: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    work = tmp_path_factory.mktemp("audit")
    proc = run_python([str(SCRIPT), str(vectors_path), str(work)], 300)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("AUDIT-RESULT ")), None)
    assert proc.returncode == 0 and line, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(line.removeprefix("AUDIT-RESULT "))


def test_the_watch_is_live(audit: dict) -> None:
    kinds = {e[0] for e in audit["canary"]["events"]}
    assert {"compile", "exec"} <= kinds, audit["canary"]
    assert audit["canary"]["tripped"] == ["pickle.loads"]


def test_every_load_path_ran(audit: dict) -> None:
    outcome = audit["formats"]["outcome"]
    assert outcome["ok"] > 100 and outcome["checkpoint_error"] > 500, outcome
    assert outcome["other"] == 0, audit["formats"]["non_checkpoint_errors"]
    # The unwatched warm-up pass runs the same calls: it must not raise anything else either.
    warmup = audit["formats"]["warmup_outcome"]
    assert warmup["other"] == 0, audit["formats"]["warmup_non_checkpoint_errors"]


def test_load_paths_run_no_code_and_unpickle_nothing(audit: dict) -> None:
    events = audit["formats"]["events"]
    code = [e for e in events if e[0] in ("exec", "compile")]
    unpickling = [e for e in events if e[0].startswith(("pickle.", "marshal."))]
    spawning = [
        e
        for e in events
        if e[0] not in ("exec", "compile", "import")
        and not e[0].startswith(("pickle.", "marshal."))
    ]
    assert code == [], code
    assert unpickling == [], unpickling
    assert spawning == [], spawning
    assert audit["formats"]["tripped"] == []


def test_load_paths_import_nothing(audit: dict) -> None:
    imports = [e[1] for e in audit["formats"]["events"] if e[0] == "import"]
    assert imports == [], imports


def test_pt_conversion_uses_weights_only(audit: dict) -> None:
    pt = audit["pt"]
    assert pt["error"] is None, pt
    assert pt["torch_load_calls"], pt
    for call in pt["torch_load_calls"]:
        assert call["kwargs"].get("weights_only") == "True", call
    assert [e for e in pt["events"] if e[0] in ("exec", "compile")] == [], pt["events"]


LIBRARY_FOLDERS = ("formats", "codec", "runtime", "cli", "testing")


def _library_sources() -> list[Path]:
    files = [p for p in REPO.glob("*.py")]
    for folder in LIBRARY_FOLDERS:
        files += sorted((REPO / folder).rglob("*.py"))
    return files


def test_library_source_never_unpickles_or_evaluates() -> None:
    """Static companion of the audit: no pickle/marshal/dill import, no eval/exec call, and
    every ``torch.load`` call passes ``weights_only=True`` literally."""
    import ast

    problems = []
    for path in _library_sources():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names]
                mod = getattr(node, "module", None) or ""
                for name in [mod, *names]:
                    if name.split(".")[0] in (
                        "pickle",
                        "_pickle",
                        "marshal",
                        "dill",
                        "cloudpickle",
                        "shelve",
                        "joblib",
                    ):
                        problems.append(f"{path}:{node.lineno} imports {name}")
            elif isinstance(node, ast.Call):
                func = node.func
                name = (
                    func.id
                    if isinstance(func, ast.Name)
                    else (func.attr if isinstance(func, ast.Attribute) else "")
                )
                if isinstance(func, ast.Name) and name in ("eval", "exec", "compile"):
                    problems.append(f"{path}:{node.lineno} calls {name}()")
                if (
                    name == "load"
                    and isinstance(func, ast.Attribute)
                    and getattr(func.value, "id", "") == "torch"
                ):
                    kw = {k.arg: k.value for k in node.keywords}
                    ok = (
                        isinstance(kw.get("weights_only"), ast.Constant)
                        and kw["weights_only"].value is True
                    )
                    if not ok:
                        problems.append(
                            f"{path}:{node.lineno} torch.load without weights_only=True"
                        )
    assert problems == [], problems
