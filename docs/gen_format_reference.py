"""Generate ``docs/format-reference.md``, and the list of magics in ``docs/format.md``, from
the specs in :mod:`tlckpt.formats` and the family registry.

The byte tables are read off the ``construct`` structures themselves — field order, sizes,
counts, conditions, the ``*`` docs of every field and the checks that ``Const``/``Valid``
attach — so the reference cannot drift from the code: ``tests/test_docs.py`` regenerates it
in memory and fails when the checked-in file differs. The checks a reader applies in code
beyond its spec's (:data:`READER_CHECKS`) join them in the *check* column; the test probes
the readers and fails when one rejects a field whose check cell is empty. ``format.md`` §1's
magic row lists every registered binary family (between ``<!-- magics -->`` markers).

Usage::

    python docs/gen_format_reference.py          # rewrite both
    python docs/gen_format_reference.py --check  # exit 1 if either is stale
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import pkgutil
import re
import struct
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from construct import Array, Bytes, Const, Construct, FormatField, IfThenElse, Pass, Struct

import tlckpt.formats
from tlckpt.codec.families import families
from tlckpt.codec.spec.plan import fixed_size
from tlckpt.formats import registry
from tlckpt.formats import safetensors as st_layout
from tlckpt.formats.primitives import F64, U64, Payload, Valid, unwrap
from tlckpt.formats.state_bits import ENCODINGS

OUTPUT = Path(__file__).resolve().parent / "format-reference.md"
#: The hand-written rules, whose §1 magic row is generated between :data:`MAGIC_MARKERS`.
FORMAT_MD = Path(__file__).resolve().parent / "format.md"
MAGIC_MARKERS = ("<!-- magics -->", "<!-- /magics -->")

TIMES = " \u00d7 "  # the multiplication sign, as FORMAT.md writes sizes
EN_DASH = "\u2013"
_ENCODING_COLUMNS = "name|format tag|width|exp. bits|frac. bits|bias|specials|value|numpy array"
_TYPE_NAMES = {U64.fmtstr: "u64", F64.fmtstr: "f64", "<I": "u32", "<B": "u8"}


# --------------------------------------------------------------------------- reader checks

#: (magic, field) → what the family's reader checks on that field with the file alone (no
#: destination), beyond the spec's own ``Const``/``Valid`` — rules that need the stored schema
#: or earlier records, applied in code as the field is decoded: ``codec/optimizers/adam.py``
#: (``_AdamReader``), ``codec/optimizers/tlckpt_optimizer.py`` (``_OptimizerReader``),
#: ``codec/optimizers/optimizer_reader.py`` (an entry's count), ``codec/spec/schema_check.py``
#: (the schema blocks). ``tests/test_docs.py`` probes the readers: a field they reject must
#: have a check.
READER_CHECKS: dict[tuple[bytes, str], str] = {
    (b"TLADAMF", "config.beta1"): "0 <= beta1 < 1 (not NaN)",
    (b"TLADAMF", "config.beta2"): "0 <= beta2 < 1 (not NaN)",
    (b"TLADAMF", "config.epsilon"): "finite and > 0 in the moment dtype",
    (b"TLADAMF", "config.weight_decay"): "Adam: 0; AdamW: finite and >= 0",
    (b"TLADAMF", "representatives"): "a well-formed alias map (format.md §2)",
    (b"TLADAMF", "entry_count"): "= the schema's representative slots",
    (b"TLADAMF", "entries[i].id"): "< slot_count, a representative slot, not repeated",
    (b"TLADAMF", "entries[i].step"): ">= 1",
    (b"TLADAMF", "entries[i].count"): "= the slot's element_count",
    (b"TLCKOPT", "representatives"): "a well-formed alias map (format.md §2)",
    (b"TLCKOPT", "slot_groups"): ("1 to group_count for a representative slot, 0 for the others"),
    (b"TLCKOPT", "entry_count"): "<= the schema's representative slots",
    (b"TLCKOPT", "entries[i].id"): "greater than the previous entry's id",
    (b"TLCKOPT", "entries[i].count"): "= the slot's element_count",
}


def reader_check(magic: bytes, path: str, spec_check: str) -> str:
    """The *check* cell of a field: its spec's check, then its reader's (:data:`READER_CHECKS`)."""
    extra = READER_CHECKS.get((magic, path), "")
    return "; ".join(part for part in (spec_check, extra) if part)


# --------------------------------------------------------------------------- spec sources


@dataclass(frozen=True)
class _Named:
    """A module-level spec object: where it is defined and its ``#:`` comment."""

    module: Any
    name: str
    comment: str


