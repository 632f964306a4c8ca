"""A label column grows only when a row with its label arrives, so series added after the last one
with a label lie past that column's end: grouping by it, listing its values over some rows and
matching on it must treat them as rows without the label, not fail. The daysim's replicas (no
`node` label) added after every node-labelled series made /api/v1/metricsd/pods (grouped by node)
answer 500 with an IndexError."""

from __future__ import annotations

import numpy as np

from metricsd.model import make_labels, series_id
from metricsd.selector import Matcher, MatchOp
from metricsd.store.index import SeriesIndex


def _index() -> SeriesIndex:
    index = SeriesIndex()
    for i in range(100):  # past the first 64 rows a column holds
        lab = make_labels("cpu", {"namespace": "ns", "pod": f"with-{i}", "node": f"n{i % 3}"})
        index.add(series_id(lab), lab)
    for i in range(100):
        lab = make_labels("cpu", {"namespace": "ns", "pod": f"without-{i}"})
        index.add(series_id(lab), lab)
    return index


def test_grouping_by_a_label_that_later_rows_lack_puts_them_in_the_group_without_it() -> None:
    index = _index()
    groups, gidx = index.group_codes(np.arange(200, dtype=np.int64), ["node"])
    assert groups == [(), (("node", "n0"),), (("node", "n1"),), (("node", "n2"),)]
    assert gidx[150:].tolist() == [0] * 50 and gidx[:3].tolist() == [1, 2, 3]


def test_values_and_matchers_over_rows_past_a_columns_end() -> None:
    index = _index()
    assert index.label_values("node", np.array([5, 150, 199])) == ["n2"]
    assert index.label_values("node", np.array([150, 199])) == []
    unmatched = index.select([Matcher(MatchOp.EQ, "namespace", "ns"), Matcher(MatchOp.NEQ, "node", "n0")])
    assert len(unmatched) == 200 - 34  # rows without a node match node!="n0"
    assert len(index.select([Matcher(MatchOp.EQ, "namespace", "ns"), Matcher(MatchOp.EQ, "node", "")])) == 100
