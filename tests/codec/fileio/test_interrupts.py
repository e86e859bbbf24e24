"""``deferred_interrupts``: signals during the block are recorded, then delivered after it."""

from __future__ import annotations

import _thread
import signal
import threading
from collections.abc import Iterator

import pytest

from tlckpt.codec.fileio.interrupts import deferred_interrupts


@pytest.fixture(autouse=True)
def _default_handlers() -> Iterator[None]:
    """Python's own SIGINT handler during each test; whatever was there is put back."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)


def test_sigint_in_the_block_is_raised_after_it() -> None:
    done = []
    with pytest.raises(KeyboardInterrupt), deferred_interrupts():
        signal.raise_signal(signal.SIGINT)
        done.append("after the signal")  # still runs: the signal was only recorded
        _thread.interrupt_main()  # a second one is delivered once, with the first
        done.append("end of block")
    assert done == ["after the signal", "end of block"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_no_signal_no_exception_and_handler_restored() -> None:
    with deferred_interrupts():
        assert signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_custom_handlers_are_called_after_the_block() -> None:
    seen: list[tuple[str, int]] = []
    signal.signal(signal.SIGINT, lambda s, f: seen.append(("int", s)))
    signal.signal(signal.SIGTERM, lambda s, f: seen.append(("term", s)))
    with deferred_interrupts():
        signal.raise_signal(signal.SIGTERM)
        signal.raise_signal(signal.SIGINT)
        assert seen == []
    assert seen == [("term", signal.SIGTERM), ("int", signal.SIGINT)]


def test_ignored_sigint_stays_ignored() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with deferred_interrupts():
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
        signal.raise_signal(signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN


def test_default_sigterm_is_left_alone() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    with deferred_interrupts():
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_an_exception_in_the_block_is_chained_to_the_interrupt() -> None:
    with pytest.raises(KeyboardInterrupt) as info, deferred_interrupts():
        signal.raise_signal(signal.SIGINT)
        raise OSError("disk gone")
    assert isinstance(info.value.__context__, OSError)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_nested_blocks_deliver_once_at_the_outer_end() -> None:
    order = []
    with pytest.raises(KeyboardInterrupt), deferred_interrupts():
        with deferred_interrupts():
            signal.raise_signal(signal.SIGINT)
        order.append("between inner and outer end")
    assert order == ["between inner and outer end"]


def test_outside_the_main_thread_the_block_runs_unguarded() -> None:
    result: dict[str, object] = {}

    def worker() -> None:
        with deferred_interrupts():
            result["handler"] = signal.getsignal(signal.SIGINT)

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert result["handler"] is signal.default_int_handler
