"""Merging replicas' aggregate replies equals one store holding everything; laggards are named."""

from __future__ import annotations

import random

import numpy as np
import pytest

from metricsd.model import make_labels, series_id
from metricsd.proto import metricsd_pb2 as pb
from metricsd.proxy.merge import MergeError, merge_aggregates, merge_group_partials
from metricsd.rpc.wire import SHORT_FIELD, float_array, matchers_to_pb
from metricsd.selector import parse_selector
from metricsd.store.api import StoreAPI
from metricsd.store.engine import Store

SLOTS = 6


def _write(store: Store, labels: tuple, ts: list[int], vals: list[float]) -> None:
    sid = series_id(labels)
    store.write(np.array([sid], np.uint64), np.array([len(ts)]), np.array(ts), np.array(vals), {sid: labels})


def _cluster(seed: int, drop_in_replica: bool) -> tuple[Store, list[Store], dict[int, list[int]]]:
    """One 'truth' store, and 3 stores holding every slot twice (slot s on members s%3, (s+1)%3)."""
    rng = random.Random(seed)
    truth = Store()
    members = [Store() for _ in range(3)]
    replicas = {s: [s % 3, (s + 1) % 3] for s in range(SLOTS)}
    from metricsd.maths.slots import slot_of_labels

    for p in range(40):
        for metric in ("usage", "request"):
            labels = make_labels(metric, {"namespace": "ns", "pod": f"p{p}", "workload": f"w{p % 3}"})
            n = rng.randint(2, 30)
            ts = [k * 10_000 for k in range(n)]
            vals = list(np.cumsum([rng.uniform(0, 3) for _ in ts]).tolist()) if metric == "usage" else [2.0] * n
            _write(truth, labels, ts, vals)
            for i, m in enumerate(replicas[slot_of_labels(labels, SLOTS)]):
                if drop_in_replica and i == 1 and p % 5 == 0:
                    _write(members[m], labels, ts[: n // 2], vals[: n // 2])  # a replica that missed writes
                else:
                    _write(members[m], labels, ts, vals)
    return truth, members, replicas


def _request(across: int, ratio: bool, t: int) -> pb.AggregateRequest:
    req = pb.AggregateRequest(across=across, quantile=0.75, group_by=["workload"], start_ms=t - 100_000, end_ms=t,
                              step_ms=50_000)
    req.query.matchers.extend(matchers_to_pb(parse_selector("", "usage")))
    req.query.series_fn = pb.SERIES_RATE
    req.query.window_ms = 60_000
    if ratio:
        req.denominator.matchers.extend(matchers_to_pb(parse_selector("", "request")))
        req.denominator.series_fn = pb.SERIES_LAST
        req.denominator.window_ms = 300_000
    return req


def _fan_out(members: list[Store], replicas: dict[int, list[int]], req: pb.AggregateRequest, both: bool
             ) -> list[pb.AggregateResponse]:
    """Ask each member for its slots: with both, every replica of every slot (R = 2)."""
    asked: dict[int, list[int]] = {}
    for s, ms in replicas.items():
        for m in ms if both else ms[:1]:
            asked.setdefault(m, []).append(s)
    out = []
    for m, slots in sorted(asked.items()):
        r = pb.AggregateRequest()
        r.CopyFrom(req)
        r.per_series = True
        r.slots.slot_count = SLOTS
        r.slots.slots.extend(slots)
        out.append(StoreAPI(members[m]).aggregate(r))
    return out


@pytest.mark.parametrize(
    ("across", "ratio"),
    [(a, r) for a in (pb.ACROSS_AVG, pb.ACROSS_SUM, pb.ACROSS_MAX, pb.ACROSS_COUNT) for r in (False, True)]
    + [(pb.ACROSS_QUANTILE, False)],
)
def test_merged_replicas_equal_one_store_holding_everything(across: int, ratio: bool) -> None:
    truth, members, replicas = _cluster(1, drop_in_replica=True)
    req = _request(across, ratio, 200_000)
    want = StoreAPI(truth).aggregate(req)
    merged = merge_aggregates(req, _fan_out(members, replicas, req, both=True))
    got = merged.response
    assert [list(g.labels) for g in got.groups] == [list(g.labels) for g in want.groups]
    assert list(got.timestamps) == list(want.timestamps)
    np.testing.assert_allclose(np.array(got.values), np.array(want.values), rtol=1e-12, equal_nan=True)
    np.testing.assert_allclose(np.array(got.numerator.count), np.array(want.numerator.count))


def test_the_replica_that_missed_writes_is_named_for_repair() -> None:
    _, members, replicas = _cluster(2, drop_in_replica=True)
    req = _request(pb.ACROSS_SUM, False, 200_000)
    replies = _fan_out(members, replicas, req, both=True)
    merged = merge_aggregates(req, replies)
    lagging_ids = set().union(*merged.lagging.values()) if merged.lagging else set()
    want = {series_id(make_labels("usage", {"namespace": "ns", "pod": f"p{p}", "workload": f"w{p % 3}"}))
            for p in range(0, 40, 5)}
    # every lagging id is one we truncated, and a truncated series with data in the window is found
    assert lagging_ids and lagging_ids <= want


def test_replies_with_different_times_are_refused() -> None:
    a = pb.AggregateResponse(timestamps=[1, 2])
    b = pb.AggregateResponse(timestamps=[1])
    with pytest.raises(MergeError, match="different evaluation times"):
        merge_aggregates(_request(pb.ACROSS_SUM, False, 0), [a, b])


def test_one_reply_per_slot_is_enough_without_laggards() -> None:
    truth, members, replicas = _cluster(3, drop_in_replica=False)
    req = _request(pb.ACROSS_AVG, True, 150_000)
    merged = merge_aggregates(req, _fan_out(members, replicas, req, both=False))
    np.testing.assert_allclose(np.array(merged.response.values), np.array(StoreAPI(truth).aggregate(req).values),
                               equal_nan=True)
    assert merged.lagging == {}


@pytest.mark.parametrize("by", [[], ["workload"], ["pod"]])
@pytest.mark.parametrize("ratio", [False, True])
def test_group_partials_of_disjoint_slots_equal_one_store_holding_everything(by: list[str], ratio: bool) -> None:
    """One data reply per slot (the digest read): replies whose groups come in the same order are
    folded by slices, others (a reply missing a group, or with new ones) by group index."""
    truth, members, replicas = _cluster(2, drop_in_replica=False)
    for across in (pb.ACROSS_AVG, pb.ACROSS_SUM, pb.ACROSS_MIN, pb.ACROSS_MAX, pb.ACROSS_COUNT):
        req = _request(across, ratio, 200_000)
        del req.group_by[:]
        req.group_by.extend(by)
        want = StoreAPI(truth).aggregate(req)
        replies = [_group_reply(members[m], req, [s for s in range(SLOTS) if replicas[s][0] == m]) for m in range(3)]
        got = merge_group_partials(req, [*replies, _group_reply(members[0], req, [])])  # and an empty reply
        assert [list(g.labels) for g in got.groups] == [list(g.labels) for g in want.groups]
        np.testing.assert_allclose(np.array(got.values), np.array(want.values), rtol=1e-12, equal_nan=True)
        for side in ("numerator", "denominator") if ratio else ("numerator",):
            for f in ("sum", "count", "min", "max"):
                np.testing.assert_allclose(np.array(getattr(getattr(got, side), f)),
                                           np.array(getattr(getattr(want, side), f)), rtol=1e-12)


def _group_reply(store: Store, req: pb.AggregateRequest, slots: list[int]) -> pb.AggregateResponse:
    r = pb.AggregateRequest()
    r.CopyFrom(req)
    r.slots.slot_count = SLOTS
    r.slots.slots.extend(slots)
    return StoreAPI(store).aggregate(r)


@pytest.mark.parametrize("n", [0, 1, SHORT_FIELD, SHORT_FIELD + 1, 1000])
def test_float_array_reads_short_and_long_fields_alike(n: int) -> None:
    p = pb.Partials(sum=[i / 3 for i in range(n)])
    got = float_array(p.sum)
    assert got.dtype == np.float64 and got.tolist() == [i / 3 for i in range(n)]
