"""``tlckpt inspect FOLDER``: a checkpoint set's members as its manifest describes them
(torch-free; the manifest is parsed and checked, a signed one's structure only — ``tlckpt
verify`` authenticates and checks the members' bytes).
"""

from __future__ import annotations

import os
from typing import Any

from ..codec.sets.set_document_writing import member_fields
from ..codec.sets.set_documents import Manifest
from ..codec.sets.set_folders import read_manifest
from ..formats.checkpoint_set import SET_VERSION_3

__all__ = ["set_description", "describe_set"]


def set_description(folder: str | os.PathLike) -> dict[str, Any]:
    """The set's manifest as JSON values: step, version, structure and every member.

    Raises:
        CheckpointError: no manifest, or a malformed one.
        OSError: from the file system.
    """
    manifest: Manifest = read_manifest(folder, authenticate=False)
    members = {role: member_fields(m) for role, m in manifest.members.items()}
    structure = None
    if manifest.structure is not None:
        structure = {
            role: None if value is None else {"kind": value[0], "keys": list(value[1])}
            for role, value in manifest.structure.items()
        }
    return {
        "family": "checkpoint_set",
        "version": manifest.version,
        "step": manifest.step,
        "library": manifest.library,
        "signed": manifest.key_id is not None,
        "structure": structure,
        "members": members,
        "state": [[name, list(shape)] for name, shape in manifest.state],
        "world_size": manifest.world_size,
    }


def describe_set(info: dict[str, Any], folder: str | os.PathLike) -> str:
    """The human description of :func:`set_description`'s ``info``: one line per member."""
    lines = [
        f"{os.fspath(folder)}: checkpoint set of step {info['step']} (manifest version"
        f" {info['version']}{', signed' if info['signed'] else ''}; {info['library']})"
    ]
    for role, m in info["members"].items():
        line = f"  {role}: {m['file']} ({m['family']} v{m['version']}, {m['size']} bytes)"
        if "tensors" in m:
            tied = ", ".join(f"{a} = {b}" for a, b in m["tied"].items())
            line += f"; {len(m['tensors'])} tensors" + (f", tied: {tied}" if tied else "")
        if "models" in m:
            line += f"; binds {', '.join(m['models'])}; {m['groups']} param groups"
        lines.append(line)
    if info["version"] == SET_VERSION_3:
        lines.append(f"  state tree (a framework's checkpoint): {len(info['state'])} tensors")
    elif info["structure"] is None:
        lines.append(f"  model state: {len(info['state'])} tensors")
    return "\n".join(lines)
