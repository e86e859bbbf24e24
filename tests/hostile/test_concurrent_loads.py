"""A file truncated or rewritten in place by another process during a load: never a silent mix.

Deterministic versions: the change is injected at a chosen moment of the load (after the
checking pass, after the k-th payload of the payload pass, after the last byte), for every
load mode, and the outcome is exactly the one the guide's table states:

* staged (the default) and JSON: a ``CheckpointError`` with the model unchanged, or — when
  the change comes after the last byte was read — a completed load of the version read;
* ``staged=False``: a clean ``FileChangedError`` with the model unchanged if nothing live was
  written yet, else a ``PartialLoadError`` that says how many tensors were overwritten.

Renaming a new file over the path (what tlckpt's writers do) is not a change of the file
being loaded. The short CI run of ``python -m fuzz.load_races`` races real processes.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from hostile_support import campaign_report, fuzz_module

import tlckpt
from tlckpt.codec import FileChangedError, PartialLoadError, TruncatedError
from tlckpt.codec.fileio import leases, transfer
from tlckpt.codec.model_state import state_bits as state_bits_module
from tlckpt.runtime.ops import float32_bulk, float32_files

lm = fuzz_module("live_model")


@pytest.fixture(autouse=True)
def _no_leases(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests change the file from the loading process itself, which a read lease would
    make wait (up to the kernel's lease-break time) until the load ends: they test the
    staged path, taken wherever no lease is granted. Leased loads racing other processes:
    ``test_load_leases.py``."""
    monkeypatch.setattr(leases, "read_lease", lambda f: None)


