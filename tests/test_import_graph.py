"""No import cycles anywhere in the package, and rooms that form layers.

The import graph is built from the source (``ast``), not by importing: every ``import`` and
``from ... import`` of every module, relative ones resolved, those inside functions included
(a deferred import still ties the two modules together). ``from package import name`` is an
edge to the submodule ``package.name`` where there is one, else to ``package``. A cycle
fails the test, naming its modules in order.

At the room level (``docs/architecture.md``): a room is a subpackage of ``codec/`` or
``runtime/``, or one of their face modules; every other top-level name of the package is a
room of its own. :data:`ALLOWED` is the table of the arrows between rooms; every import must
follow one, and the table itself has no cycle, so the rooms form layers. Also checked: no
module over :data:`MAX_LINES` lines, no name in a codec or runtime module's ``__all__`` that
the module does not define (only package ``__init__`` files re-export), every room's
``__init__`` docstring says what it may import, and few modules directly in ``codec/`` and
``runtime/``.
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
    assert {"tlckpt.runtime", "tlckpt.runtime.placement.collectives.scatter"} <= set(edges)
    # A relative module import, a relative name import, and a deferred one.
    assert "tlckpt.runtime.ops.float32_files" in edges["tlckpt.runtime.module_state"]
    assert "tlckpt.codec.errors" in edges["tlckpt.runtime.ops.state_tensors"]
    assert "tlckpt.runtime.placement.sharded_placement" in edges["tlckpt.runtime.placement.choice"]


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


# --------------------------------------------------------------------------- rooms

_CODEC_BOTTOM = {
    "formats",
    "codec.errors",
    "codec.paths",
    "codec.sniffing",
    "codec.fileio",
    "codec.values",
}
_CODEC_FAMILIES = _CODEC_BOTTOM | {
    "codec.spec",
    "codec.families",
    "codec.inspection",
    "codec.exact_json",
}
#: Every room of the codec, its face (``codec/__init__``) included: what the runtime may use.
_CODEC = _CODEC_FAMILIES | {
    "codec.model_state",
    "codec.optimizers",
    "codec.sets",
    "codec.safetensors",
    "codec.registrations",
    "codec.hf_folders",
    "codec",
}
_RUNTIME_LOW = _CODEC | {"runtime.binding", "runtime.commit", "runtime.placement"}
_RUNTIME_FACES = _RUNTIME_LOW | {
    "runtime.ops",
    "runtime.module_state",
    "runtime.optimizer",
    "runtime.hugging_face",
}
_RUNTIME = _RUNTIME_FACES | {"runtime.sets", "runtime"}
_TOP = {"optional", "runtime_names"}

#: Room -> the rooms it may import. A room missing here fails the test: a new room takes a
#: place in the table (and in docs/architecture.md) before anything imports it.
ALLOWED: dict[str, set[str]] = {
    "formats": set(),
    "optional": set(),
    "runtime_names": set(),
    "codec.paths": {"formats"},
    "codec.sniffing": {"formats"},
    "codec.errors": {"formats", "codec.paths"},
    "codec.fileio": {"codec.errors", "codec.paths"},
    "codec.values": {"formats", "codec.errors"},
    "codec.spec": _CODEC_BOTTOM,
    "codec.families": _CODEC_BOTTOM,
    "codec.exact_json": _CODEC_BOTTOM | {"codec.families"},
    "codec.inspection": _CODEC_BOTTOM | {"codec.families", "codec.exact_json"},
    "codec.model_state": _CODEC_FAMILIES,
    # Optimizer trees are safetensors files whose group options and state are exact values.
    "codec.optimizers": _CODEC_FAMILIES | {"codec.safetensors", "codec.sets"},
    "codec.sets": _CODEC_FAMILIES,
    "codec.safetensors": _CODEC_FAMILIES,
    "codec.registrations": _CODEC_FAMILIES
    | {"codec.model_state", "codec.optimizers", "codec.safetensors"},
    # Hugging Face folders export a set's model member or a model file, so they read sets
    # and the model-state families, and write the safetensors layout.
    "codec.hf_folders": _CODEC_FAMILIES | {"codec.model_state", "codec.safetensors", "codec.sets"},
    "codec": _CODEC - {"codec"},
    "runtime.binding": _CODEC,
    "runtime.commit": _CODEC,
    "runtime.placement": _CODEC | {"runtime.binding"},
    "runtime.ops": _RUNTIME_LOW,
    "runtime.module_state": _RUNTIME_LOW | {"runtime.ops"},
    "runtime.optimizer": _RUNTIME_LOW | {"runtime.ops"},
    "runtime.hugging_face": _RUNTIME_LOW | {"runtime.ops"},
    # Sets save and restore through the operations, not through the public faces.
    "runtime.sets": _RUNTIME_LOW | {"runtime.ops"},
    "runtime": (_RUNTIME - _CODEC - {"runtime"}) | _TOP,
    "tlckpt": {"codec", "runtime"} | _TOP,
    "cli": _RUNTIME | _TOP,
    # Framework plug-ins (Lightning, the Hugging Face Trainer): users of the library, like cli.
    "integrations": _RUNTIME | _TOP,
    "__main__": {"cli"},
    "setup": set(),  # the build script, beside the package's files
    "testing": _RUNTIME | _TOP,
    # Development-only trees (not in the wheel): they may use anything of the library.
    "fuzz": _RUNTIME | _TOP | {"tlckpt", "testing"},
    "bench": _RUNTIME | _TOP | {"tlckpt", "testing"},
}

#: The longest module allowed; a longer one is cut by concern.
MAX_LINES = 500


def room_of(module: str) -> str:
    """The room of a module of the package (see the module docstring)."""
    parts = module.split(".")[1:]
    if not parts:
        return "tlckpt"
    if parts[0] in ("codec", "runtime"):
        return ".".join(parts[:2])
    return parts[0]


def room_graph(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    """Room -> the rooms its modules import."""
    rooms: dict[str, set[str]] = {}
    for module, targets in edges.items():
        here = room_of(module)
        rooms.setdefault(here, set()).update(room_of(t) for t in targets if room_of(t) != here)
    return rooms


def test_every_room_is_in_the_table() -> None:
    rooms = set(room_graph(graph(ROOT, "tlckpt")))
    assert rooms - set(ALLOWED) == set(), "rooms without a row in ALLOWED"


def test_every_arrow_between_rooms_is_allowed() -> None:
    edges = graph(ROOT, "tlckpt")
    wrong = sorted(
        f"{module} -> {target}"
        for module, targets in edges.items()
        for target in targets
        if room_of(target) != room_of(module)
        and room_of(target) not in ALLOWED.get(room_of(module), set())
    )
    assert wrong == [], "imports against the room table:\n" + "\n".join(wrong)


def test_the_rooms_form_layers() -> None:
    # The table has no cycle, so no import that follows it can close one between rooms.
    assert [" -> ".join(c) for c in cycles(ALLOWED)] == []
    assert [" -> ".join(c) for c in cycles(room_graph(graph(ROOT, "tlckpt")))] == []


def test_the_room_checks_see_a_wrong_arrow(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    for folder in ("codec/fileio", "codec/sets"):
        (package / folder).mkdir(parents=True)
    for init in ("", "codec/", "codec/fileio/", "codec/sets/"):
        (package / f"{init}__init__.py").write_text("")
    (package / "codec" / "fileio" / "source.py").write_text("from ..sets import commit\n")
    (package / "codec" / "sets" / "commit.py").write_text("from ..fileio import source\n")
    rooms = room_graph(graph(package, "pkg"))
    assert rooms["codec.fileio"] == {"codec.sets"}
    assert "codec.sets" not in ALLOWED["codec.fileio"]
    assert list(cycles(rooms)) == [["codec.fileio", "codec.sets", "codec.fileio"]]


def test_no_module_is_too_long() -> None:
    long = sorted(
        f"{name}: {n} lines"
        for name, (path, _) in modules(ROOT, "tlckpt").items()
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    )
    assert long == [], f"modules over {MAX_LINES} lines"


def defined_names(tree: ast.Module) -> set[str]:
    """The names a module binds itself at its top level (imports excluded)."""
    names: set[str] = set()
    for node in tree.body:
        for n in ast.walk(node) if isinstance(node, (ast.If, ast.Try)) else [node]:
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(n.name)
            elif isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                for target in n.targets if isinstance(n, ast.Assign) else [n.target]:
                    names.update(x.id for x in ast.walk(target) if isinstance(x, ast.Name))
    return names


def exported_names(tree: ast.Module) -> list[str]:
    """The strings of a module's literal ``__all__`` (none when it has none)."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            return [e.value for e in node.value.elts if isinstance(e, ast.Constant)]
    return []


