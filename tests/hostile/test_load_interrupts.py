"""Ctrl-C during a load: the model holds all of its old values or all of the file's, never a mix.

Deterministic versions: SIGINT is raised from inside a load at a chosen moment — before the
commit (the model is unchanged) or while the commit writes live tensors (the commit finishes,
then ``KeyboardInterrupt`` is raised, the model holding all of the file's values) — for every
load mode, the optimizer's state swap and the sharded commit. The short CI run of
``python -m fuzz.load_interrupts`` sends real SIGINTs from another process at random moments.
"""

from __future__ import annotations

import _thread
import signal
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from hostile_support import campaign_report, fuzz_module

import tlckpt
from tlckpt.codec.fileio import leases, transfer
from tlckpt.runtime.commit import plans
from tlckpt.runtime.ops import bits_files, float32_bulk

lm = fuzz_module("live_model")
rh = fuzz_module("runtime_hostile")

TRIGGERS: dict[str, Callable[[], None]] = {
    "raise_signal": lambda: signal.raise_signal(signal.SIGINT),
    "interrupt_main": _thread.interrupt_main,
}


@pytest.fixture(autouse=True)
def _python_sigint_handler() -> Iterator[None]:
    before = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


#: The modes: ``tlsf32-leased`` is the default load where a read lease is granted (then it
#: copies in place, under the lease), ``tlsf32-staged`` the same call where none is.
MODES = ["tlsf32-staged", "tlsf32-leased", "tlsf32-in-place", "json"]
_IN_PLACE = ("tlsf32-in-place", "tlsf32-leased")


def _setup(tmp_path: Path, mode: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A 48-tensor model (Linear, BatchNorm, an int64 buffer) at OLD values; its file holds
    NEW ones (2,000 small tensors for JSON)."""
    if mode == "tlsf32-staged":
        monkeypatch.setattr(leases, "read_lease", lambda f: None)
    live_mode = "tlsf32-staged" if mode == "tlsf32-leased" else mode
    setup = lm.LiveModel(live_mode, tmp_path / "m", {"old": 1, "new": 2})
    setup.save("new")
    setup.set("old")
    if mode == "tlsf32-leased":
        assert leases.lease_possible(setup.path), "this file system grants no read lease"
    return setup


def _signalling(pairs: Any, trigger: Callable[[], None]) -> Iterator[Any]:
    """The commit's pairs, raising SIGINT when the commit asks for the third one."""
    for k, pair in enumerate(pairs):
        if k == 2:
            trigger()
        yield pair


def _signal_inside_the_commit(
    monkeypatch: pytest.MonkeyPatch, mode: str, trigger: Callable[[], None]
) -> None:
    if mode in _IN_PLACE:  # the commit is the copying pass: signal after its third tensor
        real = float32_bulk.read_float32_extents
        monkeypatch.setattr(transfer, "IOV_MAX", 2)  # a read per payload (and header)

        def hooked(*args: Any, **kwargs: Any) -> None:
            *rest, progress = args

            def on_progress(through: int) -> None:
                progress(through)
                if through == 4:  # three payloads read, the fourth about to be
                    trigger()

            real(*rest, on_progress, **kwargs)

        monkeypatch.setattr(float32_bulk, "read_float32_extents", hooked)
        return
    if mode == "tlsf32-staged":  # the commit copies the staged bytes over the live tensors'
        real_copy = float32_bulk.copy_extents

        def signal_then_copy(*args: Any) -> None:
            trigger()
            real_copy(*args)

        monkeypatch.setattr(float32_bulk, "copy_extents", signal_then_copy)
        return
    real_commit = plans.commit
    monkeypatch.setattr(plans, "commit", lambda pairs: real_commit(_signalling(pairs, trigger)))


@pytest.mark.parametrize("trigger", sorted(TRIGGERS))
@pytest.mark.parametrize("mode", MODES)
def test_interrupt_inside_the_commit_is_raised_after_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str, trigger: str
) -> None:
    setup = _setup(tmp_path, mode, monkeypatch)
    _signal_inside_the_commit(monkeypatch, mode, TRIGGERS[trigger])
    with pytest.raises(KeyboardInterrupt):
        setup.load()
    assert setup.holds() == "new"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


