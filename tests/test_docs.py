"""The documentation stays true: generated reference up to date, examples run, API complete.

* ``docs/format-reference.md`` equals what ``docs/gen_format_reference.py`` renders now;
* every Python block of ``docs/guide.md``, ``docs/extending.md`` and the README's example
  runs (in order, one namespace per page, in a temporary folder);
* every name in ``tlckpt.__all__`` is documented in ``docs/api.md`` with its real parameters,
  and nothing there is stale;
* every command and option of the CLI appears in ``docs/cli.md``;
* relative links between the pages point at files that exist.
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import io
import linecache
import re
import struct
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tlckpt
from tlckpt import cli
from tlckpt.codec import (
    AdamKind,
    CheckpointError,
    OptimizerEntry,
    ParameterSchema,
    ParamGroupConfig,
    TrailingDataError,
    TruncatedError,
    scan_adam,
    scan_float32_state,
    scan_optimizer_state,
)
from tlckpt.codec.optimizers.tlckpt_optimizer_writer import write_optimizer_state
from tlckpt.formats import ADAM_MAGIC, lookup, registry, unregister
from tlckpt.testing.vectors import vectors_dir

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.glob("*.md"))
_FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)


def python_blocks(text: str) -> list[str]:
    """The ```python fenced blocks of a Markdown text, in order."""
    return [body for lang, body in _FENCE.findall(text) if lang == "python"]


def run_blocks(blocks: list[str], name: str) -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": f"docs_{name}"}
    for k, block in enumerate(blocks):
        filename = f"<{name} block {k}>"
        # Register the source so that a failing example shows its lines in the traceback.
        linecache.cache[filename] = (len(block), None, block.splitlines(True), filename)
        exec(compile(block, filename, "exec"), namespace)
    return namespace


def _generator() -> Any:
    spec = importlib.util.spec_from_file_location(
        "gen_format_reference", DOCS / "gen_format_reference.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while defining
    spec.loader.exec_module(module)
    return module


# --------------------------------------------------------------------------- format reference


def test_format_reference_is_up_to_date() -> None:
    generated = _generator().render()
    checked_in = (DOCS / "format-reference.md").read_text(encoding="utf-8")
    assert generated == checked_in, (
        "docs/format-reference.md is stale: run python docs/gen_format_reference.py"
    )


def test_format_reference_covers_every_registered_version() -> None:
    text = (DOCS / "format-reference.md").read_text(encoding="utf-8")
    for magic in registry.FAMILIES:
        for version in registry.known_versions(magic):
            assert f"### `{magic.decode()}` version {version} " in text
    for name, fmt in tlckpt.formats.ENCODINGS.items():
        assert f"`{name}` | `{fmt.tag}`" in text


def test_format_reference_offsets_match_the_files(tmp_path: Path) -> None:
    """Spot-check the generated offsets against real bytes: v5's counter flag and counter."""
    rows = {r.path: r for r in _generator().spec_rows(tlckpt.formats.ADAM_V5)}
    assert rows["dtype_tag"].offset == "15" and rows["counter_flag"].offset == "63"
    assert rows["random_counter"].size == "8 if counter_flag == 1, else 0"
    assert rows["schema.slot_count"].offset == "end(random_counter) + 0"
    assert rows["entries[i].m"].size == "count \u00d7 4 (dtype_tag 0) or 8 (dtype_tag 1)"
    data = (vectors_dir() / "adam_v5_f64_tied_counter.tladam").read_bytes()
    assert int.from_bytes(data[63:71], "little") == 1  # counter_flag present
    assert int.from_bytes(data[71:79], "little") == 9223372036854775813


def test_generator_check_mode(tmp_path: Path) -> None:
    gen = _generator()
    out, rules = tmp_path / "ref.md", tmp_path / "format.md"
    rules.write_text((DOCS / "format.md").read_text(encoding="utf-8"), encoding="utf-8")
    paths = ["--output", str(out), "--format-md", str(rules)]
    assert gen.main(paths) == 0
    assert gen.main(["--check", *paths]) == 0
    out.write_text(out.read_text() + "edited\n")
    assert gen.main(["--check", *paths]) == 1
    assert gen.main(paths) == 0
    rules.write_text(rules.read_text().replace("`TLCKOPT`", "`TLXXXXX`"))
    assert gen.main(["--check", *paths]) == 1


def test_format_md_lists_every_magic() -> None:
    # §1's magic row is generated from the family registry (it once named two of three).
    gen = _generator()
    text = (DOCS / "format.md").read_text(encoding="utf-8")
    assert gen.with_magic_list(text) == text, "docs/format.md is stale: run the generator"
    start, end = gen.MAGIC_MARKERS
    listed = text.partition(start)[2].partition(end)[0]
    assert registry.FAMILIES, "no binary family registered"
    for magic in registry.FAMILIES:
        assert f"`{magic.decode()}`" in listed


def _optimizer_seed() -> bytes:
    """A TLCKOPT file with two groups (one amsgrad), a frozen slot, an alias, moments of two
    dtypes and a trainable slot without state."""
    schema = ParameterSchema(
        [(2,), (2,), (3,), (1,), ()], [True, True, True, False, True], [0, 0, 2, None, 4]
    )
    groups = [
        ParamGroupConfig(AdamKind.ADAMW, 0.9, 0.999, 1e-8, 0.01, 1e-3, amsgrad=True),
        ParamGroupConfig(AdamKind.ADAM, 0.8, 0.99, 1e-6, 0.0, 1e-2),
    ]
    f32, f64 = np.arange(2, dtype=np.float32), np.arange(3, dtype=np.float64)
    entries = {
        0: OptimizerEntry(3, "float32", f32, f32, f32),
        2: OptimizerEntry(3, "float64", f64, f64, f64),
    }
    out = io.BytesIO()
    write_optimizer_state(out, schema, groups, [0, None, 0, None, 1], entries, random_counter=5)
    return out.getvalue()


def _rejected_fields(data: bytes) -> set[str]:
    """Every field a reader (with the file alone) names when one u64 of ``data``, at any byte
    offset, is replaced by a telling value; record indices read ``[i]``. Size errors
    (truncated, trailing bytes) belong to the layout, not to one field's check."""
    scan = {b"TLADAMF": scan_adam, b"TLSF32B": scan_float32_state}
    scan[b"TLCKOPT"] = scan_optimizer_state
    read = scan[data[:7]]
    read(io.BytesIO(data))  # the seed itself is valid
    found = set()
    for offset in range(7, len(data) - 7):
        (was,) = struct.unpack_from("<Q", data, offset)
        for value in {0, 1, 2, (was + 1) % 2**64, 2**63}:
            mutated = bytearray(data)
            struct.pack_into("<Q", mutated, offset, value)
            try:
                read(io.BytesIO(bytes(mutated)))
            except (TruncatedError, TrailingDataError):
                pass
            except CheckpointError as exc:
                found.add(re.sub(r"\[\d+\]", "[i]", exc.field or "<no field>"))
    return found


def test_every_check_a_reader_applies_is_in_the_reference() -> None:
    # The check column once left out four TLCKOPT rules applied in code (increasing ids,
    # entry_count <= representatives, an entry's count = its slot's, slot-group ranges).
    gen = _generator()
    seeds = [
        (vectors_dir() / "adam_v5_f64_tied_counter.tladam").read_bytes(),
        (vectors_dir() / "state_basic.tlsf32").read_bytes(),
        _optimizer_seed(),
    ]
    assert {seed[:7] for seed in seeds} == set(registry.FAMILIES), "a family without a seed"
    checks: dict[tuple[bytes, str], str] = {}
    for magic in registry.FAMILIES:
        for version in registry.known_versions(magic):
            for row in gen.spec_rows(registry.lookup(magic, version).struct):
                cell = gen.reader_check(magic, row.path, row.check)
                checks[(magic, row.path)] = checks.get((magic, row.path)) or cell
    assert set(gen.READER_CHECKS) <= set(checks), "READER_CHECKS names a field with no row"
    undocumented, rejected = [], set()
    for seed in seeds:
        magic = seed[:7]
        for field in _rejected_fields(seed):
            path = field if (magic, field) in checks else field.removesuffix("[i]")
            rejected.add((magic, path))
            if not checks.get((magic, path)):
                undocumented.append(f"{magic.decode()} {field}")
    assert undocumented == [], "fields a reader rejects with an empty check cell"
    unapplied = sorted(set(gen.READER_CHECKS) - rejected)
    assert unapplied == [], "READER_CHECKS documents checks no reader applied here"


# --------------------------------------------------------------------------- runnable pages


def test_guide_examples_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    blocks = python_blocks((DOCS / "guide.md").read_text(encoding="utf-8"))
    assert len(blocks) >= 8
    run_blocks(blocks, "guide")
    assert (tmp_path / "model.tlsf32").exists() and (tmp_path / "optimizer.tladam").exists()


def test_extending_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert lookup(ADAM_MAGIC, 6) is None
    try:
        blocks = python_blocks((DOCS / "extending.md").read_text(encoding="utf-8"))
        assert len(blocks) >= 4
        run_blocks(blocks, "extending")
    finally:
        unregister(ADAM_MAGIC, 6)
    assert lookup(ADAM_MAGIC, 6) is None


def test_readme_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = python_blocks(readme)
    assert len(blocks) == 1
    run_blocks(blocks, "readme")


def test_readme_two_commands() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Two commands", 1)[1].split("\n## ", 1)[0]
    commands = [b for lang, b in _FENCE.findall(section) if lang == "sh"]
    assert len(commands) == 1
    lines = [line.split("#")[0].strip() for line in commands[0].strip().splitlines()]
    assert lines == ["make demo", "make test"]


# --------------------------------------------------------------------------- API reference


def _documented() -> dict[str, str]:
    """``### `name` `` headings of docs/api.md → the first code statement that follows, on
    one line (a signature the formatter wrapped over several lines is joined back)."""
    text = (DOCS / "api.md").read_text(encoding="utf-8")
    found = {}
    for match in re.finditer(r"^### `([\w.]+)`\n(.*?)(?=^#{2,3} |\Z)", text, re.M | re.S):
        body = match.group(2)
        code = re.search(r"^```python\n(.*?)^```", body, re.M | re.S)
        found[match.group(1)] = _first_statement(code.group(1)) if code else ""
    return found


def _first_statement(code: str) -> str:
    """The first line of ``code``, joined with the lines that follow while a bracket it
    opens is still open."""
    parts, depth = [], 0
    for line in code.splitlines():
        parts.append(line.strip())
        depth += sum(line.count(c) for c in "([{") - sum(line.count(c) for c in ")]}")
        if depth <= 0:
            break
    joined = " ".join(parts)
    return re.sub(r"\( ", "(", re.sub(r",? \)", ")", joined))


def test_api_reference_documents_every_public_name() -> None:
    documented = _documented()
    missing = [name for name in tlckpt.__all__ if name not in documented]
    assert not missing, f"docs/api.md lacks: {missing}"
    stale = [name for name in documented if name not in tlckpt.__all__ and name != "tlckpt"]
    assert not stale, f"docs/api.md documents names not in tlckpt.__all__: {stale}"


def _parameters(line: str) -> list[str]:
    inside = line[line.index("(") + 1 : line.rindex(")")]
    names = []
    for part in re.split(r",(?![^\[]*\])", inside):
        part = part.strip()
        if part and part not in ("*", "/"):
            names.append(re.split(r"[:=]", part)[0].strip().lstrip("*"))
    return names


@pytest.mark.parametrize("name", tlckpt.__all__)
def test_api_reference_signatures(name: str) -> None:
    obj = getattr(tlckpt, name)
    line = _documented()[name]
    if inspect.isfunction(obj) or line.startswith(f"{name}("):
        assert line.startswith(f"{name}("), f"{name}: signature line is {line!r}"
        actual = [p for p in inspect.signature(obj).parameters if p != "self"]
        assert _parameters(line) == actual, f"{name}: documented {line!r}, actual {actual}"


# --------------------------------------------------------------------------- CLI page, links


def test_cli_page_names_every_command_and_option() -> None:
    text = (DOCS / "cli.md").read_text(encoding="utf-8")
    parser = cli.build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for command, sub in subparsers.choices.items():
        assert f"## `{command}" in text, command
        for action in sub._actions:
            for option in action.option_strings:
                if option not in ("-h", "--help"):
                    assert option in text, f"{command} {option}"


@pytest.mark.parametrize("page", [*PAGES, ROOT / "README.md"], ids=lambda p: p.name)
def test_relative_links_resolve(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if "://" in target:
            continue
        assert (page.parent / target).exists(), f"{page.name} links to missing {target}"
