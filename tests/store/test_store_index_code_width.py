"""A label column's codes start as int8 and widen to int16, then int32, as its values pass each
type's range (store/postings.py). Rows added before and after each widening keep their labels,
selections (equality, regex, negation, postings built before and after) find the same rows as a
plain scan of the labels, and label_columns hands out int32 codes whatever the column's width."""

from __future__ import annotations

import re

import numpy as np
import pytest

from metricsd.model import make_labels, series_id
from metricsd.selector import Matcher, MatchOp
from metricsd.store.index import SeriesIndex
from metricsd.store.postings import LabelColumn


def _labels(i: int) -> tuple[tuple[str, str], ...]:
    return make_labels("cpu", {"namespace": f"ns{i % 3}", "pod": f"p{i}", "node": f"n{i % 200}"})


def _expect(labels: list[tuple[tuple[str, str], ...]], name: str, pred: object) -> list[int]:
    return [r for r, lab in enumerate(labels) if pred(dict(lab).get(name, ""))]  # type: ignore[operator]


@pytest.mark.parametrize("n", [126, 127, 128, 32_766, 32_767, 32_800])
def test_codes_widen_as_values_arrive_and_answers_stay(n: int) -> None:
    index = SeriesIndex()
    labels = [_labels(i) for i in range(n)]
    for i, lab in enumerate(labels):
        index.add(series_id(lab), lab)
        if i == n // 2:  # postings built over the narrower codes; the rest scanned, then rebuilt
            index.select([Matcher(MatchOp.EQ, "pod", "p1")])
    pod = index.columns["pod"]
    want = np.int8 if n <= 127 else np.int16 if n <= 32_767 else np.int32
    assert pod.codes.dtype == want and int(pod.codes[:n].max()) == n - 1
    assert index.columns["namespace"].codes.dtype == np.int8
    assert index.columns["node"].codes.dtype == (np.int8 if n <= 127 else np.int16)  # min(n, 200) values
    for r in (0, 125, 126, n - 1):
        if r < n:
            assert index.labels_of(r) == labels[r]
    cols = index.label_columns(np.arange(n))
    assert all(c.dtype == np.int32 for c in cols.codes) and cols.to_list() == labels
    last = f"p{n - 1}"
    cases = [Matcher(MatchOp.EQ, "pod", last), Matcher(MatchOp.RE, "pod", "p12.*"),
             Matcher(MatchOp.NRE, "pod", "p1.*"), Matcher(MatchOp.NEQ, "node", "n7")]
    for m in cases:
        rx = re.compile(m.value)
        pred = {MatchOp.EQ: lambda v, m=m: v == m.value, MatchOp.NEQ: lambda v, m=m: v != m.value,
                MatchOp.RE: lambda v, rx=rx: rx.fullmatch(v) is not None,
                MatchOp.NRE: lambda v, rx=rx: rx.fullmatch(v) is None}[m.op]
        assert index.select([m]).tolist() == _expect(labels, m.name, pred), m
    index._check()


def test_a_column_refuses_values_past_int32() -> None:
    col = LabelColumn(4)
    col._widen(np.iinfo(np.int32).max - 1)
    assert col.codes.dtype == np.int32 and col.codes.tolist() == [-1] * 4
    with pytest.raises(OverflowError):
        col._widen(np.iinfo(np.int32).max)
