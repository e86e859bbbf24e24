"""A checkpoint set's two JSON documents, written: the manifest and the training state.

A writer refuses what a reader (:mod:`.set_documents`) would refuse, before anything is
committed, naming the field.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from ...formats import checkpoint_set as layout
from ...formats.checkpoint_set import (
    DIGEST_ALGORITHM,
    KEYED_DIGEST_ALGORITHM,
    MAC_SUFFIX_PREFIX,
    SET_FORMAT,
    SET_VERSION,
    STEP_MAX,
    TRAINING_STATE_FORMAT,
    TRAINING_STATE_VERSION,
)
from ...formats.primitives import U64_MAX
from ..errors import (
    CheckpointError,
)
from .exact_values import encode_value
from .rng_states import check_numpy_state, check_random_state
from .set_document_checks import (
    short,
)
from .set_documents import MemberRecord, self_digest
from .set_keys import SetKey

__all__ = [
    "build_manifest",
    "build_training_state",
    "manifest_head",
    "member_fields",
    "seal_manifest",
]


def _writer_check(condition: bool, field: str, message: str, actual: Any = None) -> None:
    """Refuse, at the writer, what the reader would refuse (before anything is committed)."""
    if not condition:
        raise CheckpointError(f"{field} {message}", field=field, actual=actual)


def _utf8_bytes(text: str) -> int | None:
    """``text``'s size in UTF-8, or ``None`` when it holds a lone surrogate (no UTF-8)."""
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError:
        return None


def _check_manifest_values(
    step: int, library: str, state: Sequence[tuple[str, Sequence[int]]], world_size: int
) -> None:
    limits = layout.LIMITS
    _writer_check(type(step) is int and 0 <= step <= STEP_MAX, "step", "must be a u64", short(step))
    size = _utf8_bytes(library) if type(library) is str else None
    _writer_check(
        size is not None and size <= limits.library_bytes,
        "library",
        f"must be a string of at most {limits.library_bytes} UTF-8 bytes",
        short(library),
    )
    _writer_check(
        type(world_size) is int and 1 <= world_size <= limits.world_size,
        "world_size",
        f"must be an integer in [1, {limits.world_size}]",
        short(world_size),
    )
    for i, (name, shape) in enumerate(state):
        size = _utf8_bytes(name) if type(name) is str else None
        _writer_check(
            size is not None and size <= limits.name_bytes,
            f"state[{i}].name",
            f"must be a string of at most {limits.name_bytes} UTF-8 bytes (no lone"
            " surrogate): every reader of the manifest refuses longer names",
            short(name),
        )
        _writer_check(
            len(shape) <= limits.rank and all(type(d) is int and 0 <= d <= U64_MAX for d in shape),
            f"state[{i}].shape",
            f"must have at most {limits.rank} dimensions, each a u64",
            short(shape),
        )


def build_manifest(
    step: int,
    library: str,
    members: dict[str, MemberRecord],
    state: Sequence[tuple[str, Sequence[int]]],
    world_size: int,
    key: SetKey | None = None,
) -> bytes:
    """The manifest's bytes (compact JSON, keys in :data:`MANIFEST_KEYS` order; with
    ``key``, a signed manifest: :data:`SIGNED_MANIFEST_KEYS`, its MAC last).

    Raises:
        CheckpointError: a value the manifest's readers would refuse (a tensor name longer
            than ``LIMITS.name_bytes``, more than ``LIMITS.rank`` dimensions, a library name
            or world size out of bounds, a manifest over ``LIMITS.manifest_bytes``), named;
            nothing is committed.
    """
    _check_manifest_values(step, library, state, world_size)
    document = manifest_head(SET_VERSION, step, library, key)
    document |= {
        "members": {role: member_fields(m) for role, m in members.items()},
        "state": [[name, list(shape)] for name, shape in state],
        "world_size": world_size,
    }
    return seal_manifest(document, key, " (too many or too long tensor names)")


def manifest_head(version: int, step: int, library: str, key: SetKey | None) -> dict[str, Any]:
    """A manifest's first fields, every version's: format, version, step, library, digest
    algorithm and, with ``key``, the key's id.

    Returns:
        The document so far, in key order; the caller adds the rest.
    """
    document: dict[str, Any] = {
        "format": SET_FORMAT,
        "version": version,
        "step": step,
        "library": library,
        "digest": DIGEST_ALGORITHM if key is None else KEYED_DIGEST_ALGORITHM,
    }
    if key is not None:
        document["key_id"] = key.key_id
    return document


