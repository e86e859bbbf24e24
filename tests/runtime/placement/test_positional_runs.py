"""The element runs of a shard (``runtime.placement.positional``): exactly the shard's
elements of the full tensor, in the shard's own row-major order, whatever box it is."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tlckpt.runtime.placement.positional import _runs


@st.composite
def boxes(draw: st.DrawFn) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    shape = tuple(draw(st.lists(st.integers(0, 5), max_size=4)))
    local, offset = [], []
    for side in shape:
        start = draw(st.integers(0, side))
        offset.append(start)
        local.append(draw(st.integers(0, side - start)))
    return shape, tuple(local), tuple(offset)


@settings(max_examples=300, deadline=None)
@given(boxes())
def test_runs_cover_exactly_the_box_in_its_own_order(box):
    shape, local, offset = box
    full = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
    want = full[tuple(slice(o, o + n) for o, n in zip(offset, local))].reshape(-1)
    starts, run = _runs(shape, local, offset)
    got = (starts[:, None] + np.arange(run, dtype=np.int64)[None, :]).reshape(-1)
    assert np.array_equal(got, want)


def test_rows_are_one_run_and_columns_one_run_per_row():
    starts, run = _runs((6, 4), (2, 4), (3, 0))  # Shard(0): rows 3-4
    assert starts.tolist() == [12] and run == 8
    starts, run = _runs((3, 8), (3, 4), (0, 4))  # Shard(1): the right half
    assert starts.tolist() == [4, 12, 20] and run == 4
