"""A range function's block keeps exactly the series present at some step (promql/rangefuncs.py
_rows), whether every series is (a pod's panel: the block is built without gathering rows) or
some are not (they are dropped): the labels, the values where present (NaN elsewhere) and the
presence, in the input's order."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from metricsd.columns import SeriesColumns
from metricsd.promql.rangefuncs import _rows
from metricsd.promql.selectors import RangeArg


@given(st.integers(1, 5), st.integers(0, 6), st.data())
def test_rows_keeps_the_series_present_at_some_step(rows: int, steps: int, data: st.DataObject) -> None:
    ok = np.array(data.draw(st.lists(st.lists(st.booleans(), min_size=steps, max_size=steps), min_size=rows,
                                     max_size=rows)), dtype=bool).reshape(rows, steps)
    values = np.arange(rows * steps, dtype=np.float64).reshape(rows, steps) + 0.5
    labels = [(("__name__", "m"), ("pod", f"p{i}")) for i in range(rows)]
    cols = SeriesColumns.from_arrays(labels, [np.array([1, 2])] * rows, [np.array([1.0, 2.0])] * rows)
    arg = RangeArg(cols, np.arange(steps, dtype=np.int64), 60_000)
    block = _rows(arg, values, ok.copy())
    keep = [i for i in range(rows) if ok[i].any()]
    assert block.labels.to_list() == [labels[i] for i in keep]
    assert block.present.tolist() == ok[keep].tolist()
    want = np.where(ok[keep], values[keep], np.nan)
    assert np.array_equal(block.values, want, equal_nan=True)
    assert block.drop_name