def member_fields(m: MemberRecord) -> dict[str, Any]:
    """A member's record as a manifest holds it: file, family, version, size and digest;
    version 2's model (``tensors``, ``tied``) and optimizer (``models``, ``groups``) fields
    where the record has them.

    Returns:
        JSON values, in the manifest's key order.
    """
    out: dict[str, Any] = {
        "file": m.file,
        "family": m.family,
        "version": m.version,
        "size": m.size,
        "digest": m.digest,
    }
    if m.tensors is not None:
        out["tensors"] = [[name, list(shape)] for name, shape in m.tensors]
        out["tied"] = dict(m.tied or {})
    if m.models is not None:
        out["models"] = list(m.models)
        out["groups"] = m.groups
    return out


def seal_manifest(document: dict[str, Any], key: SetKey | None, why_long: str = "") -> bytes:
    """A complete manifest document's bytes, sealed: with ``key`` its MAC over every byte
    before it, last; else its own digest (``self_digest``).

    Args:
        document: every field but the seal, in key order.
        key: the set's key, if it is signed.
        why_long: what makes a manifest long, for the message of one over the limit.

    Raises:
        CheckpointError: the manifest would be longer than ``LIMITS.manifest_bytes``.
    """
    if key is not None:
        body = orjson.dumps(document)[:-1]  # without the closing brace
        data = body + MAC_SUFFIX_PREFIX + key.mac(body).encode("ascii") + b'"}'
    else:
        document["self_digest"] = self_digest(document)
        data = orjson.dumps(document)
    _writer_check(
        len(data) <= layout.LIMITS.manifest_bytes,
        "manifest",
        f"would have {len(data):,} bytes, more than the {layout.LIMITS.manifest_bytes:,} a"
        f" reader takes{why_long}",
        len(data),
    )
    return data


def build_training_state(
    step: int,
    random_counter: int | None,
    scheduler: Any,
    param_groups: list[dict[str, Any]] | None,
    rng: dict[str, Any] | None,
    extra: Any,
) -> bytes:
    """The training-state document's bytes; every value encoded exactly or refused.

    Args:
        step: the training step.
        random_counter: a u64, or ``None``.
        scheduler: the scheduler's ``state_dict`` (or ``None``).
        param_groups: each group's hyperparameters without ``params`` (or ``None``).
        rng: ``{"torch": bytes, "cuda": [bytes, ...], "numpy": value, "random": value}``, or
            ``None``.
        extra: the caller's value (or ``None``).

    Raises:
        CheckpointError: a value JSON cannot hold exactly or a reader would refuse (too
            deep, an integer of too many digits; the message names where), a random counter
            or step outside the u64 range, or a document over
            ``LIMITS.training_state_bytes``: every bound of :data:`~.checkpoint_set.LIMITS`
            that :func:`parse_training_state` keeps, checked before anything is written.
    """
    if random_counter is not None and (
        type(random_counter) is not int or not 0 <= random_counter <= U64_MAX
    ):
        raise CheckpointError(
            f"random_counter must be an integer in [0, 2**64 - 1], got {short(random_counter)}",
            field="random_counter",
            actual=short(random_counter),
        )
    _writer_check(type(step) is int and 0 <= step <= STEP_MAX, "step", "must be a u64", short(step))
    if param_groups is not None:
        for i, group in enumerate(param_groups):
            # What the reader requires of a group (hyperparameter names to values).
            _writer_check(
                type(group) is dict
                and all(type(k) is str for k in group)
                and "params" not in group,
                f"param_groups[{i}]",
                "must map hyperparameter names (strings) to values, without params",
                short(group),
            )
    document = {
        "format": TRAINING_STATE_FORMAT,
        "version": TRAINING_STATE_VERSION,
        "step": step,
        "random_counter": random_counter,
        "scheduler": encode_value(scheduler, ("scheduler",)),
        "param_groups": None
        if param_groups is None
        else [encode_value(g, ("param_groups", i)) for i, g in enumerate(param_groups)],
        "rng": None
        if rng is None
        else {
            "torch": rng["torch"].hex(),
            "cuda": [s.hex() for s in rng["cuda"]],
            # What the reader refuses is refused here, before anything is written.
            "numpy": encode_value(check_numpy_state(rng["numpy"]), ("rng", "numpy")),
            "random": encode_value(check_random_state(rng["random"]), ("rng", "random")),
        },
        "extra": encode_value(extra, ("extra",)),
    }
    data = orjson.dumps(document)
    limit = layout.LIMITS.training_state_bytes
    _writer_check(
        len(data) <= limit,
        "training state",
        f"would have {len(data):,} bytes, more than the {limit:,} a reader takes (a smaller"
        " extra, or keep large data in a file of its own)",
        len(data),
    )
    return data