class _Model(torch.nn.Module):
    """Eight float32 parameters larger than a file object's read buffer (each payload is
    read straight from the file, at the moment the load reaches it), then an int64 buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.weights = torch.nn.ParameterList(torch.zeros(64, 64) for _ in range(8))
        self.register_buffer("count", torch.tensor(0))


_SEEDS = {"old": 1, "A": 2, "B": 3}


class _Setup(lm.LiveModel):
    """A model at OLD values and a file at version A (B: the same size, other values)."""

    def __init__(self, tmp_path: Path, mode: str):
        suffix = "json" if mode == "json" else "tlsf32"
        super().__init__(mode, tmp_path / f"m.{suffix}", _SEEDS, _Model())
        self.images = {name: self.save(name, tmp_path / f"{name}.{suffix}") for name in "AB"}
        assert len(self.images["A"]) == len(self.images["B"])
        self.path.write_bytes(self.images["A"])
        self.set("old")

    def change(self, how: str) -> None:
        """What the other process does to the file, in place."""
        if how == "truncate":
            os.truncate(self.path, len(self.images["A"]) - 4)  # cuts the count's payload
        elif how == "rewrite":
            with open(self.path, "r+b") as f:
                f.write(self.images["B"])
        else:  # "rename": a new complete file replaces the path, as tlckpt writes
            replacement = self.path.with_suffix(".new")
            replacement.write_bytes(self.images["B"])
            os.replace(replacement, self.path)


def _hook_payload_pass(
    monkeypatch: pytest.MonkeyPatch, after: int | None, action: Callable[[], None]
) -> None:
    """Run ``action`` inside the pass that reads payloads into the model or its staging:
    after the payload of record ``after``, or (``None``) once the pass has returned.

    That pass reads in bulk (``float32_bulk.read_float32_extents``); reads of at most two pieces
    each (a payload and the header after it) give it a moment between records.
    """
    real = float32_bulk.read_float32_extents
    monkeypatch.setattr(transfer, "IOV_MAX", 2)

    def hooked(f: Any, layout: Any, records: Any, *args: Any, **kwargs: Any) -> None:
        *rest, progress = args if len(args) == 3 else (*args, None)
        fired = False

        def on_progress(through: int) -> None:
            nonlocal fired
            if progress is not None:
                progress(through)
            # The next read goes beyond the record: the change lands before it.
            if after is not None and not fired and through > list(records).index(after) + 1:
                fired = True
                action()

        real(f, layout, records, *rest, on_progress, **kwargs)
        if after is None:
            action()

    monkeypatch.setattr(float32_bulk, "read_float32_extents", hooked)


# ------------------------------------------------------------------------------ TLSF32B


@pytest.mark.parametrize("how", ["truncate", "rewrite"])
@pytest.mark.parametrize("mode", ["tlsf32-staged", "tlsf32-in-place"])
def test_change_after_the_checking_pass_is_refused_cleanly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str, how: str
) -> None:
    setup = _Setup(tmp_path, mode)
    real = float32_files.validate_float32_state

    def validate_then_change(f: Any, shapes: Any) -> Any:
        layout = real(f, shapes)
        setup.change(how)
        return layout

    monkeypatch.setattr(float32_files, "validate_float32_state", validate_then_change)
    with pytest.raises(FileChangedError, match="changed while it was being read"):
        setup.load()
    assert setup.holds() == "old"


@pytest.mark.parametrize("how", ["truncate", "rewrite"])
def test_change_during_a_staged_load_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    setup = _Setup(tmp_path, "tlsf32-staged")
    _hook_payload_pass(monkeypatch, 3, lambda: setup.change(how))
    expected = TruncatedError if how == "truncate" else FileChangedError
    with pytest.raises(expected):
        setup.load()
    assert setup.holds() == "old"


@pytest.mark.parametrize("how", ["truncate", "rewrite"])
def test_change_during_an_in_place_load_says_the_model_is_partial(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    setup = _Setup(tmp_path, "tlsf32-in-place")
    _hook_payload_pass(monkeypatch, 3, lambda: setup.change(how))
    with pytest.raises(PartialLoadError) as info:
        setup.load()
    error = info.value
    assert setup.holds() == "mix"  # what the error reports: a partial update
    assert 4 <= error.written <= error.total == 9
    assert f"partially updated: {error.written} of 9 tensors" in str(error)
    assert str(setup.path) in str(error)
    cause = TruncatedError if how == "truncate" else FileChangedError
    assert isinstance(error.__cause__, cause)


@pytest.mark.parametrize("how", ["truncate", "rewrite", "rename"])
@pytest.mark.parametrize("mode", ["tlsf32-staged", "tlsf32-in-place"])
def test_change_after_the_last_byte_loads_the_version_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str, how: str
) -> None:
    setup = _Setup(tmp_path, mode)
    _hook_payload_pass(monkeypatch, None, lambda: setup.change(how))
    setup.load()
    assert setup.holds() == "A"


@pytest.mark.parametrize("mode", ["tlsf32-staged", "tlsf32-in-place"])
def test_rename_over_the_path_mid_load_is_not_a_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    setup = _Setup(tmp_path, mode)
    _hook_payload_pass(monkeypatch, 3, lambda: setup.change("rename"))
    setup.load()
    assert setup.holds() == "A"  # the open file's contents, complete


def test_read_errors_during_an_in_place_load_become_partial_load_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    setup = _Setup(tmp_path, "tlsf32-in-place")

    def fail() -> None:
        raise OSError(5, "Input/output error")

    _hook_payload_pass(monkeypatch, 2, fail)
    with pytest.raises(PartialLoadError, match="partially updated") as info:
        setup.load()
    assert isinstance(info.value.__cause__, OSError)
    monkeypatch.undo()
    monkeypatch.setattr(leases, "read_lease", lambda f: None)  # undone with the hook
    setup.set("old")
    _hook_payload_pass(monkeypatch, 2, fail)
    with pytest.raises(OSError):  # staged: the OSError itself, nothing live touched
        tlckpt.load_module_state(setup.model, setup.path)
    assert setup.holds() == "old"


# ------------------------------------------------------------------------------ JSON


@pytest.mark.parametrize("how", ["truncate", "rewrite"])
def test_change_while_json_is_read_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """The document is read in one call, then parsed: the change lands in between."""
    setup = _Setup(tmp_path, "json")
    real = state_bits_module.read_document

    def change_then_parse(*args: Any, **kwargs: Any) -> Any:
        document = real(*args, **kwargs)
        setup.change(how)
        return document

    monkeypatch.setattr(state_bits_module, "read_document", change_then_parse)
    with pytest.raises(FileChangedError):
        setup.load()
    assert setup.holds() == "old"


def test_json_rename_over_the_path_mid_load_is_not_a_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    setup = _Setup(tmp_path, "json")
    real = state_bits_module.read_document

    def rename_then_parse(*args: Any, **kwargs: Any) -> Any:
        document = real(*args, **kwargs)
        setup.change("rename")
        return document

    monkeypatch.setattr(state_bits_module, "read_document", rename_then_parse)
    setup.load()
    assert setup.holds() == "A"


def test_json_staged_false_is_the_same_staged_load(tmp_path: Path) -> None:
    setup = _Setup(tmp_path, "json")
    tlckpt.load_state_bits(setup.model, setup.path, staged=False)
    assert setup.holds() == "A"


# ------------------------------------------------------------------------------ real races


def test_loads_racing_a_second_process_never_mix(tmp_path: Path) -> None:
    report, proc = campaign_report(
        ["fuzz.load_races", "--loads", "240", "--quiet", "--dir", str(tmp_path)], timeout=240
    )
    assert report["failures"] == [], report
    assert report["silent_mixes"] == 0
    assert report["loads"] == 240
    inside = sum(c["writes_inside_a_load"] for c in report["configs"].values())
    # The stamps catch the changes: a rare one they miss (about 1 in 1,000 loads here) must
    # still leave a whole version, never a mix.
    assert report["undetected_changes"] <= 0.05 * inside, report
    for name, config in report["configs"].items():
        outcomes = config["outcomes"]
        assert not any("torn" in k for k in outcomes), (name, outcomes)
        despite = [k for k in outcomes if "despite" in k]
        assert all(k.startswith(("completed A,", "completed B,")) for k in despite), outcomes
        raised = sum(v for k, v in outcomes.items() if not k.startswith("completed"))
        if name == "tlsf32-staged reopen":  # the default load between bursts: leased
            assert config["leased"] > 0, (name, outcomes)
            leased = [k for k in outcomes if k.endswith("(leased)")]
            assert all(k.startswith(("completed A", "completed B")) for k in leased), outcomes
        else:
            assert raised > 0, (name, outcomes)  # some loads really overlapped a change
        if not name.startswith("tlsf32-in-place"):
            assert "PartialLoadError" not in outcomes, name
    # Writes wholly inside a load's window happened.
    assert inside > 0
    assert proc.returncode == 0
