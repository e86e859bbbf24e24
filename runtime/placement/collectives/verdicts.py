"""Go / no-go for every rank, and small values broadcast from the writer.

:func:`share_verdict` is how a sharded checkpoint fails: the lowest failing rank's error is
described as JSON (class, message, fields; never pickled), broadcast, and rebuilt as the
same class and message on every other rank, so that every rank raises alike.
"""

from __future__ import annotations

import builtins
from typing import Any

import orjson
import torch
import torch.distributed as dist

from ....codec import errors as checkpoint_errors
from ....codec.errors import CheckpointError, SchemaMismatchError
from .group import WRITER, current_group, rank, wire_device, world_size

__all__ = ["share_verdict", "broadcast_bytes", "broadcast_json", "all_rows", "all_agree"]

_ERROR_CLASSES: dict[str, type[CheckpointError]] = {
    name: cls
    for name, cls in vars(checkpoint_errors).items()
    if isinstance(cls, type) and issubclass(cls, CheckpointError)
}


def _describe(error: BaseException) -> bytes:
    fields: dict[str, Any] = {"type": type(error).__name__}
    if isinstance(error, CheckpointError):
        fields.update(
            reason=error.reason,
            path=error.path,
            offset=error.offset,
            field=error.field,
            actual=error.actual,
            expected=error.expected,
        )
    elif isinstance(error, OSError):
        fields.update(errno=error.errno, strerror=error.strerror, filename=error.filename)
    fields["text"] = str(error)
    return orjson.dumps(fields, default=repr, option=orjson.OPT_NON_STR_KEYS)


def _rebuild(description: bytes, source: int) -> BaseException:
    """The error another rank raised, as this rank raises it: the same class and message."""
    fields = orjson.loads(description)
    name = fields["type"]
    if name in _ERROR_CLASSES:
        return _ERROR_CLASSES[name](
            fields["reason"],
            path=fields["path"],
            offset=fields["offset"],
            field=fields["field"],
            actual=fields["actual"],
            expected=fields["expected"],
        )
    cls = getattr(builtins, name, None)
    if isinstance(cls, type) and issubclass(cls, OSError) and "strerror" in fields:
        if fields["errno"] is None:
            return cls(fields["text"])
        return cls(fields["errno"], fields["strerror"], fields["filename"])
    return CheckpointError(f"rank {source} failed: {name}: {fields['text']}")


def share_verdict(error: BaseException | None, layout: bytes = b"") -> None:
    """Collective: go on together, or raise the same error on every rank.

    Args:
        error: what this rank's local work raised, or ``None``.
        layout: this rank's layout fingerprint (:func:`~.dtensors.fingerprint`); all ranks
            must pass equal bytes (or all pass nothing).

    Raises:
        CheckpointError: on every rank, the same subclass and message: the lowest failing
            rank's own error; or, when that was something else, one that names the rank
            and the error (``raise ... from`` it on that rank); or a
            ``SchemaMismatchError`` when the ranks' layouts differ.
        OSError: on every rank (the same class, errno, message and file name), when the
            lowest failing rank failed with one: the file system's errors stay what the
            single-process functions raise.
    """
    device = wire_device()
    digest = layout.ljust(32, b"\0")[:32]
    mine = torch.tensor([error is not None, *digest], dtype=torch.uint8, device=device)
    everyone = [torch.empty_like(mine) for _ in range(world_size())]
    dist.all_gather(everyone, mine, group=current_group())
    rows = [bytes(t.cpu().tolist()) for t in everyone]
    failed = [r for r, row in enumerate(rows) if row[0]]
    if not failed:
        differing = [r for r, row in enumerate(rows) if row[1:] != rows[WRITER][1:]]
        if differing:
            raise SchemaMismatchError(
                f"rank(s) {differing} hold a different model, optimizer or layout than rank"
                f" {WRITER} (names, shapes, dtypes, placements, tied weights or config);"
                " every rank must pass its part of the same sharded objects",
                actual=differing,
            )
        return
    source = failed[0]
    description = broadcast_bytes(_describe(error) if rank() == source else None, source)
    rebuilt = _rebuild(description, source)
    if rank() == source:
        if type(rebuilt) is type(error):
            raise error  # type: ignore[misc]  # this rank's own error, with its traceback
        raise rebuilt from error
    if hasattr(rebuilt, "add_note"):
        rebuilt.add_note(f"(raised on rank {source}; every rank raises it)")
    raise rebuilt


def broadcast_bytes(data: bytes | None, source: int = WRITER) -> bytes:
    """Collective: ``source``'s bytes on every rank."""
    device = wire_device()
    size = torch.tensor([len(data) if rank() == source else 0], dtype=torch.int64, device=device)
    dist.broadcast(size, src=source, group=current_group())
    if rank() == source:
        payload = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device)
    else:
        payload = torch.empty(int(size.item()), dtype=torch.uint8, device=device)
    if payload.numel():
        dist.broadcast(payload, src=source, group=current_group())
    return bytes(payload.cpu().tolist()) if rank() != source else data


def broadcast_json(value: Any, source: int = WRITER) -> Any:
    """Collective: ``source``'s JSON value (ints up to 2^64 - 1, lists, strings) everywhere."""
    data = orjson.dumps(value) if rank() == source else None
    return orjson.loads(broadcast_bytes(data, source))


def all_rows(row: bytes) -> list[bytes]:
    """Collective: every rank's ``row`` (the same length on every rank), by rank."""
    device = wire_device()
    mine = torch.tensor(list(row), dtype=torch.uint8, device=device)
    everyone = [torch.empty_like(mine) for _ in range(world_size())]
    dist.all_gather(everyone, mine, group=current_group())
    return [bytes(t.cpu().tolist()) for t in everyone]


def all_agree(ok: bool, digest: bytes = b"") -> bool:
    """Collective: whether every rank is ``ok`` and every rank's ``digest`` (up to 32
    bytes) is the same."""
    rows = all_rows(bytes([bool(ok)]) + digest.ljust(32, b"\0")[:32])
    return all(row[0] for row in rows) and len({row[1:] for row in rows}) == 1
