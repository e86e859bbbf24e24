"""A checkpoint set's two JSON documents, read: the manifest and the training state.

Both are hostile input like every file: read within a bound (``MAX_MANIFEST_BYTES``,
``MAX_TRAINING_STATE_BYTES``, checked from the size before reading), parsed with orjson,
refused when any object names a key twice (readers disagree on which one counts), and every
field checked for its type and range before anything uses it. Every rejection is a
:class:`~.errors.CheckpointError` subclass naming the field.

The documents' shapes are declared in :mod:`tlckpt.formats.checkpoint_set`; they are written
by :mod:`.set_document_writing`.
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
import xxhash

from ...formats import checkpoint_set as layout
from ...formats.checkpoint_set import (
    DIGEST_ALGORITHM,
    DIGEST_HEX_DIGITS,
    KEY_ID_HEX_DIGITS,
    KEYED_DIGEST_ALGORITHM,
    KEYED_DIGEST_HEX_DIGITS,
    MAC_FIELD,
    MAC_SUFFIX_PREFIX,
    MANIFEST_KEYS,
    MEMBER_FILES,
    MEMBER_KEYS,
    MEMBER_ROLES,
    REQUIRED_MEMBERS,
    RNG_KEYS,
    SET_FORMAT,
    SET_VERSION,
    SIGNED_MANIFEST_KEYS,
    STEP_MAX,
    TRAINING_STATE_FORMAT,
    TRAINING_STATE_KEYS,
    TRAINING_STATE_VERSION,
)
from ...formats.primitives import U64_MAX
from ..errors import (
    IntegrityError,
    KeyRequiredError,
    MalformedError,
)
from .exact_values import decode_value
from .rng_states import check_numpy_state, check_random_state
from .set_document_checks import (
    check_format,
    exact_keys,
    integer_field,
    parse_json_document,
    short,
    string_field,
)
from .set_keys import SetKey

__all__ = [
    "checked_signature",
    "MemberRecord",
    "Manifest",
    "TrainingState",
    "parse_manifest",
    "parse_training_state",
    "self_digest",
    "check_self_digest",
    "MANIFEST_READERS",
]


@dataclass(frozen=True)
class MemberRecord:
    """What the manifest records of one member file.

    Attributes:
        file: its name in the set's folder.
        family: the checkpoint family of its bytes (``"float32_state"``, ``"adam"``, ...).
        version: the family's version (``1`` for the documents of the set).
        size: its size in bytes.
        digest: the digest of its bytes: ``xxh3_128``, 32 lowercase hex digits; in a signed
            set BLAKE3 keyed, 64.
    """

    file: str
    family: str
    version: int
    size: int
    digest: str
    # Version-2 manifests only (``None`` in version 1): see ``formats.checkpoint_set``.
    #: A model member's state tensors ``(name, shape)``, ``state_dict`` order.
    tensors: tuple[tuple[str, tuple[int, ...]], ...] | None = None
    #: A model member's tied names: name → the earlier name it is one tensor with.
    tied: dict[str, str] | None = None
    #: An optimizer member's model keys (the models holding its parameters).
    models: tuple[str, ...] | None = None
    #: An optimizer member's number of param groups.
    groups: int | None = None


@dataclass(frozen=True)
class Manifest:
    """A parsed, checked manifest.

    Attributes:
        step: the training step of the set.
        library: the library that wrote it (``"tlckpt 0.1.0"``).
        members: role → :class:`MemberRecord` (``model``, ``training_state``, and
            ``optimizer`` when the set has one).
        state: the model's state tensors, ``(name, shape)`` in file order.
        world_size: the number of processes that saved it (1 unless sharded).
        key_id: the id of the key a signed set was signed with (16 hex digits), ``None`` for
            an unsigned set.
    """

    step: int
    library: str
    members: dict[str, MemberRecord]
    state: tuple[tuple[str, tuple[int, ...]], ...]
    world_size: int
    key_id: str | None = None
    #: The manifest's version (1, 2: :data:`~tlckpt.formats.checkpoint_set.SET_VERSION_2`, or
    #: 3: a set of one state tree, :data:`~tlckpt.formats.checkpoint_set.SET_VERSION_3`).
    version: int = 1
    #: Version 2: role → ``(kind, keys)`` (or ``None`` for a role not given); version 1:
    #: ``None`` (one model, at most one optimizer and scheduler, each given as one object).
    structure: dict[str, tuple[str, tuple[str, ...]] | None] | None = None


@dataclass(frozen=True)
class TrainingState:
    """A parsed, checked training-state document (values decoded exactly).

    Attributes:
        step: the training step (equal to the manifest's).
        random_counter: the run's random counter (a u64), or ``None``.
        scheduler: the scheduler's ``state_dict``, or ``None`` if the set has none.
        param_groups: every optimizer param group's hyperparameters (without ``params``),
            or ``None`` if the set has no optimizer.
        rng: the global random states (``RNG_KEYS``), or ``None`` if they were not saved.
        extra: the caller's ``extra``, or ``None``.
    """

    step: int
    random_counter: int | None
    scheduler: Any
    param_groups: list[dict[str, Any]] | None
    rng: dict[str, Any] | None
    extra: Any


# --------------------------------------------------------------------------- reading

#: The readers of later manifest versions, by version: each registers itself here
#: (:mod:`.set_manifest_v2`, :mod:`.set_manifest_v3`; imported with the codec), since it
#: builds on this module's field checks and this module cannot import it back.
MANIFEST_READERS: dict[int, Callable[..., Manifest]] = {}


#: A member's digest and family name, as the manifest spells them.
_HEX = re.compile(rf"[0-9a-f]{{{DIGEST_HEX_DIGITS}}}")
_KEYED_HEX = re.compile(rf"[0-9a-f]{{{KEYED_DIGEST_HEX_DIGITS}}}")
_KEY_ID = re.compile(rf"[0-9a-f]{{{KEY_ID_HEX_DIGITS}}}")
_FAMILY = re.compile(rf"[a-z][a-z0-9_]{{0,{layout.LIMITS.family_bytes - 1}}}")


def _hex_field(value: Any, pattern: re.Pattern[str], field: str) -> str:
    if type(value) is not str or not pattern.fullmatch(value):
        digits = pattern.pattern.rpartition("{")[2].rstrip("}")
        raise MalformedError(
            f"{field} must be {digits} lowercase hex digits, got {short(value)}",
            field=field,
            actual=short(value),
        )
    return value


def _member(role: str, entry: Any, digest_pattern: re.Pattern[str] = _HEX) -> MemberRecord:
    field = f"members.{role}"
    if type(entry) is not dict:
        raise MalformedError(f"{field} must be an object", field=field)
    exact_keys(entry, MEMBER_KEYS, field)
    file = string_field(entry["file"], f"{field}.file")
    if file not in MEMBER_FILES[role]:
        raise MalformedError(
            f"{field}.file is {short(file)}; a {role} member is one of"
            f" {', '.join(MEMBER_FILES[role])}",
            field=f"{field}.file",
            actual=short(file),
            expected=list(MEMBER_FILES[role]),
        )
    family = string_field(entry["family"], f"{field}.family", layout.LIMITS.family_bytes)
    if not _FAMILY.fullmatch(family):
        raise MalformedError(f"{field}.family is not a family name: {short(family)}")
    digest = _hex_field(entry["digest"], digest_pattern, f"{field}.digest")
    return MemberRecord(
        file=file,
        family=family,
        version=integer_field(entry["version"], f"{field}.version", 0, U64_MAX),
        size=integer_field(entry["size"], f"{field}.size", 0, U64_MAX),
        digest=digest,
    )


def _state(value: Any) -> tuple[tuple[str, tuple[int, ...]], ...]:
    if type(value) is not list:
        raise MalformedError("state must be an array of [name, shape]", field="state")
    out = []
    for i, item in enumerate(value):
        field = f"state[{i}]"
        if type(item) is not list or len(item) != 2 or type(item[1]) is not list:
            raise MalformedError(f"{field} must be [name, [dims]]", field=field)
        name = string_field(item[0], f"{field}.name")
        rank = layout.LIMITS.rank
        if len(item[1]) > rank:
            raise MalformedError(f"{field} has more than {rank} dimensions", field=field)
        shape = tuple(integer_field(d, f"{field}.shape", 0, U64_MAX) for d in item[1])
        out.append((name, shape))
    return tuple(out)


def parse_manifest(
    data: bytes, limit: int, key: SetKey | None = None, *, authenticate: bool = True
) -> Manifest:
    """The checked manifest in ``data``.

    Args:
        data: the manifest's bytes.
        limit: the most bytes it may have.
        key: the key the set must be signed with; ``None``: the set must be unsigned.
        authenticate: ``False`` checks a signed manifest's structure only, not its MAC nor
            its key (to list sets; never to trust one).

    Raises:
        FileTooLargeError: more than ``limit`` bytes.
        UnsupportedFormatError: not a set's manifest (``format``).
        UnsupportedVersionError: a version this library does not know.
        MalformedError: not JSON, a key twice, a missing, unknown or ill-typed field, a
            member missing or named wrongly, an unknown digest algorithm.
        IntegrityError: the manifest's own digest (``self_digest``) differs: it is damaged
            (``check="manifest digest"``); with ``authenticate``: the set is signed with
            another key (``"key"``), its MAC differs (``"mac"``: edited without the key, or
            damaged), or ``key`` was given and the set is not signed (``"signed"``).
        KeyRequiredError: with ``authenticate``, the set is signed and ``key`` is ``None``.
    """
    document = parse_json_document(data, "manifest", limit)
    version = document.get("version")
    if document.get("format") == SET_FORMAT and type(version) is int:
        later = MANIFEST_READERS.get(version)
        if later is not None:
            return later(data, document, key, authenticate=authenticate)
    check_format(document, SET_FORMAT, SET_VERSION, "checkpoint set manifest")
    signed, key_id = checked_signature(
        data,
        document,
        key,
        authenticate=authenticate,
        keys=MANIFEST_KEYS,
        signed_keys=SIGNED_MANIFEST_KEYS,
    )
    members = document["members"]
    if type(members) is not dict:
        raise MalformedError("members must be an object", field="members")
    unknown = [r for r in members if r not in MEMBER_ROLES]
    missing = [r for r in REQUIRED_MEMBERS if r not in members]
    if unknown or missing:
        raise MalformedError(
            f"members: unknown roles {[r[:40] for r in unknown[:5]]}, missing {missing}",
            field="members",
            actual=sorted(members)[:8],
            expected=list(MEMBER_ROLES),
        )
    digest_pattern = _KEYED_HEX if signed else _HEX
    manifest = Manifest(
        step=integer_field(document["step"], "step", 0, STEP_MAX),
        library=string_field(document["library"], "library", layout.LIMITS.library_bytes),
        members={
            role: _member(role, members[role], digest_pattern)
            for role in MEMBER_ROLES
            if role in members
        },
        state=_state(document["state"]),
        world_size=integer_field(document["world_size"], "world_size", 1, layout.LIMITS.world_size),
        key_id=key_id,
    )
    if signed:
        return manifest
    check_self_digest(document)
    return manifest


def _authenticate(
    data: bytes, document: dict[str, Any], key_id: str, mac: str, key: SetKey | None
) -> None:
    """Check a signed manifest's key id and MAC (the format's docstring says over what).

    Raises:
        KeyRequiredError: ``key`` is ``None``.
        IntegrityError: another key's id, or the MAC differs, or is not the manifest's
            last bytes as the writer writes them.
    """
    if key is None:
        raise KeyRequiredError(
            f"the set is signed ({KEYED_DIGEST_ALGORITHM}, key id {key_id}): it cannot be"
            " authenticated without the key (pass key=, or --key-file)",
            check="key required",
            field="key_id",
            actual=key_id,
        )
    if not hmac.compare_digest(key_id, key.key_id):  # both checked hex: ASCII
        raise IntegrityError(
            f"the set is signed with another key (key id {key_id}; the key given has id"
            f" {key.key_id}), or its key id was edited",
            check="key",
            field="key_id",
            actual=key.key_id,
            expected=key_id,
        )
    suffix = MAC_SUFFIX_PREFIX + mac.encode("ascii") + b'"}'
    if list(document)[-1] != MAC_FIELD or not data.endswith(suffix):
        # Only the writer's own bytes are authenticated, and it ends them so: anything else
        # was rewritten without the key.
        raise IntegrityError(
            f'a signed manifest ends with its MAC (,"{MAC_FIELD}":"<64 hex digits>"}}), this'
            " one does not: it was rewritten without the key",
            check="mac",
            field=MAC_FIELD,
        )
    if not hmac.compare_digest(key.mac(data[: -len(suffix)]), mac):
        raise IntegrityError(
            "the manifest's MAC does not match its bytes: it was edited without the key, or"
            " damaged",
            check="mac",
            field=MAC_FIELD,
        )


_RNG_HEX = re.compile(r"(?:[0-9a-f]{2})*")  # a random state's bytes, in hex


def _rng(value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    if type(value) is not dict:
        raise MalformedError("rng must be an object or null", field="rng")
    exact_keys(value, RNG_KEYS, "rng")
    for key in ("torch",):
        if type(value[key]) is not str or not _RNG_HEX.fullmatch(value[key]):
            raise MalformedError(f"rng.{key} must be hex bytes", field=f"rng.{key}")
    cuda = value["cuda"]
    if type(cuda) is not list or any(type(s) is not str or not _RNG_HEX.fullmatch(s) for s in cuda):
        raise MalformedError("rng.cuda must be an array of hex bytes", field="rng.cuda")
    return {
        "torch": bytes.fromhex(value["torch"]),
        "cuda": [bytes.fromhex(s) for s in cuda],
        # Checked whole before anything can install them: numpy's and random's own
        # set_state trust a position and the words' ranges (a crafted pos crashes numpy).
        "numpy": check_numpy_state(decode_value(value["numpy"], ("rng", "numpy"))),
        "random": check_random_state(decode_value(value["random"], ("rng", "random"))),
    }


def parse_training_state(data: bytes, limit: int) -> TrainingState:
    """The checked, decoded training-state document in ``data``.

    Raises:
        FileTooLargeError, UnsupportedFormatError, UnsupportedVersionError, MalformedError:
            as :func:`parse_manifest`, for this document's fields and values.
    """
    document = parse_json_document(data, "training state", limit)
    check_format(document, TRAINING_STATE_FORMAT, TRAINING_STATE_VERSION, "training-state document")
    exact_keys(document, TRAINING_STATE_KEYS, "training state")
    counter = document["random_counter"]
    groups = document["param_groups"]
    if groups is not None and (
        type(groups) is not list or any(type(g) is not dict for g in groups)
    ):
        raise MalformedError(
            "param_groups must be an array of objects or null", field="param_groups"
        )
    decoded_groups = None
    if groups is not None:
        decoded_groups = [decode_value(g, ("param_groups", i)) for i, g in enumerate(groups)]
        for i, g in enumerate(decoded_groups):
            if type(g) is not dict or not all(type(k) is str for k in g) or "params" in g:
                raise MalformedError(
                    f"param_groups[{i}] must map hyperparameter names to values (no params)",
                    field=f"param_groups[{i}]",
                )
    return TrainingState(
        step=integer_field(document["step"], "step", 0, STEP_MAX),
        random_counter=None
        if counter is None
        else integer_field(counter, "random_counter", 0, U64_MAX),
        scheduler=decode_value(document["scheduler"], ("scheduler",)),
        param_groups=decoded_groups,
        rng=_rng(document["rng"]),
        extra=decode_value(document["extra"], ("extra",)),
    )


def check_self_digest(document: dict[str, Any]) -> None:
    """Check an unsigned manifest's own digest (``self_digest``) against its other fields.

    Raises:
        MalformedError: ``self_digest`` is not a digest.
        IntegrityError: it differs: the manifest's bytes are damaged.
    """
    recorded = _hex_field(document["self_digest"], _HEX, "self_digest")
    computed = self_digest(document)
    if computed != recorded:
        raise IntegrityError(
            f"the manifest's own digest is {computed}, it records {recorded} (the manifest's"
            " bytes are damaged)",
            check="manifest digest",
            field="self_digest",
            actual=computed,
            expected=recorded,
        )


def self_digest(document: dict[str, Any]) -> str:
    """The manifest's own digest: of its compact JSON without ``self_digest``, in order."""
    body = {k: v for k, v in document.items() if k != "self_digest"}
    return xxhash.xxh3_128(orjson.dumps(body)).hexdigest()


