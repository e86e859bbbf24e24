"""Spec paths of fields: tuples while parsing, strings only when an error needs one."""

from __future__ import annotations

__all__ = ["Path", "field_name"]

Path = tuple  # ("schema", "slots", 3, "rank")


def field_name(path: Path | str) -> str:
    """``("schema", "slots", 3, "rank")`` → ``"schema.slots[3].rank"``."""
    if isinstance(path, str):
        return path
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out
