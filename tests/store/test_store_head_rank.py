"""Head.rank (a binary search of every row's ring at once) against searchsorted on each row alone:
rings of any fill, wrapped at any slot, empty rows, bases far apart, and times before, inside and
after each row's samples."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from metricsd.store.head import Head

CAPACITY = 19  # not a power of two: the search's first step overshoots the row

rows_st = st.lists(st.lists(st.integers(0, 50), max_size=CAPACITY), min_size=1, max_size=12)


def _head(gaps_per_row: list[list[int]], bases: list[int], turn: int = 0) -> tuple[Head, list[np.ndarray]]:
    """Each row's samples written after ``turn`` older ones (pushed out again), so rings wrap."""
    head = Head(CAPACITY, rows=len(gaps_per_row))
    absolute = []
    for row, (gaps, base) in enumerate(zip(gaps_per_row, bases, strict=True)):
        ts = base + np.cumsum(np.array(gaps, dtype=np.int64) + 1)  # strictly increasing
        older = base - 1 - np.arange(turn, dtype=np.int64)[::-1]
        rows = np.array([row])
        for part in (older, ts):
            if len(part):
                seg = (rows, np.array([len(part)]), np.zeros(1, np.int64), part)
                assert head.fit(*seg).all()  # write's contract: fit first (a row off its step turns wide)
                head.write(*seg, np.zeros(len(part)))
        if len(ts) < CAPACITY:  # keep only ts in the ring: the older ones were a way to turn it
            head.replace_row(row, ts, np.zeros(len(ts)), 0) if turn == 0 else _keep_last(head, row, len(ts))
        absolute.append(ts)
    return head, absolute


def _keep_last(head: Head, row: int, n: int) -> None:
    head.filled[row] = n


@settings(max_examples=300, deadline=None)  # a loaded machine stretches an example past 200 ms
@given(rows_st, st.data())
def test_rank_counts_the_samples_at_or_before_t_in_every_row(gaps_per_row: list[list[int]],
                                                             data: st.DataObject) -> None:
    bases = data.draw(st.lists(st.integers(100, 10**12), min_size=len(gaps_per_row), max_size=len(gaps_per_row)))
    head, absolute = _head(gaps_per_row, bases, data.draw(st.integers(0, 2 * CAPACITY)))
    head._check(len(gaps_per_row))
    picked = data.draw(st.lists(st.integers(0, len(gaps_per_row) - 1), max_size=20))
    rows = np.array(picked, dtype=np.int64)
    anchor = absolute[picked[0]] if picked else np.zeros(0, np.int64)
    t = data.draw(st.one_of(st.integers(-1, 10**12 + 2000),
                            st.sampled_from([int(x) + d for x in anchor for d in (-1, 0, 1)] or [0])))
    want = [int(np.searchsorted(absolute[r], t, side="right")) for r in picked]
    assert head.rank(rows, t).tolist() == want


def test_rank_of_no_rows_is_empty() -> None:
    head, _ = _head([[1, 2, 3]], [0])
    assert head.rank(np.zeros(0, np.int64), 5).tolist() == []


def test_rank_of_a_full_row() -> None:
    head, (ts,) = _head([[9] * CAPACITY], [1_000])
    assert head.rank(np.array([0]), int(ts[-1])).tolist() == [CAPACITY]
    assert head.rank(np.array([0]), int(ts[-1]) - 1).tolist() == [CAPACITY - 1]
    assert head.rank(np.array([0]), int(ts[0]) - 1).tolist() == [0]