def checked_signature(
    data: bytes,
    document: dict[str, Any],
    key: SetKey | None,
    *,
    authenticate: bool,
    keys: Any,
    signed_keys: Any,
) -> tuple[bool, str | None]:
    """The checks every manifest version begins with: a signed manifest authenticated (with
    ``authenticate``) before any other field is read, its keys exactly ``keys`` (or
    ``signed_keys``), a known digest algorithm, and no key given for an unsigned set.

    Returns:
        Whether the manifest is signed, and its key id (``None`` if not).

    Raises:
        As :func:`parse_manifest`: MalformedError, IntegrityError, KeyRequiredError.
    """
    signed = document.get("digest") == KEYED_DIGEST_ALGORITHM
    key_id = None
    if signed:
        # Authenticated before any other field is read: an edited manifest is refused as
        # such (IntegrityError), whatever the edit made of its fields.
        key_id = _hex_field(document.get("key_id"), _KEY_ID, "key_id")
        mac = _hex_field(document.get(MAC_FIELD), _KEYED_HEX, MAC_FIELD)
        if authenticate:
            _authenticate(data, document, key_id, mac, key)
    exact_keys(document, signed_keys if signed else keys, "manifest")
    if document["digest"] not in (DIGEST_ALGORITHM, KEYED_DIGEST_ALGORITHM):
        raise MalformedError(
            f"digest algorithm {short(document['digest'])} is not known; known:"
            f" {DIGEST_ALGORITHM}, {KEYED_DIGEST_ALGORITHM}",
            field="digest",
            actual=short(document["digest"]),
            expected=[DIGEST_ALGORITHM, KEYED_DIGEST_ALGORITHM],
        )
    if not signed and authenticate and key is not None:
        raise IntegrityError(
            f"the set is not signed (its digests are {DIGEST_ALGORITHM}, which anyone can"
            " recompute), and a key was given: it cannot be authenticated",
            check="signed",
            field="digest",
            actual=DIGEST_ALGORITHM,
            expected=KEYED_DIGEST_ALGORITHM,
        )
    return signed, key_id