def _named_objects() -> dict[int, _Named]:
    """Every construct object bound to a module-level name in ``tlckpt.formats.*``."""
    found: dict[int, _Named] = {}
    for info in sorted(pkgutil.iter_modules(tlckpt.formats.__path__), key=lambda i: i.name):
        module = importlib.import_module(f"tlckpt.formats.{info.name}")
        source = inspect.getsource(module)
        for name, obj in vars(module).items():
            defined_here = re.search(rf"^{re.escape(name)}\s*=", source, re.MULTILINE)
            if isinstance(obj, Construct) and name.isupper() and defined_here:
                found[id(obj)] = _Named(module, name, _comment(source, name))
    return found


def _comment(source: str, name: str) -> str:
    """The ``#:`` comment lines right above ``NAME = ...``, joined."""
    match = re.search(rf"((?:^#:.*\n)+)^{re.escape(name)}\s*=", source, re.MULTILINE)
    if not match:
        return ""
    return " ".join(line[2:].strip() for line in match.group(1).splitlines())


def _rst_to_md(text: str) -> str:
    """Docstring reST → Markdown: inline literals, and ``::`` literal blocks as fences."""

    def fence(m: re.Match[str]) -> str:
        body = "\n".join(line[4:] for line in m.group(1).rstrip("\n").splitlines())
        return f":\n\n```\n{body}\n```\n"

    text = text.replace("``", "`")
    return re.sub(r"::\n\n((?:    .*(?:\n|$))+)", fence, text).rstrip("\n")


def _title(doc: str | None) -> str:
    """``§3 of FORMAT.md: Adam ... checkpoints, family ``X``.`` → ``Adam ... (FORMAT.md §3)``."""
    line = _first_line(doc)
    m = re.fullmatch(r"§(\d+) of FORMAT\.md: (.*?)(?:, family `\w+`)?\.?", line)
    return f"{m.group(2)} (FORMAT.md §{m.group(1)})" if m else line


# --------------------------------------------------------------------------- expressions


def _expr(value: Any) -> str:
    """``this['schema']['slot_count']`` → ``schema.slot_count``; constants as themselves."""
    text = repr(value)
    text = re.sub(
        r"this((?:\['\w+'\])+)",
        lambda m: ".".join(re.findall(r"'(\w+)'", m.group(1))),
        text,
    )
    if text.startswith("(") and text.endswith(")"):
        text = text[1:-1]
    return text


class _Probe:
    """A stand-in context: ``_root``/``_`` lead back to it, any field reads as ``value``."""

    def __init__(self, value: int):
        self.value = value
        self.fields: list[str] = []

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            return self
        self.fields.append(name)
        return self.value

    __getitem__ = __getattr__


def _payload_itemsize(dtype: Any) -> str:
    """``4`` for a fixed dtype; ``4 (dtype_tag 0) or 8 (dtype_tag 1)`` when a field picks it."""
    if not callable(dtype):
        return str(np.dtype(dtype).itemsize)
    sizes = []
    field = "a header field"
    for value in range(16):
        probe = _Probe(value)
        try:
            size = np.dtype(dtype(probe)).itemsize
        except (KeyError, IndexError, TypeError, ValueError):
            continue
        field = probe.fields[-1] if probe.fields else field
        sizes.append(f"{size} ({field} {value})")
    return " or ".join(sizes) if sizes else "by the header"


def _payload_type(dtype: Any) -> str:
    if callable(dtype):
        kinds = []
        for value in range(16):
            try:
                kinds.append(np.dtype(dtype(_Probe(value))).name)
            except (KeyError, IndexError, TypeError, ValueError):
                continue
        return "/".join(dict.fromkeys(kinds))
    return np.dtype(dtype).name


# --------------------------------------------------------------------------- rows


@dataclass
class Row:
    """One line of a byte table."""

    offset: str
    path: str
    type: str
    size: str
    meaning: str
    check: str
    versions: str = ""


