"""Human-readable text for :func:`tlckpt.inspect` results (``tlckpt inspect``, the demo).

One function, :func:`describe`, turns the dict ``inspect`` returns into an aligned report:
family and version, the optimizer config (or, for tlckpt's own family, every param group) as
decimal and exact binary64 bits, the parameter schema and moment entries as tables, or the
tensors of a model-state file. The family's
title comes from its handler in the family registry; each section is printed when the
description holds what it shows, whatever the family.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from ..codec.families import family_named

__all__ = ["describe", "summarize", "format_shape", "table"]

#: How reports spell the update rules ``inspect`` names in lowercase.
_KIND_NAMES = {"adam": "Adam", "adamw": "AdamW"}


def _handler_text(family: str) -> tuple[str, str]:
    """The family's label and title, as its handler gives them (its name if none does)."""
    handler = family_named(family)
    return (family, family) if handler is None else (handler.label, handler.title)


def format_shape(shape: Sequence[int]) -> str:
    """``(3, 4)``, ``(8,)`` or ``()`` — Python's tuple spelling, which readers know."""
    return repr(tuple(shape))


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], indent: str = "  ") -> str:
    """A plain aligned table; numeric columns are right-aligned, the rest left-aligned."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        widths = [max(w, len(c)) for w, c in zip(widths, row)]
    numeric = [
        bool(rows) and all(isinstance(row[k], int) and not isinstance(row[k], bool) for row in rows)
        for k in range(len(headers))
    ]

    def line(values: Sequence[str]) -> str:
        parts = [v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric)]
        return (indent + "  ".join(parts)).rstrip()

    return "\n".join([line(headers), *(line(row) for row in cells)])


def _size(nbytes: int | None) -> str:
    return "unknown" if nbytes is None else f"{nbytes:,} bytes"


def _config(info: dict[str, Any]) -> list[str]:
    """A ``TLADAMF`` file's one config."""
    out = [
        f"kind            {_KIND_NAMES.get(info['kind'], info['kind'])}",
        f"moment dtype    {info['moment_dtype']}",
        "config",
    ]
    config_rows = [
        (name, repr(value["value"]), value["bits"]) for name, value in info["config"].items()
    ]
    out.append(table(("field", "decimal", "binary64 bits"), config_rows))
    return out


def _groups(info: dict[str, Any]) -> list[str]:
    """A ``TLCKOPT`` file's param groups: kind and flags, then every float of each group in
    decimal and exact binary64 bits."""
    groups = info["groups"]
    out = [f"param groups    {len(groups)}"]
    for g in groups:
        flags = [name for name in ("amsgrad", "maximize") if g[name]]
        extra = f" ({', '.join(flags)})" if flags else ""
        out.append(f"  group {g['group']}  {_KIND_NAMES.get(g['kind'], g['kind'])}{extra}")
        rows = [
            (name, repr(value["value"]), value["bits"])
            for name, value in g.items()
            if isinstance(value, dict)
        ]
        out.append(table(("field", "decimal", "binary64 bits"), rows, indent="    "))
    return out


def _optimizer(info: dict[str, Any]) -> list[str]:
    out = _groups(info) if "groups" in info else _config(info)
    counter = info["random_counter"]
    out.append(f"random counter  {'absent' if counter is None else counter}")
    for name, value in info.get("fields", {}).items():
        out.append(f"{name:<15} {value}")
    slots = info["slots"]
    trainable = sum(1 for s in slots if s["trainable"])
    out.append(
        f"schema          {len(slots)} slot(s), {trainable} trainable, "
        f"{len(info['entries'])} with moments, tied weights: "
        f"{'yes' if info['has_aliases'] else 'no'}"
    )
    grouped = "group" in slots[0] if slots else False
    slot_rows = []
    for s in slots:
        rep = s["representative"]
        if rep is None:
            rep_text = "-"
        elif rep == s["slot"]:
            rep_text = str(rep)
        else:
            rep_text = f"{rep} (tied to slot {rep})"
        row = (
            s["slot"],
            format_shape(s["shape"]),
            s["elements"],
            "yes" if s["trainable"] else "no",
            rep_text,
        )
        group = s.get("group")
        slot_rows.append((*row, "-" if group is None else group) if grouped else row)
    headers = ("slot", "shape", "elements", "trainable", "representative")
    if slot_rows:
        out.append(table((*headers, "group") if grouped else headers, slot_rows))
    entries = info["entries"]
    if grouped:
        out.append(f"entries         {len(entries)} (m, v and, with amsgrad, max_exp_avg_sq)")
        rows = [(e["id"], e["step"], e["dtype"], e["elements"], e["bytes"]) for e in entries]
        if rows:
            out.append(table(("slot", "step", "dtype", "elements", "bytes"), rows))
        return out
    out.append(f"entries         {len(entries)} (m and v per entry)")
    entry_rows = [(e["id"], e["step"], e["elements"], e["bytes"]) for e in entries]
    if entry_rows:
        out.append(table(("slot", "step", "elements", "bytes"), entry_rows))
    return out


