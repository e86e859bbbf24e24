"""``run_parallel``: results in order, the first error raised after every started item ended,
no thread left behind."""

from __future__ import annotations

import threading
import time

import pytest

from tlckpt.codec.fileio.threads import THREADS, run_parallel


def test_results_come_back_in_the_items_order() -> None:
    items = list(range(50))
    assert run_parallel(lambda k: k * k, items) == [k * k for k in items]
    assert run_parallel(lambda k: k, []) == []


def test_an_error_is_raised_once_every_started_item_has_ended() -> None:
    ended: list[int] = []

    def work(k: int) -> None:
        if k == 1:
            raise ValueError("item 1")
        time.sleep(0.05)
        ended.append(k)

    before = threading.active_count()
    with pytest.raises(ValueError, match="item 1"):
        run_parallel(work, list(range(20)))
    assert threading.active_count() == before  # every thread joined
    # The other threads finish what they started and take nothing after the error.
    assert len(ended) <= THREADS