@pytest.mark.parametrize("mode", MODES)
def test_interrupt_before_the_commit_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    setup = _setup(tmp_path, mode, monkeypatch)
    if mode == "json":
        real_read = bits_files.read_state_bits

        def read_then_signal(*args: Any) -> Any:
            arrays = real_read(*args)
            signal.raise_signal(signal.SIGINT)
            return arrays

        monkeypatch.setattr(bits_files, "read_state_bits", read_then_signal)
    elif mode == "tlsf32-staged":  # in the payload pass, after its third payload
        real_read = float32_bulk.read_float32_extents
        monkeypatch.setattr(transfer, "IOV_MAX", 2)

        def read_then_signal(*args: Any, **kwargs: Any) -> None:
            def on_progress(through: int) -> None:
                if through == 4:
                    signal.raise_signal(signal.SIGINT)

            real_read(*args[:5], on_progress, **kwargs)

        monkeypatch.setattr(float32_bulk, "read_float32_extents", read_then_signal)
    else:  # in the checking pass (in place), at its 3rd payload
        sink = float32_bulk.Precheck
        real_done = sink.done
        calls = []

        def done(self: Any, *args: Any) -> None:
            real_done(self, *args)
            calls.append(1)
            if len(calls) == 3:
                signal.raise_signal(signal.SIGINT)

        monkeypatch.setattr(sink, "done", done)
    with pytest.raises(KeyboardInterrupt):
        setup.load()
    assert setup.holds() == "old"


# ------------------------------------------------------------------------------ optimizer


class _SignalAfterClear(defaultdict):
    """An optimizer state that receives SIGINT right after it is cleared."""

    def clear(self) -> None:
        super().clear()
        signal.raise_signal(signal.SIGINT)


def test_interrupt_between_clearing_and_filling_the_optimizer_state(tmp_path: Path) -> None:
    model, opt = rh.build(rh.variants("cpu")[0])
    path = tmp_path / "o.tladam"
    tlckpt.save_optimizer(opt, model, path)
    saved = {id(p): {k: v.clone() for k, v in s.items()} for p, s in opt.state.items()}
    with torch.no_grad():
        for s in opt.state.values():
            s["exp_avg"].add_(1.0)
    opt.state = _SignalAfterClear(dict, opt.state)
    with pytest.raises(KeyboardInterrupt):
        tlckpt.load_optimizer(opt, model, path)
    assert len(opt.state) == len(saved)  # never the empty state between the two steps
    for p, s in opt.state.items():
        for key, value in s.items():
            assert torch.equal(value, saved[id(p)][key]), key


# ------------------------------------------------------------------------------ sharded


def test_sharded_commit_holds_interrupts_back() -> None:
    live = [torch.zeros(3) for _ in range(4)]

    def stream() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for k, t in enumerate(live):
            if k == 2:
                signal.raise_signal(signal.SIGINT)
            yield t, torch.full((3,), float(k + 1))

    with pytest.raises(KeyboardInterrupt):
        plans.commit(stream())  # the one commit, for sharded state too
    assert [t[0].item() for t in live] == [1.0, 2.0, 3.0, 4.0]


# ------------------------------------------------------------------------------ real SIGINTs


def test_sigint_at_random_moments_never_leaves_a_mix(tmp_path: Path) -> None:
    report, proc = campaign_report(
        ["fuzz.load_interrupts", "--trials", "240", "--quiet", "--dir", str(tmp_path)],
        timeout=240,
    )
    assert report["failures"] == [], report
    assert report["mixes"] == 0
    assert report["trials"] == 240
    for name, config in report["configs"].items():
        assert config["during"] > 0, (name, config)  # interrupts landed inside the commit
        assert config.get("before", 0) + config["during"] + config.get("after", 0) == 80
    assert proc.returncode == 0
