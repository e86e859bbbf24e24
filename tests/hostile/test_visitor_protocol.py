"""Every walker visitor, in the package and in ``fuzz/``, has the hooks' exact signatures.

The walker calls ``on_field``, ``payload_buffer``, ``payload_done`` and ``record_template``
by position; a visitor whose hook takes other parameters fails only when the walker reaches
that hook, with a ``TypeError`` a broad ``except`` can hide (that is how the mutation
campaign's field map once stopped at the first payload). ``runtime_checkable`` protocols
check method names only, so the signatures are compared here parameter by parameter.

Visitor classes are found in the sources (a class that derives from ``Visitor`` or defines a
hook), so a new one is checked without being listed; each must be defined at module level,
where this test can import it.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path
from typing import Any

import pytest
from hostile_support import REPO, fuzz_module

from tlckpt.codec.spec.walker import Visitor, VisitorProtocol

#: The hooks: every method the Protocol declares.
HOOKS = tuple(
    name
    for name, member in vars(VisitorProtocol).items()
    if callable(member) and not name.startswith("_")
)
#: Source folders → the package their modules are imported as (``None``: ``fuzz``).
FOLDERS = {
    "codec": "tlckpt.codec",
    "formats": "tlckpt.formats",
    "runtime": "tlckpt.runtime",
    "cli": "tlckpt.cli",
    "testing": "tlckpt.testing",
    "fuzz": None,
}


def _signature(fn: Any) -> list[tuple[str, str]]:
    return [(p.name, p.kind.name) for p in inspect.signature(fn).parameters.values()]


def protocol_mismatches(cls: type) -> list[str]:
    """How ``cls``'s hooks differ from :class:`VisitorProtocol`'s (empty: they do not)."""
    out = []
    for name in HOOKS:
        impl = getattr(cls, name, None)
        if impl is None:
            out.append(f"{cls.__qualname__} has no {name}")
            continue
        want, got = _signature(getattr(VisitorProtocol, name)), _signature(impl)
        if got != want:
            out.append(f"{cls.__qualname__}.{name}{got} != {want}")
    return out


def _is_visitor(node: ast.ClassDef) -> bool:
    bases = {b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases}
    defines = {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
    return bool(bases & {"Visitor", "VisitorProtocol"} or defines & set(HOOKS))


def _visitor_sources() -> list[tuple[str, str, bool]]:
    """``(folder/module, class name, defined at module level)`` for each visitor class, in
    the folder and every subpackage of it (``codec/spec/walker``)."""
    found = []
    for folder in FOLDERS:
        for path in sorted((REPO / folder).rglob("*.py")):
            module = path.relative_to(REPO).with_suffix("").as_posix()
            tree = ast.parse(path.read_text(), filename=str(path))
            top = {id(n) for n in tree.body}
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef) and _is_visitor(node):
                    if node.name == "VisitorProtocol":
                        continue
                    found.append((module, node.name, id(node) in top))
    return found


def _import(where: str) -> Any:
    folder, module = where.split("/", 1)
    package = FOLDERS[folder]
    if package is None:
        return fuzz_module(module)
    return importlib.import_module(f"{package}.{module.replace('/', '.')}")


VISITORS = _visitor_sources()


def test_the_walker_calls_only_the_protocols_hooks() -> None:
    """Every ``visitor.X`` / ``self.visitor.X`` in the walker is a hook of the Protocol, and
    the default ``Visitor`` has no public method the Protocol lacks."""
    tree = ast.parse((REPO / "codec" / "spec" / "walker.py").read_text())
    called = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        owner = node.value
        if (isinstance(owner, ast.Name) and owner.id == "visitor") or (
            isinstance(owner, ast.Attribute) and owner.attr == "visitor"
        ):
            called.add(node.attr)
    assert {"on_field", "payload_buffer", "payload_done"} <= called  # the scan sees calls
    assert called <= set(HOOKS)
    public = {n for n, m in vars(Visitor).items() if callable(m) and not n.startswith("_")}
    assert public == set(HOOKS)


def test_the_known_visitors_are_found() -> None:
    names = {(where, name) for where, name, _ in VISITORS}
    assert {
        ("codec/spec/walker", "Visitor"),
        ("codec/optimizers/adam", "_AdamReader"),
        ("codec/model_state/float32_state", "_StateReader"),
        ("codec/optimizers/optimizer_reader", "OptimizerReader"),
        ("fuzz/mutators", "Recorder"),
    } <= names, names


@pytest.mark.parametrize(("where", "name", "top_level"), VISITORS, ids=lambda v: str(v))
def test_visitor_matches_the_protocol(where: str, name: str, top_level: bool) -> None:
    assert top_level, f"{where}.{name}: define visitors at module level, where this test sees them"
    cls = getattr(_import(where), name)
    assert issubclass(cls, VisitorProtocol)
    assert protocol_mismatches(cls) == []


def test_a_drifted_signature_is_caught() -> None:
    """The check can fail: the old field-map visitor, whose ``payload_buffer`` lacked
    ``offset``, passes ``runtime_checkable``'s name check but not this one."""

    class Drifted(Visitor):
        def payload_buffer(self, path, count, dtype, ctx):  # type: ignore[override]
            return None

    assert isinstance(Drifted(), VisitorProtocol)  # names only: blind to the drift
    assert protocol_mismatches(Drifted) == [
        "test_a_drifted_signature_is_caught.<locals>.Drifted.payload_buffer"
        "[('self', 'POSITIONAL_OR_KEYWORD'), ('path', 'POSITIONAL_OR_KEYWORD'),"
        " ('count', 'POSITIONAL_OR_KEYWORD'), ('dtype', 'POSITIONAL_OR_KEYWORD'),"
        " ('ctx', 'POSITIONAL_OR_KEYWORD')] != [('self', 'POSITIONAL_OR_KEYWORD'),"
        " ('path', 'POSITIONAL_OR_KEYWORD'), ('count', 'POSITIONAL_OR_KEYWORD'),"
        " ('dtype', 'POSITIONAL_OR_KEYWORD'), ('ctx', 'POSITIONAL_OR_KEYWORD'),"
        " ('offset', 'POSITIONAL_OR_KEYWORD')]"
    ]


def test_every_source_folder_exists() -> None:
    # A renamed folder would silently drop its visitors from the check.
    missing = [f for f in FOLDERS if not (Path(REPO) / f).is_dir()]
    assert missing == []
