"""Version 3 of a checkpoint set's manifest: a set of one state tree (a framework's whole
checkpoint, such as Lightning's checkpoint dict), described in
:mod:`tlckpt.formats.checkpoint_set`, "version 3".

Read like versions 1 and 2 (hostile-input safe, every field checked before use, the
signed manifest authenticated before any other field is read); the members are exactly the
tree member (``state.safetensors``) and the training state.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ...formats import checkpoint_set as layout
from ...formats.checkpoint_set import (
    MANIFEST_KEYS_V3,
    SET_VERSION_3,
    SIGNED_MANIFEST_KEYS_V3,
    STATE_TREE_FILE,
    STATE_TREE_MEMBER,
    STATE_TREE_MEMBER_KEYS,
    STEP_MAX,
)
from ...formats.primitives import U64_MAX
from ..errors import MalformedError
from .set_document_checks import exact_keys, integer_field, short, string_field

# The version-1 reader's and writer's field checks, shared so that every version checks alike.
from .set_document_writing import (
    _check_manifest_values,
    manifest_head,
    member_fields,
    seal_manifest,
)
from .set_documents import (
    _HEX,
    _KEYED_HEX,
    MANIFEST_READERS,
    Manifest,
    MemberRecord,
    _hex_field,
    _member,
    _state,
    check_self_digest,
    checked_signature,
)
from .set_keys import SetKey

__all__ = ["build_manifest_v3", "parse_manifest_v3", "is_state_tree_set"]

#: The members of a version-3 set, in the order a manifest lists them.
_MEMBERS = (STATE_TREE_MEMBER, "training_state")


def is_state_tree_set(manifest: Manifest) -> bool:
    """Whether ``manifest`` is that of a set of one state tree (version 3)."""
    return manifest.version == SET_VERSION_3


def _tree_member(entry: Any, digest_pattern: Any) -> MemberRecord:
    field = f"members.{STATE_TREE_MEMBER}"
    if type(entry) is not dict:
        raise MalformedError(f"{field} must be an object", field=field)
    exact_keys(entry, STATE_TREE_MEMBER_KEYS, field)
    file = string_field(entry["file"], f"{field}.file")
    if file != STATE_TREE_FILE:
        raise MalformedError(
            f"{field}.file is {short(file)}; the tree member is {STATE_TREE_FILE}",
            field=f"{field}.file",
            actual=short(file),
            expected=STATE_TREE_FILE,
        )
    family = string_field(entry["family"], f"{field}.family", layout.LIMITS.family_bytes)
    if family != "safetensors":
        raise MalformedError(
            f"{field}.family is {short(family)}; the tree member is in the safetensors layout",
            field=f"{field}.family",
            actual=short(family),
        )
    try:
        tensors = _state(entry["tensors"])
    except MalformedError as exc:
        raise MalformedError(f"{field}.tensors: {exc}", field=f"{field}.tensors") from None
    if len({name for name, _ in tensors}) != len(tensors):
        raise MalformedError(f"{field}.tensors names a tensor twice", field=f"{field}.tensors")
    if entry["tied"] != {}:
        # A tree stores a tensor it holds in several places once: nothing is tied.
        raise MalformedError(f"{field}.tied must be empty", field=f"{field}.tied")
    return MemberRecord(
        file=file,
        family=family,
        version=integer_field(entry["version"], f"{field}.version", 0, 0),
        size=integer_field(entry["size"], f"{field}.size", 0, U64_MAX),
        digest=_hex_field(entry["digest"], digest_pattern, f"{field}.digest"),
        tensors=tensors,
        tied={},
    )


def parse_manifest_v3(
    data: bytes, document: dict[str, Any], key: SetKey | None, *, authenticate: bool
) -> Manifest:
    """The checked version-3 manifest ``document`` (parsed from ``data``).

    Raises:
        As :func:`~.set_documents.parse_manifest`; besides, MalformedError for members other
        than the tree and the training state, or a tree member that is not
        ``state.safetensors`` in the safetensors layout.
    """
    signed, key_id = checked_signature(
        data,
        document,
        key,
        authenticate=authenticate,
        keys=MANIFEST_KEYS_V3,
        signed_keys=SIGNED_MANIFEST_KEYS_V3,
    )
    members = document["members"]
    if type(members) is not dict or sorted(members) != sorted(_MEMBERS):
        raise MalformedError(
            f"members must be exactly {list(_MEMBERS)}",
            field="members",
            actual=[short(m) for m in list(members)[:8]] if type(members) is dict else None,
            expected=list(_MEMBERS),
        )
    pattern = _KEYED_HEX if signed else _HEX
    tree = _tree_member(members[STATE_TREE_MEMBER], pattern)
    training = _member("training_state", members["training_state"], pattern)
    manifest = Manifest(
        step=integer_field(document["step"], "step", 0, STEP_MAX),
        library=string_field(document["library"], "library", layout.LIMITS.library_bytes),
        members={STATE_TREE_MEMBER: tree, "training_state": training},
        state=tree.tensors or (),
        world_size=integer_field(document["world_size"], "world_size", 1, layout.LIMITS.world_size),
        key_id=key_id,
        version=SET_VERSION_3,
    )
    if not signed:
        check_self_digest(document)
    return manifest


def build_manifest_v3(
    step: int,
    library: str,
    members: Mapping[str, MemberRecord],
    world_size: int = 1,
    key: SetKey | None = None,
) -> bytes:
    """A version-3 manifest's bytes (compact JSON, keys in :data:`MANIFEST_KEYS_V3` order;
    with ``key`` signed, its MAC over every byte before it).

    Args:
        step: the set's step.
        library: the writer's name.
        members: the tree member (with its ``tensors``) and the training state.
        world_size: how many processes saved it.
        key: the set's key, if it is signed.

    Raises:
        CheckpointError: a value the readers would refuse (named); nothing is committed.
    """
    tensors: Sequence[tuple[str, Sequence[int]]] = members[STATE_TREE_MEMBER].tensors or ()
    _check_manifest_values(step, library, tensors, world_size)
    document = manifest_head(SET_VERSION_3, step, library, key)
    document |= {
        "members": {role: member_fields(members[role]) for role in _MEMBERS},
        "world_size": world_size,
    }
    return seal_manifest(document, key, " (too many or too long tensor names)")


MANIFEST_READERS[SET_VERSION_3] = parse_manifest_v3
