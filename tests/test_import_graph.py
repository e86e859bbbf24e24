"""No import cycles anywhere in the package.

The import graph is built from the source (``ast``), not by importing: every ``import`` and
``from ... import`` of every module, relative ones resolved, those inside functions included
(a deferred import still ties the two modules together). ``from package import name`` is an
edge to the submodule ``package.name`` where there is one, else to ``package``. A cycle
fails the test, naming its modules in order.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import tlckpt

ROOT = Path(tlckpt.__file__).resolve().parent
NOT_THE_PACKAGE = {"tests", "docs", "build"}


def modules(root: Path, name: str) -> dict[str, tuple[Path, bool]]:
    """Module name → (file, whether it is a package's ``__init__``), for the package at
    ``root`` and every subpackage (a folder with an ``__init__.py``)."""
    found: dict[str, tuple[Path, bool]] = {}

    def walk(folder: Path, dotted: str) -> None:
        for path in sorted(folder.iterdir()):
            if path.is_dir():
                if (path / "__init__.py").is_file() and path.name not in NOT_THE_PACKAGE:
                    walk(path, f"{dotted}.{path.name}")
            elif path.suffix == ".py":
                is_package = path.name == "__init__.py"
                found[dotted if is_package else f"{dotted}.{path.stem}"] = (path, is_package)

    walk(root, name)
    return found


def _known(name: str, known: dict[str, tuple[Path, bool]]) -> str | None:
    """The longest prefix of a dotted name that is a module of the package."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def imports(module: str, path: Path, is_package: bool, known: dict) -> set[str]:
    """The package's modules that ``module`` imports, anywhere in its source."""
    base = module if is_package else module.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            targets = [_known(alias.name, known) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = base.split(".")
                parts = parts[: len(parts) - (node.level - 1)]
                source = ".".join([*parts, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            targets = [_known(f"{source}.{alias.name}", known) for alias in node.names]
        else:
            continue
        out.update(t for t in targets if t is not None and t != module)
    return out


def graph(root: Path, name: str) -> dict[str, set[str]]:
    known = modules(root, name)
    return {m: imports(m, path, pkg, known) for m, (path, pkg) in known.items()}


def cycles(edges: dict[str, set[str]]) -> Iterator[list[str]]:
    """One cycle (its modules in import order, the first repeated last) per strongly
    connected group of modules that import each other."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def connect(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in sorted(edges):
        if v not in index:
            connect(v)
    for group in groups:
        yield _a_cycle(group, edges)


def _a_cycle(group: set[str], edges: dict[str, set[str]]) -> list[str]:
    """A path through ``group`` from its first module back to it."""
    start = min(group)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        v = frontier.pop(0)
        for w in sorted(edges[v] & group):
            if w == start:
                return [*paths[v], start]
            if w not in paths:
                paths[w] = [*paths[v], w]
                frontier.append(w)
    raise AssertionError(f"no cycle through {start} in {sorted(group)}")


def test_the_package_has_no_import_cycle() -> None:
    edges = graph(ROOT, "tlckpt")
    found = [" -> ".join(cycle) for cycle in cycles(edges)]
    assert found == [], "import cycles:\n" + "\n".join(found)


def test_the_graph_sees_the_imports() -> None:
    edges = graph(ROOT, "tlckpt")
    assert {"tlckpt.runtime", "tlckpt.runtime.collectives.scatter", "tlckpt.codec"} <= set(edges)
    # A relative module import, a relative name import, and a deferred one.
    assert "tlckpt.runtime.float32_files" in edges["tlckpt.runtime.module_state"]
    assert "tlckpt.codec.errors" in edges["tlckpt.runtime.state_tensors"]
    assert "tlckpt.runtime.sharded_placement" in edges["tlckpt.runtime.placement"]


def test_a_cycle_through_a_deferred_import_is_found(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("from .b import B\n")
    (package / "a.py").write_text("from .sub import b\n")
    (package / "sub" / "b.py").write_text("B = 1\n\ndef later():\n    from ..a import x\n")
    (package / "c.py").write_text("import pkg.a\n")
    edges = graph(package, "pkg")
    assert edges["pkg.a"] == {"pkg.sub.b"}
    assert edges["pkg.sub"] == {"pkg.sub.b"}
    assert edges["pkg.c"] == {"pkg.a"}
    assert list(cycles(edges)) == [["pkg.a", "pkg.sub.b", "pkg.a"]]
