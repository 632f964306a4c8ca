"""Slot digests and data slots in a store's aggregate (the proxy's digest read, proxy/reads.py):
two stores holding the same samples give the same digests whichever path (head or chunks) their
rows take; a sample more in the query's span changes that slot's digest only; a sample outside it
changes nothing; partials cover the data slots only."""

from __future__ import annotations

import numpy as np
import pytest

from metricsd.maths.partials import AcrossFn
from metricsd.maths.slotdigest import differing
from metricsd.maths.slots import SlotFilter, slot_of_labels
from metricsd.maths.spec import AggregateSpec, InvalidAggregate, SideQuery
from metricsd.maths.window import SeriesFn
from metricsd.model import Labels, make_labels, series_id
from metricsd.selector import parse_selector
from metricsd.store.engine import Store
from metricsd.store.query import run_aggregate
from metricsd.store.settings import StoreSettings

SLOTS = 8
ALL = SlotFilter(SLOTS, tuple(range(SLOTS)))
LABELS = [make_labels("cpu", {"namespace": f"ns{i % 3}", "pod": f"p{i}", "workload": f"w{i % 4}"}) for i in range(40)]
IDS = np.array([series_id(lab) for lab in LABELS], np.uint64)
BY_ID = {int(i): lab for i, lab in zip(IDS, LABELS, strict=True)}


def _fill(store: Store, ticks: range, skip: tuple[int, int] | None = None) -> None:
    for k in ticks:
        keep = np.array([skip != (i, k) for i in range(len(LABELS))])
        store.write(IDS[keep], np.ones(int(keep.sum())), np.full(int(keep.sum()), k * 10_000),
                    (np.arange(len(LABELS)) * float(k + 1))[keep], BY_ID)


def _spec(fn: SeriesFn = SeriesFn.RATE, data: tuple[int, ...] = (), **kw: object) -> AggregateSpec:
    side = SideQuery(parse_selector("", "cpu"), fn, 60_000)
    return AggregateSpec(side, AcrossFn.SUM, 400_000, 400_000, group_by=["workload"], slots=ALL, slot_digests=True,
                         data_slots=data, **kw)  # type: ignore[arg-type]


def _digests(store: Store, spec: AggregateSpec) -> dict[int, tuple[int, int, int]]:
    res = run_aggregate(store, spec)
    assert res.digests is not None
    return res.digests.as_dict()


def _slot(lab: Labels) -> int:
    return slot_of_labels(lab, SLOTS)


@pytest.mark.parametrize("fn", [SeriesFn.RATE, SeriesFn.LAST, SeriesFn.AVG])
def test_the_same_samples_give_the_same_digests_and_one_missing_changes_its_slot_only(fn: SeriesFn) -> None:
    a, b, c = Store(), Store(), Store()
    _fill(a, range(50))
    _fill(b, range(50))
    _fill(c, range(50), skip=(5, 39))  # series 5 lacks the sample at 390 s, inside (340 s, 400 s]
    da, db, dc = (_digests(s, _spec(fn)) for s in (a, b, c))
    assert da == db and sum(n for n, _, _ in da.values()) == len(LABELS)
    assert differing([da, dc], list(range(SLOTS))) == [_slot(LABELS[5])]


def test_a_sample_outside_the_span_changes_nothing_and_chunks_or_head_do_not_matter() -> None:
    a, b = Store(), Store()
    _fill(a, range(50))
    _fill(b, range(50), skip=(7, 2))  # at 20 s: long before the window
    assert _digests(a, _spec()) == _digests(b, _spec())
    # Small chunks: the span reaches into sealed chunks on one store, the head alone on the other.
    small = Store(StoreSettings(chunk_samples=8, head_keep=2))
    _fill(small, range(50))
    early = AggregateSpec(SideQuery(parse_selector("", "cpu"), SeriesFn.RATE, 60_000), AcrossFn.SUM, 100_000,
                          400_000, step_ms=30_000, slots=ALL, slot_digests=True)
    assert int(small.chunks.samples[0]) > 30  # most of the span is in chunks there
    assert _digests(a, early) == _digests(small, early)


def test_partials_cover_the_data_slots_only_and_digests_every_slot() -> None:
    store = Store()
    _fill(store, range(50))
    whole = run_aggregate(store, AggregateSpec(SideQuery(parse_selector("", "cpu"), SeriesFn.RATE, 60_000),
                                               AcrossFn.SUM, 400_000, 400_000, group_by=["workload"]))
    data = (0, 3, 5)
    res = run_aggregate(store, _spec(data=data))
    assert sorted(res.numerator.ids.tolist()) == sorted(
        int(i) for i, lab in zip(IDS, LABELS, strict=True) if _slot(lab) in data)
    assert res.digests is not None and len(res.digests.slots) == len({_slot(lab) for lab in LABELS})
    only = run_aggregate(store, _spec())
    assert only.groups == [] and only.series_scanned == 0
    assert only.digests is not None and only.digests.as_dict() == res.digests.as_dict()
    assert whole.series_scanned == len(LABELS)


def test_bad_digest_requests_are_refused() -> None:
    store = Store()
    _fill(store, range(3))
    side = SideQuery(parse_selector("", "cpu"), SeriesFn.RATE, 60_000)
    with pytest.raises(InvalidAggregate, match="needs a slot filter"):
        run_aggregate(store, AggregateSpec(side, AcrossFn.SUM, 20_000, 20_000, slot_digests=True))
    with pytest.raises(InvalidAggregate, match="not among the request's slots"):
        run_aggregate(store, AggregateSpec(side, AcrossFn.SUM, 20_000, 20_000, slots=SlotFilter(8, (1, 2)),
                                           slot_digests=True, data_slots=(3,)))
    with pytest.raises(InvalidAggregate, match="only meaningful with slot_digests"):
        run_aggregate(store, AggregateSpec(side, AcrossFn.SUM, 20_000, 20_000, slots=ALL, data_slots=(1,)))
