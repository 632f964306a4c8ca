"""Slot digests (metricsd/maths/slotdigest.py): equal for the same holdings in any order, different
when a replica holds one sample or one series more or less."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from metricsd.maths.slotdigest import differing, series_hashes, slot_digests

series_strategy = st.lists(
    st.tuples(st.integers(0, 2**64 - 1), st.integers(0, 15), st.integers(0, 400), st.integers(-1, 10**13)),
    min_size=1, max_size=40, unique_by=lambda t: t[0])


def digest(rows: list[tuple[int, int, int, int]], side: int = 0) -> dict[int, tuple[int, int, int]]:
    ids = np.array([r[0] for r in rows], dtype=np.uint64)
    slots = np.array([r[1] for r in rows], dtype=np.int64)
    counts = np.array([r[2] for r in rows], dtype=np.int64)
    newest = np.array([r[3] for r in rows], dtype=np.int64)
    return slot_digests(slots, counts, series_hashes(ids, side, counts, newest)).as_dict()


@given(series_strategy, st.randoms())
def test_the_order_of_the_series_does_not_matter(rows: list[tuple[int, int, int, int]], rnd: object) -> None:
    shuffled = list(rows)
    rnd.shuffle(shuffled)  # type: ignore[attr-defined]
    assert digest(rows) == digest(shuffled)


@given(series_strategy, st.data())
def test_one_sample_or_one_series_more_or_less_changes_the_slot(rows: list[tuple[int, int, int, int]],
                                                              data: st.DataObject) -> None:
    i = data.draw(st.integers(0, len(rows) - 1))
    sid, slot, count, newest = rows[i]
    before = digest(rows)
    for changed in ([*rows[:i], (sid, slot, count + 1, newest), *rows[i + 1:]],
                    [*rows[:i], (sid, slot, count, newest + 10_000), *rows[i + 1:]],
                    rows[:i] + rows[i + 1:]):
        after = digest(changed)
        assert differing([before, after], [slot]) == [slot]
        others = sorted(set(before) - {slot})
        assert differing([before, after], others) == []  # the other slots keep their digests


def test_the_side_of_the_query_is_part_of_the_hash() -> None:
    rows = [(7, 3, 10, 1_000)]
    assert digest(rows, side=0) != digest(rows, side=1)


def test_per_slot_counts_and_a_slot_missing_from_a_reply_holds_nothing() -> None:
    d = digest([(1, 2, 5, 100), (2, 2, 7, 90), (3, 9, 1, 50)])
    assert {s: v[:2] for s, v in d.items()} == {2: (2, 12), 9: (1, 1)}
    assert differing([d, {9: d[9]}], [2, 9]) == [2]
    assert differing([{}, {}], [4]) == []
    empty = slot_digests(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.uint64))
    assert empty.as_dict() == {}
