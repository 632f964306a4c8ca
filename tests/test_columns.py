"""LabelColumns and SeriesColumns against plain Python over label tuples (the oracle)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from metricsd.columns import LabelColumns, SeriesColumns, search_each
from metricsd.model import Labels

NAMES = ["__name__", "a", "b", "pod", "z"]
VALUES = ["", "x", "y", "xy", "é", "0", "Z"]


@st.composite
def label_sets(draw: st.DrawFn, max_series: int = 12) -> list[Labels]:
    n = draw(st.integers(0, max_series))
    out = []
    for _ in range(n):
        names = draw(st.sets(st.sampled_from(NAMES), max_size=len(NAMES)))
        out.append(tuple(sorted((k, draw(st.sampled_from(VALUES))) for k in names)))
    return out


@given(label_sets())
def test_round_trip_and_order(labels: list[Labels]) -> None:
    cols = LabelColumns.from_labels(labels)
    assert cols.to_list() == labels
    assert [cols.labels_at(i) for i in range(len(labels))] == labels
    got = [labels[i] for i in cols.sort_order().tolist()]
    assert got == sorted(labels)


@given(label_sets(), st.sets(st.sampled_from(NAMES)), st.booleans())
def test_group_matches_tuples(labels: list[Labels], names: set[str], by: bool) -> None:
    cols = LabelColumns.from_labels(labels)
    groups, idx = cols.group(sorted(names), by, always_drop=("__name__",))

    def key(lab: Labels) -> Labels:
        if by:
            return tuple(kv for kv in lab if kv[0] in names)
        return tuple(kv for kv in lab if kv[0] not in names and kv[0] != "__name__")

    want = sorted({key(lab) for lab in labels})
    assert groups.to_list() == want
    assert [want[g] for g in idx.tolist()] == [key(lab) for lab in labels]


@given(st.lists(label_sets(max_series=5), max_size=4))
def test_concat_renumbers_tables(parts: list[list[Labels]]) -> None:
    cols = LabelColumns.concat([LabelColumns.from_labels(p) for p in parts])
    assert cols.to_list() == [lab for p in parts for lab in p]


def test_concat_shares_one_table() -> None:
    table = ["x", "y", "z"]
    a = LabelColumns(["a"], [np.array([0, 2], np.int32)], [table])
    b = LabelColumns(["a", "b"], [np.array([1], np.int32), np.array([0], np.int32)], [table, ["q"]])
    c = LabelColumns.concat([a, b])
    assert c.values[0] is table
    assert c.to_list() == [(("a", "x"),), (("a", "z"),), (("a", "y"), ("b", "q"))]
    assert c.present_names() == ["a", "b"] and c.values_of("a") == ["x", "y", "z"]


@st.composite
def series(draw: st.DrawFn) -> tuple[list[Labels], list[np.ndarray]]:
    labels = sorted(set(draw(label_sets(max_series=8))))
    ts = [np.array(sorted(draw(st.sets(st.integers(-50, 50), max_size=6))), dtype=np.int64) for _ in labels]
    return labels, ts


@given(series(), st.integers(-60, 60), st.integers(0, 60), st.booleans())
@settings(max_examples=200)
def test_window_and_take(data: tuple[list[Labels], list[np.ndarray]], start: int, width: int, keep: bool) -> None:
    labels, ts = data
    vals = [t.astype(np.float64) * 2 for t in ts]
    sc = SeriesColumns.from_arrays(labels, ts, vals, ids=np.arange(len(labels), dtype=np.uint64))
    w = sc.window(start, start + width, keep_empty=keep)
    want = [(lab, t[(t >= start) & (t <= start + width)]) for lab, t in zip(labels, ts, strict=True)]
    if not keep:
        want = [(lab, t) for lab, t in want if len(t)]
    assert len(w) == len(want)
    for i, (lab, t) in enumerate(want):
        got_lab, got_t, got_v = w.series_at(i)
        assert got_lab == lab and got_t.tolist() == t.tolist() and got_v.tolist() == (t * 2.0).tolist()
    assert w.ids is not None and [labels[int(i)] for i in w.ids] == [lab for lab, _ in want]
    back = SeriesColumns.concat([sc.take(np.arange(len(sc))[::-1]), sc])
    assert len(back) == 2 * len(sc) and back.samples == 2 * sc.samples


@given(series(), st.lists(st.integers(-60, 60), min_size=1, max_size=4))
def test_search_each(data: tuple[list[Labels], list[np.ndarray]], times: list[int]) -> None:
    _, ts = data
    sc = SeriesColumns.from_arrays([()] * len(ts), ts, ts)
    got = search_each(sc.timestamps, sc.offsets, np.array(times))
    for i, t in enumerate(ts):
        assert got[i].tolist() == (sc.offsets[i] + np.searchsorted(t, times, side="right")).tolist()


@given(st.lists(st.integers(-50, 50), max_size=40), st.integers(0, 5), st.integers(0, 5),
       st.lists(st.integers(-60, 60), min_size=1, max_size=6))
def test_search_each_of_one_series_anywhere_in_the_array(samples: list[int], before: int, after: int,
                                                         times: list[int]) -> None:
    """One series (a dashboard's pod) takes its own path: it must answer as the key search does,
    for a series that does not start the flat array, and times on samples (the windows' edges)."""
    t = np.array(sorted(samples), dtype=np.int64)
    ts = np.concatenate([np.full(before, -99, np.int64), t, np.full(after, 99, np.int64)])
    offsets = np.array([before, before + t.size], dtype=np.int64)
    got = search_each(ts, offsets, np.array(times + samples[:3], dtype=np.int64))
    want = before + np.searchsorted(t, np.array(times + samples[:3]), side="right")
    assert got.shape == (1, len(times) + len(samples[:3]))
    assert got[0].tolist() == want.tolist()
