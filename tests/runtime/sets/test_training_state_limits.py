"""What a save accepts, a restore reads back; what a restore would refuse, a save refuses
before any file is written (issue #20, items 3 and 11), end to end through
:class:`~tlckpt.CheckpointManager`.

A refused save leaves the directory as it was: with ``keep_last=1`` the previous set is
still there and restores.
"""

from __future__ import annotations

import collections
import dataclasses
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tlckpt import CheckpointError, CheckpointManager
from tlckpt.codec.sets.set_documents import parse_training_state
from tlckpt.formats import checkpoint_set as layout
from tlckpt.formats.checkpoint_set import LIMITS, MAX_TRAINING_STATE_BYTES
from tlckpt.runtime.sets.training_state import capture
from tlckpt.testing.value_strategies import nested_values, same_value, training_values, value_fits


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(3, 2)


def _int_keyed(depth: int) -> Any:
    value: Any = 0.5
    for i in range(depth):
        value = {i: value}
    return value


def _listing(directory: Path) -> list[tuple[str, list[str]]]:
    return sorted((root, sorted(files)) for root, _, files in os.walk(directory))


def _refused_leaves_everything(
    manager: CheckpointManager, model: torch.nn.Module, extra: Any, field: str
) -> None:
    before = _listing(manager.directory)
    with pytest.raises(CheckpointError) as caught:
        manager.save(99, model=model, extra=extra)
    assert caught.value.field == field and field in str(caught.value)
    assert _listing(manager.directory) == before


def test_a_deep_int_keyed_extra_is_restored(tmp_path: Path) -> None:
    """The issue's case: 32 nested int-keyed dicts were committed, and never restored."""
    model = _model()
    manager = CheckpointManager(tmp_path, keep_last=1)
    extra = _int_keyed(32)
    manager.save(1, model=model, extra=extra)
    assert same_value(manager.restore(model=model).extra, extra)


def test_past_the_depth_bound_the_save_is_refused_and_the_last_set_kept(tmp_path: Path) -> None:
    model = _model()
    manager = CheckpointManager(tmp_path, keep_last=1)
    at_bound = _int_keyed(LIMITS.value_depth)
    manager.save(1, model=model, extra=at_bound)
    # The container past the bound is named: the innermost dict, {0: 0.5}.
    field = "extra" + "".join(f"[{i}]" for i in range(LIMITS.value_depth, 0, -1))
    _refused_leaves_everything(manager, model, {LIMITS.value_depth: at_bound}, field)
    assert manager.steps() == [1]
    assert same_value(manager.restore(model=model).extra, at_bound)


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"note": "\ud800"}, "extra.note"),
        ({"w": torch.zeros(())}, "extra.w"),
        ({"s": {1, 2}, "b": b"x"}, "extra.b"),
        ({"d": collections.defaultdict(lambda: 1)}, "extra.d"),
        ({"n": 10**LIMITS.int_digits}, "extra.n"),
    ],
)
def test_values_a_reader_refuses_are_refused_at_the_call(tmp_path: Path, extra, field) -> None:
    model = _model()
    manager = CheckpointManager(tmp_path, keep_last=1)
    manager.save(1, model=model, extra={"ok": True})
    _refused_leaves_everything(manager, model, extra, field)
    with pytest.raises(CheckpointError) as caught:  # a background save: refused at the call
        manager.save(2, model=model, extra=extra, blocking=False)
    assert caught.value.field == field
    manager.wait()
    assert manager.steps() == [1] and manager.restore(model=model).extra == {"ok": True}


def test_the_document_size_bound_holds_at_the_save(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer checks the table's training-state bound (made small here to test it)."""
    model = _model()
    manager = CheckpointManager(tmp_path, keep_last=1)
    manager.save(1, model=model, extra="")
    size = (tmp_path / "step-00000000000000000001" / "training_state.json").stat().st_size
    limit = size + 100
    monkeypatch.setattr(layout, "LIMITS", dataclasses.replace(LIMITS, training_state_bytes=limit))
    manager.save(2, model=model, extra="x" * 100)  # exactly the bound
    assert manager.restore(model=model).extra == "x" * 100
    _refused_leaves_everything(manager, model, "x" * 101, "training state")
    assert manager.steps() == [2]


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    st.one_of(
        training_values(max_leaves=12, beyond=True),
        st.integers(LIMITS.value_depth - 1, LIMITS.value_depth + 1).flatmap(nested_values),
    )
)
def test_save_accepts_exactly_what_restore_reads(tmp_path_factory, value: Any) -> None:
    directory = tmp_path_factory.mktemp("sets")
    model = _model()
    manager = CheckpointManager(directory, keep_last=1)
    manager.save(1, model=model, extra="previous")
    if value_fits(value):
        manager.save(2, model=model, extra=value)
        assert manager.steps() == [2]
        assert same_value(manager.restore(model=model).extra, value)
    else:
        before = _listing(directory)
        with pytest.raises(CheckpointError) as caught:
            manager.save(2, model=model, extra=value)
        assert caught.value.field.startswith("extra")
        assert _listing(directory) == before
        assert manager.restore(model=model).extra == "previous"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(training_values(beyond=True))
def test_captured_documents_parse_back_exactly(value: Any) -> None:
    """At the document level, from the live objects: ``capture`` → ``parse_training_state``."""
    model = _model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, [3, 3, 5])
    if not value_fits(value):
        with pytest.raises(CheckpointError) as caught:
            capture(4, optimizer, scheduler, 7, value)
        assert caught.value.field.startswith("extra")
        return
    state = parse_training_state(
        capture(4, optimizer, scheduler, 7, value), MAX_TRAINING_STATE_BYTES
    )
    assert same_value(state.extra, value)
    assert same_value(state.scheduler, scheduler.state_dict())
    assert type(state.scheduler["milestones"]) is collections.Counter
