"""Version 2 of a checkpoint set's manifest: sets of several models, optimizers or
schedulers, and members in the safetensors layout (the layout is described in
:mod:`tlckpt.formats.checkpoint_set`, "version 2").

The reader shares version 1's field checks (:mod:`.set_documents`), and like it is hostile-
input safe: every field is checked for its type and range before anything uses it, each
member's file name must be its role followed by one of the role's suffixes (so no name can
leave the set's folder), every structure key must name a member and every member a key.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from ...formats import checkpoint_set as layout
from ...formats.checkpoint_set import (
    MANIFEST_KEYS_V2,
    MAX_STRUCTURE_KEYS,
    MEMBER_KEYS,
    MEMBER_SUFFIXES_V2,
    MODEL_MEMBER_KEYS_V2,
    OPTIMIZER_MEMBER_KEYS_V2,
    SET_VERSION_2,
    SIGNED_MANIFEST_KEYS_V2,
    STEP_MAX,
    STRUCTURE_ENTRY_KEYS,
    STRUCTURE_KEY_PATTERN,
    STRUCTURE_KINDS,
    STRUCTURE_ROLES,
)
from ...formats.primitives import U64_MAX
from ..errors import MalformedError
from .set_document_checks import exact_keys, integer_field, short, string_field

# The version-1 reader's and writer's field checks, shared so that both versions check alike.
from .set_document_writing import (
    _check_manifest_values,
    manifest_head,
    member_fields,
    seal_manifest,
)
from .set_documents import (
    _FAMILY,
    _HEX,
    _KEYED_HEX,
    MANIFEST_READERS,
    Manifest,
    MemberRecord,
    _hex_field,
    _state,
    check_self_digest,
    checked_signature,
)
from .set_keys import SetKey

__all__ = ["Structure", "member_role", "build_manifest_v2", "parse_manifest_v2"]

#: role → ``(kind, keys)``, or ``None`` for a role not given.
Structure = dict[str, tuple[str, tuple[str, ...]] | None]


def member_role(role: str, kind: str, key: str) -> str:
    """The member of one object: the role itself for a single object, else ``role.key``."""
    return role if kind == "single" else f"{role}.{key}"


def _members_of(structure: Structure) -> dict[str, tuple[str, str]]:
    """member role → (role, key), for the models and optimizers of ``structure``."""
    out = {}
    for role in ("model", "optimizer"):
        entry = structure.get(role)
        if entry is None:
            continue
        kind, keys = entry
        for key in keys or ("",):
            out[member_role(role, kind, key)] = (role, key)
    return out


# --------------------------------------------------------------------------- reading


def _structure(value: Any) -> Structure:
    if type(value) is not dict:
        raise MalformedError("structure must be an object", field="structure")
    exact_keys(value, STRUCTURE_ROLES, "structure")
    out: Structure = {}
    for role in STRUCTURE_ROLES:
        entry = value[role]
        field = f"structure.{role}"
        if entry is None:
            out[role] = None
            continue
        if type(entry) is not dict:
            raise MalformedError(f"{field} must be an object or null", field=field)
        exact_keys(entry, STRUCTURE_ENTRY_KEYS, field)
        kind = entry["kind"]
        if kind not in STRUCTURE_KINDS or type(kind) is not str:
            raise MalformedError(
                f"{field}.kind is {short(kind)}; one of {', '.join(STRUCTURE_KINDS)}",
                field=f"{field}.kind",
                actual=short(kind),
            )
        keys = entry["keys"]
        if type(keys) is not list or len(keys) > MAX_STRUCTURE_KEYS:
            raise MalformedError(
                f"{field}.keys must be an array of at most {MAX_STRUCTURE_KEYS} keys",
                field=f"{field}.keys",
            )
        for i, k in enumerate(keys):
            if type(k) is not str or not STRUCTURE_KEY_PATTERN.fullmatch(k):
                raise MalformedError(
                    f"{field}.keys[{i}] is not a key: {short(k)}", field=f"{field}.keys[{i}]"
                )
        if len(set(keys)) != len(keys):
            raise MalformedError(f"{field}.keys names a key twice", field=f"{field}.keys")
        expected_keys = (
            []
            if kind == "single"
            else [str(i) for i in range(len(keys))]
            if kind == "sequence"
            else keys
        )
        if keys != expected_keys or (kind != "single" and not keys):
            raise MalformedError(
                f"{field}.keys {short(keys)} do not fit a {kind}", field=f"{field}.keys"
            )
        out[role] = (kind, tuple(keys))
    if out["model"] is None:
        raise MalformedError("structure.model must not be null: a set has a model")
    return out


def _file_of(member: str, role: str, file: str) -> None:
    field = f"members.{member}.file"
    suffixes = MEMBER_SUFFIXES_V2[role]
    if not any(file == member + suffix for suffix in suffixes):
        raise MalformedError(
            f"{field} is {short(file)}; the {member} member is {member} followed by one of"
            f" {', '.join(suffixes)}",
            field=field,
            actual=short(file),
        )


def _member_v2(
    member: str, role: str, entry: Any, digest_pattern: re.Pattern[str], structure: Structure
) -> MemberRecord:
    field = f"members.{member}"
    if type(entry) is not dict:
        raise MalformedError(f"{field} must be an object", field=field)
    keys = {"model": MODEL_MEMBER_KEYS_V2, "optimizer": OPTIMIZER_MEMBER_KEYS_V2}.get(
        role, MEMBER_KEYS
    )
    exact_keys(entry, keys, field)
    file = string_field(entry["file"], f"{field}.file")
    _file_of(member, role, file)
    family = string_field(entry["family"], f"{field}.family", layout.LIMITS.family_bytes)
    if not _FAMILY.fullmatch(family):
        raise MalformedError(f"{field}.family is not a family name: {short(family)}")
    base = {
        "file": file,
        "family": family,
        "version": integer_field(entry["version"], f"{field}.version", 0, U64_MAX),
        "size": integer_field(entry["size"], f"{field}.size", 0, U64_MAX),
        "digest": _hex_field(entry["digest"], digest_pattern, f"{field}.digest"),
    }
    if role == "model":
        try:
            tensors = _state(entry["tensors"])
        except MalformedError as exc:
            raise MalformedError(f"{field}.tensors: {exc}", field=f"{field}.tensors") from None
        tied = entry["tied"]
        names = {name for name, _ in tensors}
        if type(tied) is not dict or any(
            type(v) is not str or k not in names or v not in names or k == v
            for k, v in tied.items()
        ):
            raise MalformedError(
                f"{field}.tied must map tensor names to other tensor names of the member",
                field=f"{field}.tied",
            )
        return MemberRecord(**base, tensors=tensors, tied=dict(tied))
    if role == "optimizer":
        models = entry["models"]
        model_kind, model_keys = structure["model"]  # type: ignore[misc]
        known = {member_role("model", model_kind, k) for k in model_keys or ("",)}
        if (
            type(models) is not list
            or not models
            or any(type(k) is not str or k not in known for k in models)
            or len(set(models)) != len(models)
        ):
            raise MalformedError(
                f"{field}.models must name the set's model members it binds to, each once",
                field=f"{field}.models",
                actual=short(models),
            )
        groups = integer_field(entry["groups"], f"{field}.groups", 0, U64_MAX)
        return MemberRecord(**base, models=tuple(models), groups=groups)
    return MemberRecord(**base)


def parse_manifest_v2(
    data: bytes, document: dict[str, Any], key: SetKey | None, *, authenticate: bool
) -> Manifest:
    """The checked version-2 manifest ``document`` (parsed from ``data``).

    Raises:
        As :func:`~.set_documents.parse_manifest`; besides, MalformedError for a structure
        that does not name exactly the members the set has, or a member file that is not
        its role's.
    """
    signed, key_id = checked_signature(
        data,
        document,
        key,
        authenticate=authenticate,
        keys=MANIFEST_KEYS_V2,
        signed_keys=SIGNED_MANIFEST_KEYS_V2,
    )
    structure = _structure(document["structure"])
    members = document["members"]
    if type(members) is not dict:
        raise MalformedError("members must be an object", field="members")
    expected = _members_of(structure)
    wanted = [*expected, "training_state"]
    if sorted(members) != sorted(wanted):
        raise MalformedError(
            f"members {[short(m) for m in list(members)[:8]]} are not the structure's {wanted[:8]}",
            field="members",
            actual=[short(m) for m in list(members)[:8]],
            expected=wanted[:8],
        )
    pattern = _KEYED_HEX if signed else _HEX
    records = {
        member: _member_v2(
            member,
            expected.get(member, ("training_state", ""))[0],
            members[member],
            pattern,
            structure,
        )
        for member in wanted
    }
    model_kind = structure["model"][0]  # type: ignore[index]
    state: list[tuple[str, tuple[int, ...]]] = []
    for member, (role, k) in expected.items():
        if role == "model":
            prefix = "" if model_kind == "single" else f"{k}."
            state.extend((prefix + n, s) for n, s in records[member].tensors or ())
    manifest = Manifest(
        step=integer_field(document["step"], "step", 0, STEP_MAX),
        library=string_field(document["library"], "library", layout.LIMITS.library_bytes),
        members=records,
        state=tuple(state),
        world_size=integer_field(document["world_size"], "world_size", 1, layout.LIMITS.world_size),
        key_id=key_id,
        version=SET_VERSION_2,
        structure=structure,
    )
    if signed:
        return manifest
    check_self_digest(document)
    return manifest


# --------------------------------------------------------------------------- writing


def build_manifest_v2(
    step: int,
    library: str,
    members: Mapping[str, MemberRecord],
    structure: Structure,
    world_size: int,
    key: SetKey | None = None,
) -> bytes:
    """A version-2 manifest's bytes (compact JSON, keys in :data:`MANIFEST_KEYS_V2` order;
    with ``key`` signed, its MAC over every byte before it).

    Raises:
        CheckpointError: a value the readers would refuse (named); nothing is committed.
    """
    tensors: Sequence[tuple[str, Sequence[int]]] = [
        t for m in members.values() for t in (m.tensors or ())
    ]
    _check_manifest_values(step, library, tensors, world_size)
    document = manifest_head(SET_VERSION_2, step, library, key)
    document |= {
        "members": {member: member_fields(m) for member, m in members.items()},
        "structure": {
            role: None
            if structure.get(role) is None
            else {"kind": structure[role][0], "keys": list(structure[role][1])}  # type: ignore[index]
            for role in STRUCTURE_ROLES
        },
        "world_size": world_size,
    }
    return seal_manifest(document, key)


MANIFEST_READERS[SET_VERSION_2] = parse_manifest_v2
