"""Slot filters: a partition of slots splits series and aggregates exactly, as a proxy relies on."""

from __future__ import annotations

import numpy as np
import pytest

from metricsd.maths.partials import AcrossFn, finalize, merge_partials
from metricsd.maths.slots import SlotFilter, slot_of_labels
from metricsd.maths.spec import AggregateSpec, SideQuery
from metricsd.maths.window import SeriesFn
from metricsd.model import make_labels, series_id
from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc.backend import BadRequest
from metricsd.selector import parse_selector
from metricsd.store.api import StoreAPI
from metricsd.store.engine import Store
from metricsd.store.query import run_aggregate


def _store() -> Store:
    store = Store()
    labels = [make_labels("cpu", {"namespace": f"ns{i % 3}", "pod": f"p{i}", "workload": f"w{i % 4}"})
              for i in range(60)]
    ids = np.array([series_id(lab) for lab in labels], np.uint64)
    for k in range(10):
        store.write(ids, np.ones(60), np.full(60, k * 10_000), np.arange(60) * float(k + 1),
                    {int(i): lab for i, lab in zip(ids, labels, strict=True)})
    return store


def test_a_partition_of_slots_covers_every_series_once() -> None:
    store = _store()
    everything = store.select(parse_selector("", "cpu"))
    parts = [store.select(parse_selector("", "cpu"), SlotFilter(8, (a, a + 1))) for a in range(0, 8, 2)]
    assert sorted(np.concatenate(parts).tolist()) == sorted(everything.tolist())
    for a, rows in zip(range(0, 8, 2), parts, strict=True):
        for r in rows.tolist():
            labels = store.index.labels[r]
            assert labels is not None
            assert slot_of_labels(labels, 8) in (a, a + 1)


def test_partials_of_slot_partitions_merge_to_the_whole() -> None:
    store = _store()
    side = SideQuery(parse_selector("", "cpu"), SeriesFn.RATE, 60_000)
    whole = run_aggregate(store, AggregateSpec(side, AcrossFn.AVG, 90_000, 90_000, group_by=["workload"]))
    merged = None
    for part in ((0, 1, 2), (3, 4), (5, 6, 7)):
        res = run_aggregate(store, AggregateSpec(side, AcrossFn.AVG, 90_000, 90_000, group_by=["workload"],
                                                 slots=SlotFilter(8, part)))
        # Align groups by labels, as a proxy does.
        aligned = type(res.numerator.partials).empty(len(whole.groups), 1)
        for i, g in enumerate(res.groups):
            j = whole.groups.index(g)
            p = res.numerator.partials
            aligned.sum[j], aligned.count[j], aligned.min[j], aligned.max[j] = p.sum[i], p.count[i], p.min[i], p.max[i]
        merged = aligned if merged is None else merge_partials(merged, aligned)
    assert merged is not None
    np.testing.assert_allclose(finalize(AcrossFn.AVG, merged), whole.values)


def test_a_bad_slot_filter_is_rejected() -> None:
    api = StoreAPI(_store())
    with pytest.raises(BadRequest, match="out of range"):
        api.read(pb.ReadRequest(slots=pb.SlotFilter(slot_count=4, slots=[4])))
    with pytest.raises(BadRequest, match="slot_count 0"):
        api.list_series(pb.ListSeriesRequest(slots=pb.SlotFilter(slots=[1])))


def test_rollups_honour_the_slot_filter() -> None:
    api = StoreAPI(_store())
    every = api.rollups(pb.ReadRequest(start_ms=0, end_ms=10**9))
    parts = [api.rollups(pb.ReadRequest(start_ms=0, end_ms=10**9, slots=pb.SlotFilter(slot_count=4, slots=[a, a + 1])))
             for a in (0, 2)]
    ids = [s.id for p in parts for s in p.series]
    assert sorted(ids) == sorted(s.id for s in every.series) and len(set(ids)) == len(ids)
