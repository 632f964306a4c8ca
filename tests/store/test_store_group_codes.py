"""SeriesIndex.group_codes (vectorised) against the plain definition: groups are the distinct
label sets of ``by`` present on the rows, sorted as tuples, with each row's group index."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from metricsd.model import Labels, make_labels, series_id
from metricsd.store.index import SeriesIndex

value = st.sampled_from(["", "a", "b", "B", "ä", "a1", "zz", "10", "9"])
series = st.lists(st.fixed_dictionaries({}, optional={"namespace": value.filter(bool), "pod": value.filter(bool),
                                                      "container": value.filter(bool), "node": value.filter(bool)}),
                  min_size=1, max_size=30)


def reference(labels: list[Labels], rows: list[int], by: list[str]) -> tuple[list[Labels], list[int]]:
    names = sorted(set(by))
    keys = [tuple((n, v) for n, v in labels[r] if n in names) for r in rows]
    groups = sorted(set(keys))
    return groups, [groups.index(k) for k in keys]


@settings(max_examples=200)
@given(series, st.lists(st.sampled_from(["namespace", "pod", "container", "node", "missing"]), max_size=3),
       st.data())
def test_groups_and_indexes_match_the_definition(pods: list[dict[str, str]], by: list[str],
                                                 data: st.DataObject) -> None:
    index = SeriesIndex()
    labels: list[Labels] = []
    for i, extra in enumerate(pods):
        # every series has namespace and pod (pods unique); container and node may be absent
        lab = make_labels("cpu", {**extra, "namespace": extra.get("namespace", "ns"),
                                  "pod": f"{extra.get('pod', 'p')}-{i}"})
        index.add(series_id(lab), lab)
        labels.append(lab)
    rows = data.draw(st.lists(st.integers(0, len(labels) - 1), min_size=0, max_size=40))
    groups, gidx = index.group_codes(np.array(rows, dtype=np.int64), by)
    if not by:
        assert groups == [()] and gidx.tolist() == [0] * len(rows)
        return
    want_groups, want_idx = reference(labels, rows, by)
    assert groups == want_groups
    assert gidx.tolist() == want_idx
