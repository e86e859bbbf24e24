"""The one error hierarchy of the library, and the one place construct errors become it.

Every rejection of a file, or of caller input that does not fit a file, is a
:class:`CheckpointError` (a ``ValueError``). Binary-format errors carry the byte ``offset`` of
the field, the field ``path`` in the spec, and the file vs expected values.
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable
from typing import Any, TypeVar

from construct import ConstructError

from ..formats.primitives import InvalidField
from .paths import field_name

__all__ = [
    "CheckpointError",
    "UnsupportedFormatError",
    "UnsupportedVersionError",
    "TruncatedError",
    "TrailingDataError",
    "SchemaMismatchError",
    "ConfigError",
    "EntryError",
    "MalformedError",
    "FileTooLargeError",
    "FileChangedError",
    "PartialLoadError",
    "IntegrityError",
    "KeyRequiredError",
    "ERROR_OF_CATEGORY",
    "error_for_category",
    "differs",
    "from_construct",
    "names_the_file",
]


class CheckpointError(ValueError):
    """A file (or caller input meant for one) does not fit the format or the destination.

    Attributes:
        path: the file, where known.
        offset: byte position of the offending field in binary files, else ``None``.
        field: the field or slot, as a spec path (``schema.slots[2].dims[1]``).
        actual: the value found in the file (or given by the caller).
        expected: the value or rule that was expected.
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | os.PathLike | None = None,
        offset: int | None = None,
        field: str | None = None,
        actual: Any = None,
        expected: Any = None,
    ):
        self.reason = message
        self.path = os.fspath(path) if isinstance(path, (str, os.PathLike)) else path
        self.offset = offset
        self.field = field
        self.actual = actual
        self.expected = expected
        super().__init__(self._render())

    def _render(self) -> str:
        where = []
        if self.path is not None:
            where.append(str(self.path))
        if self.offset is not None:
            where.append(f"at byte {self.offset}")
        if self.field:
            where.append(f"field {self.field}")
        prefix = (", ".join(where) + ": ") if where else ""
        return prefix + self.reason

    def with_path(self, path: str | os.PathLike | None) -> CheckpointError:
        """Attach the file name once it is known (readers raise before they know it)."""
        if path is not None and self.path is None:
            self.path = os.fspath(path) if isinstance(path, (str, os.PathLike)) else repr(path)
            self.args = (self._render(),)
        return self


class UnsupportedFormatError(CheckpointError):
    """Foreign file: wrong magic, or a wrong/missing JSON format tag."""


class UnsupportedVersionError(CheckpointError):
    """Known family, unknown version (a newer or older writer)."""


class TruncatedError(CheckpointError):
    """The file ends before a field or payload it announces."""


class TrailingDataError(CheckpointError):
    """Bytes after the last expected record."""


class SchemaMismatchError(CheckpointError):
    """Slot/tensor count, rank, dims, element count, trainability or alias map differ."""


class ConfigError(CheckpointError):
    """Hyperparameters invalid or different; kind/dtype/counter tag invalid; dtype mismatch."""


class EntryError(CheckpointError):
    """A moment entry is wrong: count, id, duplicate, step, element count."""


class MalformedError(CheckpointError):
    """Not JSON, wrong JSON types, duplicate keys, words out of range."""


class FileTooLargeError(CheckpointError):
    """A file larger than a read may take: more bytes than the largest valid encoding of
    the destination, more than the JSON read cap, or more than memory allows.

    Raised before the file is read whole (from its size alone) where a bound is known, and
    instead of a ``MemoryError`` where the bytes are allowed but memory runs out.
    """


class FileChangedError(CheckpointError):
    """The file changed while it was being read (another process wrote, truncated or
    extended it in place); nothing live was changed. Load it again once it is complete."""


class PartialLoadError(CheckpointError):
    """An in-place load (``staged=False``) failed after it had begun overwriting live
    tensors: the model is partially updated. The message says how many tensors were
    overwritten (also ``actual``, of ``expected`` in all); the cause (the file changed, was
    truncated, or an ``OSError``) is ``__cause__``. Load a complete file again, or restore
    the model."""

    @property
    def written(self) -> Any:
        """How many tensors had been (possibly partly) overwritten (``actual``)."""
        return self.actual

    @property
    def total(self) -> Any:
        """How many tensors the load was to write (``expected``)."""
        return self.expected


