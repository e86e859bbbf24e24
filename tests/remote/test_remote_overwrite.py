"""Overwriting a remote set, killed at every step: the new set is uploaded beside the old
one and rolled forward from a durable intent, so the step always holds the old set or the
new one bit for bit (after the roll-forward that the next manager does), never neither.

A kill is simulated by a :class:`Killed` raised from the store operation of that step, with
the writer's clean-up skipped (a killed process cleans nothing; its lease stops being
renewed and dies after ``LEASE`` seconds).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from remote_support import fresh, objects, outlive_lease, trained

from tlckpt import CheckpointError, CheckpointManager, load_checkpoint
from tlckpt.codec.sets.remote_overwrite import roll_forward
from tlckpt.codec.sets.remote_set_writer import RemoteSetWriter
from tlckpt.codec.sets.remote_store import Store, open_store
from tlckpt.testing.bitwise import modules_equal, optimizer_states_equal

LEASE = 2.0
STEP_1 = "step-00000000000000000001"


class Killed(BaseException):
    """The process died here."""


def _keys(args: tuple[Any, ...]) -> list[str]:
    return list(args[0]) if args else []


# Each step of an overwrite: (the store method, which call of it, the nth such call).
POINTS: dict[str, tuple[str, Callable[[Store, tuple[Any, ...]], bool], int]] = {
    "before_intent": ("put", lambda s, a: a[0].endswith(".overwrite"), 1),
    "after_intent": ("delete", lambda s, a: _keys(a) == ["manifest.json"], 1),
    "mid_copy": ("copy_from", lambda s, a: True, 2),
    "before_manifest": ("put", lambda s, a: a[0] == "manifest.json", 1),
    "before_cleanup": ("delete", lambda s, a: any(k.endswith(".overwrite") for k in _keys(a)), 1),
    "mid_cleanup": ("delete", lambda s, a: ".overwrite-" in s.url and bool(_keys(a)), 1),
}


def _arm(monkeypatch: pytest.MonkeyPatch, point: str) -> None:
    method, hit, nth = POINTS[point]
    real = getattr(Store, method)
    calls = [0]

    def wrapped(self: Store, *args: Any, **kwargs: Any) -> Any:
        if hit(self, args):
            calls[0] += 1
            if calls[0] == nth:
                raise Killed(point)
        return real(self, *args, **kwargs)

    def dead_exit(self: RemoteSetWriter, *exc_info: object) -> None:
        self.lease._stop.set()  # the process is gone: nothing cleaned, lease not renewed

    monkeypatch.setattr(Store, method, wrapped)
    monkeypatch.setattr(RemoteSetWriter, "__exit__", dead_exit)


def _same(pair: tuple[Any, Any], restored: tuple[Any, Any]) -> bool:
    return (
        modules_equal(pair[0], restored[0]) == []
        and optimizer_states_equal(pair[1], restored[1]) == []
    )


def _restore(manager: CheckpointManager) -> tuple[Any, Any]:
    restored = fresh()
    manager.restore(model=restored[0], optimizer=restored[1])
    return restored


def _overwrite_killed(url: str, point: str, options: dict | None = None) -> tuple[Any, Any]:
    """Save step 1, kill an overwrite of it at ``point``; the old and new pairs."""
    old, new = trained(3)[:2], trained(6)[:2]
    manager = CheckpointManager(url, lease_seconds=LEASE, storage_options=options)
    manager.save(1, model=old[0], optimizer=old[1])
    with pytest.MonkeyPatch.context() as patch:
        _arm(patch, point)
        with pytest.raises(Killed):
            manager.save(1, model=new[0], optimizer=new[1], overwrite=True)
    return old, new


@pytest.mark.parametrize("point", list(POINTS))
def test_a_killed_overwrite_keeps_the_old_set_or_the_new(point: str) -> None:
    url = f"memory://overwrite-{uuid.uuid4().hex[:8]}"
    old, new = _overwrite_killed(url, point)
    started = time.monotonic()
    # At once (the dead save's lease still alive): step 1 is the old set or the new one
    # whole, or it is passed over; never a manifest naming other bytes.
    now = CheckpointManager(url, lease_seconds=LEASE)
    if now.latest() == 1:
        restored = _restore(now)
        assert _same(old, restored) or _same(new, restored)
    outlive_lease(f"{url}/{STEP_1}", LEASE - (time.monotonic() - started))
    later = CheckpointManager(url, lease_seconds=LEASE)  # rolls forward
    assert later.steps() == [1]
    assert later.latest() == 1
    expected = old if point == "before_intent" else new
    assert _same(expected, _restore(later))
    # The next save removes what the killed one left: two sets' objects, nothing else.
    later.save(2, model=new[0], optimizer=new[1])
    keys = objects(url)
    assert sorted({k.split("/")[0] for k in keys}) == [STEP_1, "step-00000000000000000002"]
    assert len(keys) == 8


def test_a_killed_roll_forward_is_finished_by_the_next(monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"memory://overwrite-{uuid.uuid4().hex[:8]}"
    _, new = _overwrite_killed(url, "after_intent")
    outlive_lease(f"{url}/{STEP_1}", LEASE)
    with pytest.MonkeyPatch.context() as patch:
        _arm(patch, "mid_copy")
        with pytest.raises(Killed):
            CheckpointManager(url, lease_seconds=LEASE)
    manager = CheckpointManager(url, lease_seconds=LEASE)
    assert manager.latest() == 1
    assert _same(new, _restore(manager))


def test_a_plain_save_of_a_step_being_overwritten_is_refused_after_rolling_forward() -> None:
    url = f"memory://overwrite-{uuid.uuid4().hex[:8]}"
    _, new = _overwrite_killed(url, "mid_copy")
    outlive_lease(f"{url}/{STEP_1}", LEASE)
    writer = RemoteSetWriter(f"{url}/{STEP_1}", 1, lease_seconds=LEASE)
    with pytest.raises(FileExistsError):
        writer.__enter__()
    manager = CheckpointManager(url, lease_seconds=LEASE)
    assert _same(new, _restore(manager))


def test_overwrite_on_s3(s3) -> None:
    url = s3.root(f"overwrite-{uuid.uuid4().hex[:8]}")
    options = s3.storage_options
    old, new = trained(3)[:2], trained(6)[:2]
    manager = CheckpointManager(url, storage_options=options)
    manager.save(1, model=old[0], optimizer=old[1])
    manager.save(1, model=new[0], optimizer=new[1], overwrite=True)
    assert manager.steps() == [1]
    assert _same(new, _restore(manager))
    keys = objects(url, options)
    assert len(keys) == 4 and all(k.startswith(STEP_1 + "/") for k in keys)


def test_a_killed_overwrite_on_s3_rolls_forward(s3) -> None:
    url = s3.root(f"overwrite-{uuid.uuid4().hex[:8]}")
    options = s3.storage_options
    _, new = _overwrite_killed(url, "mid_copy", options)
    outlive_lease(f"{url}/{STEP_1}", LEASE, options)
    manager = CheckpointManager(url, lease_seconds=LEASE, storage_options=options)
    assert manager.latest() == 1
    assert _same(new, _restore(manager))


def test_load_checkpoint_of_the_set_url_rolls_forward() -> None:
    url = f"memory://overwrite-{uuid.uuid4().hex[:8]}"
    _, new = _overwrite_killed(url, "before_manifest")
    outlive_lease(f"{url}/{STEP_1}", LEASE)
    restored = fresh()
    load_checkpoint(f"{url}/{STEP_1}", model=restored[0], optimizer=restored[1])
    assert _same(new, restored)


def test_an_intent_naming_another_prefix_is_never_rolled_forward() -> None:
    url = f"memory://overwrite-{uuid.uuid4().hex[:8]}"
    one, two = trained(3)[:2], trained(6)[:2]
    manager = CheckpointManager(url, lease_seconds=LEASE)
    manager.save(1, model=one[0], optimizer=one[1])
    manager.save(2, model=two[0], optimizer=two[1])
    root = open_store(url)
    root.put(STEP_1 + ".overwrite", b'{"pending": "step-00000000000000000002"}')
    with pytest.raises(CheckpointError, match="not a pending set of it"):
        roll_forward(root, STEP_1)
    again = CheckpointManager(url, lease_seconds=LEASE)  # passes it over
    assert again.steps() == [1, 2]
    restored = fresh()
    again.restore(model=restored[0], optimizer=restored[1], step=1)
    assert _same(one, restored)
