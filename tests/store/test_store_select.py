"""SeriesIndex.select against the definition (every matcher on every live series' labels, a
missing label being the empty value), on random series, removals and matchers of every kind,
with the postings built at random points (part of the rows then come from the codes' scan)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from metricsd.model import Labels, series_id
from metricsd.selector import Matcher, MatchOp, matches_all
from metricsd.store.index import SeriesIndex

NAMES = ["__name__", "namespace", "pod", "container", "x"]
VALUES = ["", "a", "b", "ab", "ns-1", "ns-10", "kube-system", "POD"]
PATTERNS = [".*", ".+", "a.*", "ns-1.*", "kube-.*", "b|ab", "", "(?i:pod)", "a?"]


@st.composite
def a_series(draw: st.DrawFn, i: int) -> Labels:
    d = {"__name__": draw(st.sampled_from(["cpu", "mem"])), "namespace": draw(st.sampled_from(VALUES[1:])),
         "pod": f"p{i}"}
    for name in ("container", "x"):
        if draw(st.booleans()):
            d[name] = draw(st.sampled_from(VALUES))
    return tuple(sorted(d.items()))


@st.composite
def matcher(draw: st.DrawFn) -> Matcher:
    op = draw(st.sampled_from(list(MatchOp)))
    name = draw(st.sampled_from([*NAMES, "absent"]))
    if op in (MatchOp.RE, MatchOp.NRE):
        return Matcher(op, name, draw(st.sampled_from(PATTERNS)))
    return Matcher(op, name, draw(st.sampled_from([*VALUES, "cpu", "p3"])))


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_select_equals_the_definition(data: st.DataObject) -> None:
    index = SeriesIndex()
    labels: dict[int, Labels] = {}
    n = data.draw(st.integers(1, 60))
    for i in range(n):
        lab = data.draw(a_series(i))
        labels[index.add(series_id(lab), lab)] = lab
        if data.draw(st.integers(0, 9)) == 0:  # postings built here: later rows are scanned from the codes
            for col in index.columns.values():
                col.build(index.n_rows)
        if labels and data.draw(st.integers(0, 5)) == 0:
            row = data.draw(st.sampled_from(sorted(labels)))
            index.remove(row)
            del labels[row]
    for _ in range(5):
        ms = data.draw(st.lists(matcher(), min_size=1, max_size=3))
        want = sorted(r for r, lab in labels.items() if matches_all(ms, lab))
        got = index.select(ms)
        assert got.tolist() == want, ms
        assert index.selected(ms).tolist() == want
    index._check()


def test_negative_matcher_on_a_label_few_series_have() -> None:
    """{x!="1"} where x is on the first series only: every other series matches (its codes column
    covers every row, however many series came after)."""
    index = SeriesIndex()
    index.add(1, (("__name__", "a"), ("namespace", "n"), ("pod", "p"), ("x", "1")))
    for i in range(2, 3000):
        index.add(i, (("__name__", "a"), ("namespace", "n"), ("pod", f"p{i}")))
    got = index.select([Matcher(MatchOp.EQ, "__name__", "a"), Matcher(MatchOp.NEQ, "x", "1")])
    assert got.tolist() == list(range(1, 2999))
    assert index.select([Matcher(MatchOp.NEQ, "x", "")]).tolist() == [0]  # {x!=""}: has x


def test_a_regex_runs_once_per_distinct_value() -> None:
    calls = []

    class Counting(str):
        pass

    index = SeriesIndex()
    for i in range(500):
        index.add(i, (("__name__", "a"), ("namespace", "n"), ("pod", f"p{i % 50}")))
    m = Matcher(MatchOp.RE, "pod", "p1.*")
    real = m.matches
    object.__setattr__(m, "matches", lambda v: calls.append(v) or real(v))
    assert len(index.select([m])) == 11 * 10
    assert len(calls) == 51  # 50 values and the empty one
    index.select([m])
    assert len(calls) == 51  # kept
    index.add(1000, (("__name__", "a"), ("namespace", "n"), ("pod", "p1x")))
    assert len(index.select([m])) == 111
    assert len(calls) == 52  # only the new value
    np.testing.assert_array_equal(index.select([m])[-1:], [500])