@dataclass
class _Cursor:
    """Where the next field starts: ``anchor`` + ``k`` (``anchor`` None: absolute)."""

    anchor: str | None
    k: int

    def render(self) -> str:
        if self.anchor is None:
            return str(self.k)
        return f"{self.anchor} + {self.k}"

    def advance(self, size: int | None, path: str) -> None:
        if size is None:
            self.anchor, self.k = f"end({path})", 0
        else:
            self.k += size


def _strip(sc: Construct) -> tuple[Construct, str, str]:
    """The construct inside a named field, and the field's name and docs (a ``Renamed``
    carries those of every wrapper inside it)."""
    return unwrap(sc), sc.name or "", sc.docs or ""


class _Walker:
    def __init__(self, named: dict[int, _Named]):
        self.named = named

    def fallback_docs(self, sc: Construct) -> str:
        named = self.named.get(id(sc))
        return _rst_to_md(named.comment) if named else ""

    def struct(self, st: Struct, prefix: str, cursor: _Cursor, rows: list[Row]) -> None:
        for sub in st.subcons:
            inner, name, docs = _strip(sub)
            path = f"{prefix}{name}" if name else prefix.rstrip(".")
            self.field(inner, path, docs or self.fallback_docs(inner), cursor, rows)

    def field(self, sc: Construct, path: str, docs: str, cursor: _Cursor, rows: list[Row]) -> None:
        check = ""
        base = sc
        while isinstance(base, (Const, Valid)):
            if isinstance(base, Const):
                value = base.value
                shown = value.decode("ascii") if isinstance(value, bytes) else value
                check = f"= `{shown}`"
            else:
                check = f"{base.expected}"
            base = base.subcon
        base, _, inner_docs = _strip(base)
        docs = docs or inner_docs
        offset = cursor.render()

        def add(kind: str, size: str, meaning: str, shown: str = check) -> None:
            rows.append(Row(offset, path, kind, size, meaning, shown))

        if isinstance(base, Struct):
            size = fixed_size(base)
            add("struct", _size_text(size), docs or self.fallback_docs(base))
            self.struct(base, f"{path}.", cursor, rows)
            return
        if isinstance(base, Array):
            item, _, item_docs = _strip(base.subcon)
            count = _expr(base.count)
            if isinstance(item, FormatField):
                itemsize = struct.calcsize(item.fmtstr)
                kind = _TYPE_NAMES.get(item.fmtstr, item.fmtstr)
                add(
                    f"{kind}[{count}]",
                    f"{itemsize}{TIMES}{count}",
                    docs or self.fallback_docs(base),
                )
            else:
                meaning = docs or self.fallback_docs(base) or item_docs
                add(f"record[{count}]", f"{count} records", meaning)
                self.struct(item, f"{path}[i].", _Cursor(f"start({path}[i])", 0), rows)
            cursor.advance(None, path)
            return
        if isinstance(base, Payload):
            count = _expr(base.count)
            add(
                f"{_payload_type(base.dtype)}[{count}]",
                f"{count}{TIMES}{_payload_itemsize(base.dtype)}",
                docs or "payload, little-endian",
                check or "streamed, never parsed",
            )
            cursor.advance(None, path)
            return
        if isinstance(base, IfThenElse):
            then, _, then_docs = _strip(base.thensubcon)
            other = _strip(base.elsesubcon)[0]
            else_size = "0" if other is Pass else str(fixed_size(other))
            if isinstance(then, Payload):  # an optional payload: its type and size, if present
                count = _expr(then.count)
                kind = f"{_payload_type(then.dtype)}[{count}]"
                size = f"{count}{TIMES}{_payload_itemsize(then.dtype)}"
                check = check or "streamed, never parsed"
            else:
                kind = _TYPE_NAMES.get(getattr(then, "fmtstr", ""), type(then).__name__)
                size = str(fixed_size(then))
            condition = f"{size} if {_expr(base.condfunc)}, else {else_size}"
            add(kind, condition, docs or then_docs, check)
            cursor.advance(None, path)
            return
        size = fixed_size(base)
        if isinstance(base, FormatField):
            kind = _TYPE_NAMES.get(base.fmtstr, base.fmtstr)
            if base.fmtstr == F64.fmtstr:
                check = check or "binary64 bits, kept exactly"
        elif isinstance(base, Bytes):
            kind = "bytes"
        else:
            kind = type(base).__name__
        add(kind, _size_text(size), docs, check)
        cursor.advance(size, path)


def _size_text(size: int | None) -> str:
    return "variable" if size is None else str(size)