class IntegrityError(CheckpointError):
    """A member of a checkpoint set is missing, or its bytes are not those its manifest
    records (size or digest): a flipped bit, a truncated, extended or replaced file.

    ``field`` names the member (``members.model``); ``check`` says which check failed
    (``"present"``, ``"size"`` or ``"digest"``; ``"manifest digest"`` when the manifest's own
    digest differs); ``actual`` and ``expected`` are the values.

    For a set loaded with a key it is also raised when the set does not authenticate:
    ``check`` is ``"mac"`` (the manifest was edited or damaged: its MAC differs), ``"key"``
    (signed with another key: ``actual`` and ``expected`` are key ids), ``"signed"`` (the
    set is not signed, so nothing shows who wrote it) or ``"step"`` (a signed manifest in
    another step's folder: copied there). :class:`KeyRequiredError` is the one raised for a
    signed set read without a key.
    """

    def __init__(self, message: str, *, check: str | None = None, **kwargs: Any):
        self.check = check
        super().__init__(message, **kwargs)


class KeyRequiredError(IntegrityError):
    """The set is signed and no key was given: it cannot be authenticated without its key,
    so it is refused (``check`` is ``"key required"``, ``actual`` the key id it records)."""


#: What each kind of broken rule raises: the categories of the spec checks
#: (``formats.primitives.Category``) and of the conformance manifest (``tests/vectors``),
#: which names three of them more finely (``dtype``, ``counter``; ``json``, ``value``).
ERROR_OF_CATEGORY: dict[str, type[CheckpointError]] = {
    "family": UnsupportedFormatError,
    "version": UnsupportedVersionError,
    "truncated": TruncatedError,
    "trailing": TrailingDataError,
    "schema": SchemaMismatchError,
    "config": ConfigError,
    "dtype": ConfigError,
    "counter": ConfigError,
    "entry": EntryError,
    "malformed": MalformedError,
    "json": MalformedError,
    "value": MalformedError,
}


def error_for_category(category: str) -> type[CheckpointError]:
    """The error class for a spec check's category (see ``formats.primitives.Category``)."""
    return ERROR_OF_CATEGORY.get(category, CheckpointError)


_E = TypeVar("_E", bound=CheckpointError)


def differs(
    cls: type[_E], message: str, offset: int | None, path: tuple | str, actual: Any, expected: Any
) -> _E:
    """The error for the field at spec ``path`` (byte ``offset``) whose value ``actual``
    differs from the ``expected`` one; the caller raises it.

    The readers compare first and build the error only then: on the path of a valid file no
    message is formatted and no field name rendered.
    """
    return cls(message, offset=offset, field=field_name(path), actual=actual, expected=expected)


def from_construct(
    exc: ConstructError, *, offset: int | None, field: str, writing: bool = False
) -> CheckpointError:
    """Convert a construct error raised while parsing or building ``field``.

    This is the only place where construct's exceptions turn into ours.
    """
    if isinstance(exc, InvalidField):
        cls = error_for_category(exc.category)
        return cls(
            f"invalid {field}: expected {exc.expected}, file has {exc.actual!r}"
            if not writing
            else f"cannot write {field}: expected {exc.expected}, got {exc.actual!r}",
            offset=offset,
            field=field,
            actual=exc.actual,
            expected=exc.expected,
        )
    text = str(exc).strip() or type(exc).__name__
    if writing:
        return CheckpointError(f"cannot write {field}: {text}", offset=offset, field=field)
    return MalformedError(f"cannot parse {field}: {text}", offset=offset, field=field)


_F = TypeVar("_F", bound=Callable[..., Any])


def names_the_file(param: str = "path") -> Callable[[_F], _F]:
    """Decorator for public functions given a file: every :class:`CheckpointError` leaving
    the function names it (``exc.path``, and the message starts with it).

    The one place where errors raised before a file is opened (caller input refused before a
    save, a destination the runtime cannot bind) or after it is closed learn its name. An
    error that already names a file keeps that name. Only paths are attached here; a file
    object's name is attached by the reader that opens it.

    Args:
        param: the name of the function's path parameter.
    """

    def decorate(fn: _F) -> _F:
        signature = inspect.signature(fn)
        if param not in signature.parameters:
            raise TypeError(f"{fn.__qualname__} has no parameter {param!r}")

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except CheckpointError as exc:
                try:
                    given = signature.bind(*args, **kwargs).arguments.get(param)
                except TypeError:  # pragma: no cover - the call itself would have failed
                    given = None
                if isinstance(given, (str, os.PathLike)):
                    exc.with_path(given)
                raise

        return wrapper  # type: ignore[return-value]

    return decorate
