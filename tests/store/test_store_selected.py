"""SeriesIndex.selected (a kept selection) answers as select and in_slots do, after any series is
added or removed, and hands out arrays nobody can change."""

from __future__ import annotations

import numpy as np
import pytest

import metricsd.store.index as index_module
from metricsd.model import make_labels, series_id
from metricsd.selector import parse_selector
from metricsd.store.index import MAX_SELECTED, SeriesIndex

SLOTS = 8


def _add(index: SeriesIndex, i: int) -> int:
    labels = make_labels("cpu", {"namespace": f"ns{i % 2}", "pod": f"p{i}", "workload": f"w{i % 3}"})
    return index.add(series_id(labels), labels)


def _fresh(index: SeriesIndex, selector: str, slots: tuple[int, ...]) -> list[int]:
    rows = index.select(parse_selector(selector, "cpu"))
    return index.in_slots(rows, SLOTS, slots).tolist()


@pytest.mark.parametrize("selector", ['workload="w1"', 'namespace=~"ns.*",workload!="w2"', ""])
def test_a_kept_selection_follows_every_added_and_removed_series(selector: str) -> None:
    index = SeriesIndex()
    rows = [_add(index, i) for i in range(30)]
    matchers = parse_selector(selector, "cpu")
    some = (0, 3, 5, 6)
    for step in range(12):
        assert index.selected(matchers, SLOTS, some).tolist() == _fresh(index, selector, some)
        assert index.selected(matchers).tolist() == index.select(matchers).tolist()
        if step % 2:
            index.remove(rows[step])
        else:
            rows.append(_add(index, 100 + step))
    index._check()


def test_a_kept_selection_is_read_only_and_the_cache_is_bounded() -> None:
    index = SeriesIndex()
    for i in range(10):
        _add(index, i)
    rows = index.selected(parse_selector("", "cpu"), SLOTS, (1, 2))
    with pytest.raises(ValueError):
        rows[:] = 0
    for slot in range(MAX_SELECTED + 5):
        index.selected(parse_selector(f'pod="p{slot}"', "cpu"))
    assert len(index._selected) <= MAX_SELECTED
    assert np.array_equal(index.selected(parse_selector('pod="p3"', "cpu")), index.select(parse_selector('pod="p3"',
                                                                                                         "cpu")))


def test_selections_past_the_row_budget_are_made_each_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(index_module, "MAX_SELECTED_ROWS", 5)
    index = SeriesIndex()
    for i in range(10):
        _add(index, i)
    big = index.selected(parse_selector("", "cpu"))  # 10 rows: over the budget, not kept
    assert len(big) == 10 and not big.flags.writeable and index._selected == {}
    for pod in range(7):  # one row each: the budget of 5 rows empties the memory when full
        assert index.selected(parse_selector(f'pod="p{pod}"', "cpu")).tolist() == \
            index.select(parse_selector(f'pod="p{pod}"', "cpu")).tolist()
        assert index._selected_rows == sum(len(r) for r in index._selected.values()) <= 5
