"""Rollups as columns (rpc/rollupbatch.py): a store's columnar answer holds what its per-series
answer holds; a batch that disagrees with itself is refused; most_hours merges as the proxy does."""

from __future__ import annotations

import numpy as np
import pytest

from metricsd.clock import SystemClock
from metricsd.columns import LabelColumns
from metricsd.model import make_labels, series_id
from metricsd.proto import metricsd_pb2 as pb
from metricsd.proxy.hourread import most_hours
from metricsd.rpc.rollupbatch import RollupArrays, rollups_from_response
from metricsd.rpc.wire import InvalidSeries
from metricsd.store.api import StoreAPI
from metricsd.store.engine import Store

HOUR = 3_600_000
T0 = 1_700_000_000_000 // HOUR * HOUR


def _store() -> StoreAPI:
    store = Store()
    labels = [make_labels("m", {"namespace": "ns", "pod": f"p{i}", **({"x": "y"} if i % 3 else {})})
              for i in range(20)]
    for i, lab in enumerate(labels):
        ts = np.arange(T0 + i * 600_000, T0 + 4 * HOUR, 60_000, dtype=np.int64)
        vals = np.sin(ts / 1e6) * (i + 1)
        store.write(np.array([series_id(lab)], np.uint64), np.array([len(ts)]), ts, vals, {series_id(lab): lab})
    return StoreAPI(store, "s", SystemClock())


def test_the_columnar_rollups_answer_holds_what_the_per_series_one_holds() -> None:
    api = _store()
    req = pb.ReadRequest(matchers=[pb.Matcher(type=pb.Matcher.RE, name="__name__", value=".+")], start_ms=T0,
                         end_ms=T0 + 2 * HOUR)
    per_series = api.rollups(req)
    req.columnar = True
    batch = api.rollups(req)
    assert batch.HasField("batch") and not batch.series
    a, b = rollups_from_response(per_series), rollups_from_response(batch)
    assert len(a) == 20 and 0 < len(b) < 20  # the batch leaves out the series without an hour in range
    a = a.take(np.flatnonzero(a.counts))
    order_a, order_b = np.argsort(a.ids), np.argsort(b.ids)
    a, b = a.take(order_a), b.take(order_b)
    assert a.ids.tolist() == b.ids.tolist()
    assert a.labels.to_list() == b.labels.to_list()
    for f in ("offsets", "hours", "min", "max", "sum", "count", "last"):
        np.testing.assert_array_equal(getattr(a, f), getattr(b, f))
    assert int(a.counts.sum()) > 20


def test_a_batch_whose_fields_disagree_is_refused() -> None:
    api = _store()
    req = pb.ReadRequest(matchers=[pb.Matcher(type=pb.Matcher.RE, name="__name__", value=".+")], start_ms=T0,
                         end_ms=T0 + 2 * HOUR, columnar=True)
    resp = api.rollups(req)
    resp.batch.max = resp.batch.max[:-8]
    with pytest.raises(InvalidSeries):
        rollups_from_response(resp)


def _arrays(ids: list[int], hours: list[list[int]]) -> RollupArrays:
    counts = np.array([len(h) for h in hours])
    offsets = np.r_[0, np.cumsum(counts)].astype(np.int64)
    flat = np.array([x for h in hours for x in h], np.int64)
    labels = LabelColumns.from_labels([make_labels("m", {"namespace": "n", "pod": str(i)}) for i in ids])
    f = flat.astype(np.float64)
    return RollupArrays(np.array(ids, np.uint64), labels, offsets, flat, f, f + 1, f + 2, f + 3, f + 4)


def test_most_hours_keeps_per_series_the_copy_with_more_hours() -> None:
    a = _arrays([1, 2, 3], [[10], [20, 21], [30]])
    b = _arrays([3, 1, 4], [[30, 31], [10], [40]])
    got = most_hours([a, b])
    by_id = {int(i): got.hours[got.offsets[k] : got.offsets[k + 1]].tolist() for k, i in enumerate(got.ids)}
    assert by_id == {1: [10], 2: [20, 21], 3: [30, 31], 4: [40]}
    k = int(np.flatnonzero(got.ids == 3)[0])
    assert got.last[got.offsets[k] : got.offsets[k + 1]].tolist() == [34.0, 35.0]