def spec_rows(spec: Struct, named: dict[int, _Named] | None = None) -> list[Row]:
    """The byte table of one version spec."""
    rows: list[Row] = []
    _Walker(named if named is not None else _named_objects()).struct(
        spec, "", _Cursor(None, 0), rows
    )
    return rows


# --------------------------------------------------------------------------- markdown


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _table(headers: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return out


def _version_list(versions: list[int], all_versions: list[int]) -> str:
    if versions == all_versions:
        return "all"
    runs: list[list[int]] = []
    for v in versions:
        if runs and v == runs[-1][-1] + 1:
            runs[-1].append(v)
        else:
            runs.append([v])
    return ", ".join(
        f"{r[0]}{EN_DASH}{r[-1]}" if len(r) > 2 else ", ".join(map(str, r)) for r in runs
    )


def _family_specs(named: dict[int, _Named]) -> dict[bytes, list[registry.FileSpec]]:
    """Registered versions per magic — only those defined as named specs in ``formats``
    (toy versions a test registers on the fly are not part of the reference)."""
    families: dict[bytes, list[registry.FileSpec]] = {}
    for magic in registry.FAMILIES:
        for version in registry.known_versions(magic):
            spec = registry.lookup(magic, version)
            if spec is not None and id(spec.struct) in named:
                families.setdefault(magic, []).append(spec)
    return families


def _first_line(doc: str | None) -> str:
    return _rst_to_md((doc or "").strip().splitlines()[0]) if doc else ""


def _binary_family(
    magic: bytes, specs: list[registry.FileSpec], named: dict[int, _Named]
) -> list[str]:
    module = named[id(specs[0].struct)].module
    versions = [s.version for s in specs]
    tables = {s.version: spec_rows(s.struct, named) for s in specs}
    where: dict[str, list[int]] = {}
    for v, rows in tables.items():
        for row in rows:
            where.setdefault(row.path, []).append(v)
    out = [f"## `{magic.decode()}`: {_title(module.__doc__)}", ""]
    rest = (module.__doc__ or "").strip().split("\n", 1)
    if len(rest) > 1 and rest[1].strip():
        out += [_rst_to_md(rest[1].strip()), ""]
    out += [
        f"Versions: {', '.join(map(str, versions))} (module `{module.__name__}`).",
        "",
    ]
    for spec in specs:
        info = named[id(spec.struct)]
        out += [f"### `{magic.decode()}` version {spec.version} (`{info.name}`)", ""]
        if info.comment:
            out += [_rst_to_md(info.comment), ""]
        rows = [
            [
                f"`{r.offset}`",
                f"`{r.path}`",
                r.type,
                r.size,
                r.meaning,
                reader_check(magic, r.path, r.check),
                _version_list(where[r.path], versions),
            ]
            for r in tables[spec.version]
        ]
        out += _table(
            ["offset", "field", "type", "size (bytes)", "meaning", "check", "versions"], rows
        )
        out.append("")
    return out


def _encodings() -> list[str]:
    from tlckpt.formats import state_bits

    out = [
        f"## Exact-bits JSON: {_title(state_bits.__doc__)}",
        "",
        _rst_to_md((state_bits.__doc__ or "").strip().split("\n", 1)[-1].strip()),
        "",
        "Every value is a JSON integer `0 <= w < 2^width` (complex: `[re, im]`).",
        "",
    ]
    rows = []
    for name, fmt in ENCODINGS.items():
        inner = getattr(fmt, "inner", fmt)
        array = f"`{fmt.array_dtype}`" + ("" if fmt.native_dtype else " words")
        parameters = (inner.exponent_bits, inner.fraction_bits, inner.bias)
        value = "complex pair" if fmt.pair else "real"
        cells = [f"`{name}`", f"`{fmt.tag}`", fmt.width, *parameters, inner.convention, value]
        rows.append([*map(str, cells), array])
    out += _table(_ENCODING_COLUMNS.split("|"), rows)
    out.append("")
    return out


def _safetensors() -> list[str]:
    """The safetensors layout: its fixed prefix and its dtype table (formats/safetensors.py)."""
    out = [
        "## safetensors: named tensors of any dtype (Hugging Face's layout)",
        "",
        "No magic. Read off `formats/safetensors.py`; the rules the reader checks are in its"
        " docstring and [the guide](guide.md#bf16-models-and-other-optimizers).",
        "",
    ]
    rows = [
        ["0", "`header_length`", "u64", f"<= {st_layout.HEADER_LIMIT}"],
        [
            "8",
            "`header`",
            "`header_length` bytes",
            f"UTF-8 JSON object starting `{st_layout.HEADER_START.decode()}`, space-padded to"
            f" a multiple of {st_layout.ALIGNMENT}",
        ],
        ["end(header)", "`data`", "the rest", "tensors tile it exactly, by `data_offsets`"],
    ]
    out += _table(["offset", "field", "type", "check"], rows)
    out += [
        "",
        "Each tensor entry has exactly the members "
        + ", ".join(f"`{k}`" for k in st_layout.ENTRY_KEYS)
        + f"; `{st_layout.METADATA_KEY}` maps strings to strings. Dtypes, in layout order"
        " (the writer places a later one first, then sorts by name):",
        "",
    ]
    rows = [
        [
            f"`{d.name}`",
            str(d.bits),
            f"`{d.storage or 'u1 (bytes)'}`",
            f"`{d.numpy or '-'}`",
            f"`{d.torch}`" if d.torch else "-",
        ]
        for d in st_layout.DTYPES
    ]
    out += _table(["dtype", "bits", "raw words", "numpy", "torch"], rows)
    out.append("")
    return out


def render() -> str:
    """The whole reference, as Markdown."""
    named = _named_objects()
    binary = [f for f in families() if f.magic is not None]
    out = [
        "# Format reference (generated)",
        "",
        "<!-- Generated by docs/gen_format_reference.py from tlckpt/formats; do not edit."
        " tests/test_docs.py fails when this file is stale. -->",
        "",
        "Byte-level tables of every registered format version, read off the `construct`"
        " specs in `formats/`. Integers are unsigned little-endian; there is no padding."
        " Offsets are absolute where every earlier field has a fixed size; after a"
        " variable-size field they read `end(field) + k`, and inside a record"
        " `start(record[i]) + k`. *check* is what the reader verifies on that field with the"
        " file alone (`= x`: a constant), from the spec and from the reader's code; the rules"
        " that compare a file with its destination (schema equality, config bits, moment"
        " dtypes) are in [the format rules](format.md) and [the guide](guide.md#errors).",
        "",
        "Families: "
        + ", ".join(f"`{f.label}` ({f.name})" for f in sorted(binary, key=lambda f: f.magic))
        + "".join(f", and {f.label}" for f in families() if f.magic is None)
        + ".",
        "",
    ]
    for magic, specs in sorted(_family_specs(named).items()):
        out += _binary_family(magic, specs, named)
    out += _safetensors()
    out += _encodings()
    return "\n".join(out).rstrip() + "\n"


def magic_list() -> str:
    """Every registered binary family's magic and contents, in magic order (format.md §1)."""
    binary = sorted((f for f in families() if f.magic is not None), key=lambda f: f.magic)
    named = [f"`{f.magic.decode()}` ({f.contents})" for f in binary]
    return ", ".join(named[:-1]) + f" or {named[-1]}" if len(named) > 1 else "".join(named)


def with_magic_list(text: str) -> str:
    """``format.md``'s text with the part between :data:`MAGIC_MARKERS` regenerated.

    Raises:
        ValueError: the markers are missing or out of order.
    """
    start, end = MAGIC_MARKERS
    head, found, rest = text.partition(start)
    _, found_end, tail = rest.partition(end)
    if not (found and found_end):
        raise ValueError(f"format.md has no {start} ... {end} markers")
    return f"{head}{start}{magic_list()}{end}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a file is stale")
    parser.add_argument("--output", type=Path, default=OUTPUT)
    parser.add_argument("--format-md", type=Path, default=FORMAT_MD)
    args = parser.parse_args(argv)
    rules = args.format_md.read_text(encoding="utf-8")
    wanted = {args.output: render(), args.format_md: with_magic_list(rules)}
    stale = 0
    for path, text in wanted.items():
        current = path.read_text(encoding="utf-8") if path.exists() else ""
        if current == text:
            continue
        if args.check:
            print(f"{path} is stale; run python docs/gen_format_reference.py", file=sys.stderr)
            stale = 1
        else:
            path.write_text(text, encoding="utf-8")
    return stale


if __name__ == "__main__":
    sys.exit(main())