def _optimizer_tree(info: dict[str, Any]) -> list[str]:
    """An optimizer tree's class and counter, each group's parameters and options (exact
    tagged JSON), and which state keys each parameter has."""
    counter = info["random_counter"]
    out = [f"optimizer       {info['class']}"]
    out.append(f"random counter  {'absent' if counter is None else counter}")
    out.append(f"param groups    {len(info['groups'])}")
    for i, g in enumerate(info["groups"]):
        out.append(f"  group {i}  {len(g['params'])} parameter(s): {', '.join(g['params'])}")
        rows = [(key, repr(value)) for key, value in g["options"].items()]
        if rows:
            out.append(table(("option", "value"), rows, indent="    "))
    rows = [(name, ", ".join(keys)) for name, keys in info["state"].items()]
    out.append(f"state           {len(rows)} parameter(s) with state")
    if rows:
        out.append(table(("parameter", "state keys"), rows))
    return out


def _tensors(info: dict[str, Any], with_bytes: bool) -> list[str]:
    tensors = info["tensors"]
    elements = sum(t["elements"] for t in tensors)
    out = [f"tensors         {len(tensors)} ({elements:,} elements)"]
    if tensors and "name" in tensors[0]:  # a family with names and dtypes (safetensors)
        rows = [
            (t["name"], t["dtype"], format_shape(t["shape"]), t["elements"], t["bytes"])
            for t in tensors
        ]
        out.append(table(("name", "dtype", "shape", "elements", "bytes"), rows))
    elif tensors:
        if with_bytes:
            rows = [
                (i, format_shape(t["shape"]), t["elements"], t["bytes"])
                for i, t in enumerate(tensors)
            ]
            out.append(table(("#", "shape", "elements", "bytes"), rows))
        else:
            rows = [(i, format_shape(t["shape"]), t["elements"]) for i, t in enumerate(tensors)]
            out.append(table(("#", "shape", "elements"), rows))
    return out


def describe(info: dict[str, Any], path: str | os.PathLike | None = None) -> str:
    """Render an ``inspect`` dict as text.

    Args:
        info: what :func:`tlckpt.inspect` returned for a file.
        path: the file's name, shown on the first line if given.

    Returns:
        Several lines of text, without a trailing newline.

    Example:
        >>> print(describe(inspect("model.tlsf32"), "model.tlsf32"))  # doctest: +SKIP
        file            model.tlsf32
        family          TLSF32B (streamed float32 model state), version 1
        ...
    """
    lines = [] if path is None else [f"file            {os.fspath(path)}"]
    title = _handler_text(info["family"])[1]
    if "magic" in info:
        lines.append(f"family          {info['magic']} ({title}), version {info['version']}")
    elif "format" not in info:  # neither magic nor format tag (safetensors)
        lines.append(f"family          {title}")
    else:
        lines.append(f"family          {title}")
        encoding = info.get("encoding") or "configured binary format"
        lines.append(f"format          {info['format']} ({encoding})")
    lines.append(f"size            {_size(info.get('bytes'))}")
    if "metadata" in info:
        lines.append(f"metadata        {len(info['metadata'])} entries")
    if "slots" in info:
        lines += _optimizer(info)
    if "class" in info:
        lines += _optimizer_tree(info)
    if "tensors" in info:
        tensors = info["tensors"]
        lines += _tensors(info, with_bytes=bool(tensors) and "bytes" in tensors[0])
    return "\n".join(lines)


def summarize(info: dict[str, Any]) -> str:
    """One line: family, version and counts (``TLADAMF v4, 8 slot(s), 5 moment entries``)."""
    label = _handler_text(info["family"])[0]
    if "version" in info:
        head = f"{label} v{info['version']}"
    elif "format" in info:
        head = f"{label} {info.get('encoding') or info['format']}"
    else:
        head = label
    if "kind" in info:
        head += f" {info['kind']} {info['moment_dtype']}"
    if "groups" in info:
        head += f" {len(info['groups'])} param group(s)"
    parts = []
    if "slots" in info:
        n = len(info["entries"])
        parts += [f"{len(info['slots'])} slot(s)", f"{n} moment entr{'y' if n == 1 else 'ies'}"]
        if info["random_counter"] is not None:
            parts.append(f"random counter {info['random_counter']}")
    if "tensors" in info:
        parts.append(f"{len(info['tensors'])} tensor(s)")
    if info.get("bytes") is not None:
        parts.append(f"{info['bytes']:,} bytes")
    return ", ".join([head, *parts])
