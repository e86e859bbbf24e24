"""Helpers of the object-storage tests: a trained model, bit-exact resume checks, every
object and incomplete upload under a root, and a memory filesystem that fails on purpose."""

from __future__ import annotations

import errno
import time
from typing import Any, ClassVar

import fsspec
import torch
from fsspec.implementations.memory import MemoryFileSystem

from tlckpt.codec.sets.remote_leases import lease_alive
from tlckpt.codec.sets.remote_store import open_store
from tlckpt.testing.bitwise import modules_equal, optimizer_states_equal
from tlckpt.testing.models import TiedNet, make_adam, train


def trained(steps: int = 3, dropout: bool = False) -> tuple[TiedNet, torch.optim.Optimizer, int]:
    """A seeded TiedNet and AdamW after ``steps`` training steps, and the counter."""
    torch.manual_seed(0)
    model = TiedNet(dropout=dropout)
    opt = make_adam("adamw", model.parameters())
    return model, opt, train(model, opt, 0, steps)


def fresh() -> tuple[TiedNet, torch.optim.Optimizer]:
    """Another TiedNet and AdamW (other values), to restore into."""
    torch.manual_seed(123)
    model = TiedNet()
    return model, make_adam("adamw", model.parameters())


def resumes_exactly(saved: tuple[Any, Any], restored: tuple[Any, Any], counter: int) -> None:
    """The restored pair equals the saved one bit for bit, and both train on identically."""
    assert modules_equal(saved[0], restored[0]) == []
    assert optimizer_states_equal(saved[1], restored[1]) == []
    train(saved[0], saved[1], counter, 2)
    train(restored[0], restored[1], counter, 2)
    assert modules_equal(saved[0], restored[0]) == []


def outlive_lease(
    url: str, seconds: float, storage_options: dict[str, Any] | None = None, limit: float = 60.0
) -> None:
    """Wait until the lease on the set prefix ``url`` (a killed save's) is dead by the
    store's own clock, as the next manager judges it: its duration has passed since its
    last write (S3 dates objects to the second, and a renewal in flight when the save was
    killed may still land), so a fixed sleep would race it."""
    store = open_store(url, storage_options)
    time.sleep(max(0.0, seconds))
    deadline = time.monotonic() + limit
    while lease_alive(store, None):
        assert time.monotonic() < deadline, f"the lease on {url} outlived {limit} s"
        time.sleep(0.2)


def objects(url: str, storage_options: dict[str, Any] | None = None) -> list[str]:
    """Every object's key under ``url``, sorted."""
    return open_store(url, storage_options).object_keys()


def uploads(url: str, storage_options: dict[str, Any] | None = None) -> list[tuple[str, str]]:
    """The incomplete multipart uploads under ``url`` (S3)."""
    return open_store(url, storage_options).uploads("")


class FaultyMemory(MemoryFileSystem):
    """``faultmem://``: a memory filesystem of its own that raises ``OSError(EIO)`` on the
    ``fail_write_at``-th ``write`` to any file opened for writing (counted from
    :meth:`arm`), or on writing a manifest (``fail_manifest``)."""

    protocol = ("faultmem",)
    store: ClassVar[dict[str, Any]] = {}
    pseudo_dirs: ClassVar[list[str]] = [""]
    writes = 0
    fail_write_at: int | None = None
    fail_manifest = False

    @classmethod
    def arm(cls, write_at: int | None = None, manifest: bool = False) -> None:
        cls.writes, cls.fail_write_at, cls.fail_manifest = 0, write_at, manifest

    def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        f = super()._open(path, mode, **kwargs)
        if "w" in mode or "x" in mode:
            cls = type(self)
            if cls.fail_manifest and path.endswith("manifest.json"):
                raise OSError(errno.EIO, "injected failure writing the manifest", path)
            original = f.write

            def write(data: Any) -> int:
                cls.writes += 1
                if cls.fail_write_at is not None and cls.writes == cls.fail_write_at:
                    raise OSError(errno.EIO, f"injected failure at write {cls.writes}", path)
                return original(data)

            f.write = write
        return f


fsspec.register_implementation("faultmem", FaultyMemory, clobber=True)