def test_no_module_forwards_another_modules_names() -> None:
    forwarded = []
    for name, (path, is_package) in modules(ROOT, "tlckpt").items():
        if is_package or not name.startswith(("tlckpt.codec.", "tlckpt.runtime.")):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        defined = defined_names(tree)
        forwarded += [f"{name}.{n}" for n in exported_names(tree) if n not in defined]
    assert forwarded == [], "names in __all__ that the module does not define"


def test_every_room_says_what_it_holds_and_may_import() -> None:
    found = modules(ROOT, "tlckpt")
    rooms = [
        name
        for name, (_, is_package) in found.items()
        if is_package
        and name.count(".") == 2
        and name.startswith(("tlckpt.codec", "tlckpt.runtime"))
    ]
    assert len(rooms) >= 10
    for room in rooms:
        doc = ast.get_docstring(ast.parse(found[room][0].read_text(encoding="utf-8")))
        assert doc and "May import" in doc, f"{room}/__init__.py says nothing of its imports"


def test_few_modules_sit_directly_in_codec_and_runtime() -> None:
    found = modules(ROOT, "tlckpt")
    for top, most in (("tlckpt.codec", 10), ("tlckpt.runtime", 8)):
        direct = [n for n, (_, pkg) in found.items() if n.rpartition(".")[0] == top and not pkg]
        assert len(direct) + 1 <= most, f"{top}: {sorted(direct)}"
