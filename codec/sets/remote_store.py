"""Checkpoint sets on object storage: the store a URL names (any fsspec filesystem).

A *URL* is a path with a scheme (``s3://bucket/run``, ``gs://…``, ``memory://…``,
``file:///…``); a plain path is not one and keeps the POSIX code of :mod:`.set_commit`.
fsspec (and s3fs for ``s3://``) is imported only when a URL is used: ``tlckpt[remote]``.

:class:`Store` is what the remote sets need of a filesystem, in a few calls: objects listed
under a prefix, read by range, written once (conditional create where the store has it),
deleted; for S3, multipart uploads listed and aborted. Every S3 request is bounded
(:data:`S3_DEFAULTS`: connect and read timeouts, a bounded number of attempts): a store
that does not answer raises ``OSError``, never hangs.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import importlib
import re
from collections.abc import Iterable, Iterator
from typing import Any

__all__ = [
    "S3_DEFAULTS",
    "client_errors",
    "is_url",
    "Store",
    "open_store",
    "join_url",
    "split_url",
]

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://")

#: The botocore settings every ``s3://`` store gets unless ``storage_options`` says
#: otherwise (``config_kwargs``): seconds to connect and to wait for a read, and at most
#: this many attempts per request (botocore's "standard" retries, on top of which s3fs
#: retries a few transient errors a bounded number of times).
S3_DEFAULTS: dict[str, Any] = {
    "connect_timeout": 10,
    "read_timeout": 60,
    "retries": {"max_attempts": 3, "mode": "standard"},
}


#: Where the exceptions of the clients under fsspec come from that are not ``OSError``s
#: (botocore's ``EndpointConnectionError``, aiohttp's payload errors…).
_CLIENT_MODULES = ("botocore", "aiobotocore", "aiohttp", "s3fs", "gcsfs", "google")


@contextlib.contextmanager
def client_errors(what: str) -> Iterator[None]:
    """Raise a client library's own exception from inside as ``OSError`` (naming ``what``):
    callers catch ``OSError`` for the store's failures, as for a disk's."""
    try:
        yield
    except OSError:
        raise
    except Exception as exc:
        if type(exc).__module__.split(".")[0] not in _CLIENT_MODULES:
            raise
        raise OSError(f"{what}: {type(exc).__name__}: {exc}") from exc


def _guarded(method: Any) -> Any:
    """``method`` of :class:`Store` with :func:`client_errors` around it."""

    @functools.wraps(method)
    def call(self: Store, *args: Any, **kwargs: Any) -> Any:
        with client_errors(f"{method.__name__} on {self.url}"):
            return method(self, *args, **kwargs)

    return call


def is_url(path: Any) -> bool:
    """Whether ``path`` names a store by URL (``scheme://…``); a plain path does not."""
    return isinstance(path, str) and _SCHEME.match(path) is not None


def join_url(url: str, *names: str) -> str:
    """``url`` with ``names`` appended, one ``/`` between each."""
    return "/".join([url.rstrip("/"), *names])


def split_url(url: str) -> tuple[str, str]:
    """``(parent URL, last name)`` of ``url``."""
    parent, _, name = url.rstrip("/").rpartition("/")
    return parent, name


def _fsspec() -> Any:
    try:
        return importlib.import_module("fsspec")
    except ModuleNotFoundError as exc:
        if exc.name != "fsspec":
            raise
        raise ModuleNotFoundError(
            "checkpoint sets on object storage need fsspec, which is not installed:"
            " pip install 'tlckpt[remote]'",
            name="fsspec",
        ) from None


def _options(url: str, storage_options: dict[str, Any] | None) -> dict[str, Any]:
    """The options fsspec gets: the caller's, with bounded requests and no stale listings
    for S3 (a listing cached by another save's process would hide or invent sets)."""
    options = dict(storage_options or {})
    if url.startswith(("s3://", "s3a://")):
        config = dict(S3_DEFAULTS)
        config.update(options.get("config_kwargs") or {})
        options["config_kwargs"] = config
        options.setdefault("use_listings_cache", False)
    if url.startswith(("file://", "local://")):
        options.setdefault("auto_mkdir", True)  # a prefix is a folder there
    return options


def _modified(info: dict[str, Any]) -> float | None:
    """When an object was last written, by the store's clock (seconds), where it says."""
    for name in ("LastModified", "mtime", "updated", "created", "last_modified"):
        value = info.get(name)
        if isinstance(value, datetime.datetime):
            if value.tzinfo is None:
                value = value.replace(tzinfo=datetime.timezone.utc)
            return value.timestamp()
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return datetime.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
            except ValueError:
                continue
    return None


class Store:
    """The objects under one root of an fsspec filesystem.

    Keys are relative to the root (``step-…/manifest.json``). Errors of the filesystem are
    ``OSError`` (``FileNotFoundError`` for a missing object, ``FileExistsError`` for a
    conditional create that lost).

    Attributes:
        fs: the fsspec filesystem.
        root: the root's path on it (no scheme).
        url: the root's URL, as given.
    """

    def __init__(self, fs: Any, root: str, url: str):
        self.fs = fs
        self.root = root.rstrip("/")
        self.url = url.rstrip("/")

    @property
    def is_s3(self) -> bool:
        """Whether the store is S3 (multipart uploads and conditional writes of its own)."""
        return hasattr(self.fs, "call_s3")

    def path(self, key: str) -> str:
        """The filesystem path of ``key``."""
        return f"{self.root}/{key}" if key else self.root

    def url_of(self, key: str) -> str:
        """The URL of ``key`` (what messages name)."""
        return join_url(self.url, key) if key else self.url

    def child(self, name: str) -> Store:
        """The store rooted at ``name`` under this root."""
        return Store(self.fs, self.path(name), self.url_of(name))

    @_guarded
    def invalidate(self) -> None:
        """Forget what the filesystem cached of listings (another process writes too)."""
        self.fs.invalidate_cache()

    @_guarded
    def object_keys(self, prefix: str = "") -> list[str]:
        """Every object's key under ``prefix`` (recursive), sorted; none if it is absent."""
        self.invalidate()
        base = self.path(prefix).rstrip("/")
        try:
            found = self.fs.find(base, withdirs=False, detail=False)
        except FileNotFoundError:
            return []
        return sorted(_relative(str(p), self.root) for p in found)

    @_guarded
    def names(self) -> list[str]:
        """The names right under the root (objects and prefixes); none if it is absent."""
        self.invalidate()
        try:
            found = self.fs.ls(self.root, detail=False)
        except FileNotFoundError:
            return []
        return sorted({_relative(str(p), self.root).split("/")[0] for p in found} - {""})

    @_guarded
    def info(self, key: str) -> dict[str, Any]:
        """The object's details (``size`` and, where the store says, when it was written).

        Raises:
            FileNotFoundError: there is no such object.
        """
        info = self.fs.info(self.path(key))
        if info.get("type") == "directory":
            raise FileNotFoundError(self.url_of(key))
        return info

    def size(self, key: str) -> int:
        """The object's size in bytes."""
        return int(self.info(key)["size"])

    def modified(self, key: str) -> float | None:
        """When ``key`` was last written, by the store's clock (seconds), if it says."""
        return _modified(self.info(key))

    @_guarded
    def read(self, key: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of the object (one ranged read)."""
        return bytes(self.fs.cat_file(self.path(key), start=start, end=end))

    def stream(self, key: str, start: int, end: int, chunk: int = 8 << 20) -> Iterator[bytes]:
        """Bytes ``[start, end)`` of the object, in pieces of at most ``chunk`` bytes as they
        arrive: on S3 one ranged ``GET`` read as it streams (each ranged request costs moto a
        copy of the whole object, and S3 a request); elsewhere one ranged read per piece.
        Never more than ``end - start`` bytes, whatever the store sends.

        Raises:
            OSError: from the store, or the transfer broke off (bounded by the read timeout).
        """
        if not self.is_s3:
            for pos in range(start, end, chunk):
                yield self.read(key, pos, min(end, pos + chunk))
            return
        from fsspec.asyn import sync

        bucket, _, name = self.path(key).partition("/")
        fs = self.fs
        if end <= start:
            return
        with client_errors(f"reading {self.url_of(key)}"):
            body = fs.call_s3(
                "get_object", Bucket=bucket, Key=name, Range=f"bytes={start}-{end - 1}"
            )["Body"]

        async def piece(size: int) -> bytes:
            out = bytearray()
            while len(out) < size:
                data = await body.read(size - len(out))
                if not data:
                    break
                out += data
            return bytes(out)

        try:
            left = end - start
            while left > 0:
                with client_errors(f"reading {self.url_of(key)}"):
                    data = sync(fs.loop, piece, min(chunk, left))
                if not data:
                    return
                left -= len(data)
                yield data
        finally:
            body.close()

    @_guarded
    def put(self, key: str, data: bytes) -> None:
        """Write the object ``key`` (replacing it)."""
        self.fs.pipe_file(self.path(key), data)

    @_guarded
    def copy_from(self, source: Store, key: str) -> None:
        """Copy ``source``'s object ``key`` to this store's ``key`` (replacing it), on the
        server where the store can (S3: ``CopyObject``, multipart for large objects);
        ``source`` is on the same filesystem."""
        self.fs.copy(source.path(key), self.path(key))

    @_guarded
    def create(self, key: str, data: bytes) -> None:
        """Write the object ``key`` only if there is none (S3: ``If-None-Match: *``, which
        the store decides atomically; elsewhere as the filesystem offers: see the guide).

        Raises:
            FileExistsError: the object exists.
        """
        if _is_local(self.fs):
            # O_EXCL: decided by the kernel, as S3 decides If-None-Match.
            with self.fs.open(self.path(key), "xb") as f:
                f.write(data)
            return
        self.fs.pipe_file(self.path(key), data, mode="create")

    @_guarded
    def delete(self, keys: Iterable[str]) -> None:
        """Remove the objects ``keys`` (missing ones are no error), in the order given."""
        for key in keys:
            try:
                self.fs.rm_file(self.path(key))
            except FileNotFoundError:
                continue

    @_guarded
    def drop_empty(self, prefix: str) -> None:
        """Remove the folder ``prefix`` if it is empty, where the filesystem has folders
        (``file://``, ``memory://``; object stores have none: a prefix with no object is
        gone)."""
        if self.is_s3 or getattr(self.fs, "async_impl", False):
            return
        self.invalidate()
        try:
            if not self.fs.ls(self.path(prefix), detail=False):
                self.fs.rmdir(self.path(prefix))
        except (FileNotFoundError, OSError):
            return  # not empty (someone wrote meanwhile), or gone: nothing to drop

    @_guarded
    def uploads(self, prefix: str) -> list[tuple[str, str]]:
        """The incomplete multipart uploads under ``prefix``: ``(key, upload id)`` (S3 only;
        other stores have none to abort)."""
        if not self.is_s3:
            return []
        bucket, _, base = self.path(prefix).partition("/")
        found, marker = [], {}
        for _ in range(10_000):  # bounded: 1000 uploads a page
            page = self.fs.call_s3("list_multipart_uploads", Bucket=bucket, Prefix=base, **marker)
            for upload in page.get("Uploads", []):
                key = _relative(f"{bucket}/{upload['Key']}", self.root)
                found.append((key, upload["UploadId"]))
            if not page.get("IsTruncated"):
                break
            marker = {
                "KeyMarker": page.get("NextKeyMarker", ""),
                "UploadIdMarker": page.get("NextUploadIdMarker", ""),
            }
        return found

    @_guarded
    def abort(self, key: str, upload_id: str) -> None:
        """Abort the multipart upload ``upload_id`` of ``key`` (S3)."""
        bucket, _, name = self.path(key).partition("/")
        self.fs.call_s3("abort_multipart_upload", Bucket=bucket, Key=name, UploadId=upload_id)


def _is_local(fs: Any) -> bool:
    protocol = fs.protocol
    return bool({"file", "local"} & set((protocol,) if isinstance(protocol, str) else protocol))


def _relative(path: str, root: str) -> str:
    """``path`` relative to ``root`` (fsspec returns paths with or without a leading ``/``
    depending on the filesystem)."""
    path, root = path.strip("/"), root.strip("/")
    if path == root:
        return ""
    if path.startswith(root + "/"):
        return path[len(root) + 1 :]
    return path


def open_store(url: str, storage_options: dict[str, Any] | None = None) -> Store:
    """The store rooted at ``url``.

    Args:
        url: ``scheme://…`` (see :func:`is_url`).
        storage_options: passed to the fsspec filesystem (s3fs: ``client_kwargs``
            with ``endpoint_url``, ``config_kwargs``, ``key``/``secret``…; credentials
            otherwise come from the standard environment variables).

    Raises:
        ModuleNotFoundError: fsspec (or the scheme's package, as s3fs) is not installed.
        ValueError: the scheme is unknown to fsspec.
    """
    fs, root = _fsspec().core.url_to_fs(url, **_options(url, storage_options))
    return Store(fs, root, url)
