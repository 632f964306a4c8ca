"""Write limits as pure functions, and the store engine's series limits (time passed in)."""

from __future__ import annotations

import numpy as np
import pytest

from metricsd.model import Labels, make_labels, series_id
from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc.limits import RequestLimits, check_counts, check_write_request
from metricsd.store.engine import Store
from metricsd.store.limits import (
    BYTES_PER_SERIES,
    MIN_DEFAULT_SERIES,
    NewSeriesRate,
    SeriesLimitExceeded,
    SeriesLimits,
    default_max_series,
    series_limit_refusal,
    tokens_at,
)
from metricsd.store.settings import StoreSettings


def _labels(i: int, ns: str = "shop") -> Labels:
    return make_labels("cpu", {"namespace": ns, "pod": f"p{i}"})


def _write(store: Store, labels: list[Labels], t: int, now_s: float | None = 0.0) -> int:
    ids = np.array([series_id(lab) for lab in labels], dtype=np.uint64)
    res = store.write(ids, np.ones(len(labels), dtype=np.int64), np.full(len(labels), t, dtype=np.int64),
                      np.ones(len(labels)), {series_id(lab): lab for lab in labels}, now_s=now_s)
    return res.written


def test_request_limits_name_the_limit_and_the_count() -> None:
    limits = RequestLimits(max_series=10, max_samples=100)
    assert check_counts(10, 100, limits) is None
    r = check_counts(11, 5, limits)
    assert r is not None and r.reason == "request_series"
    assert r.message.startswith("write request has 11 series, more than the limit of 10 series per request")
    r = check_counts(1, 101, limits)
    assert r is not None and r.reason == "request_samples" and "101 samples, more than the limit of 100" in r.message
    assert check_counts(10**9, 10**9, RequestLimits(0, 0)) is None  # 0: unlimited
    with pytest.raises(ValueError):
        RequestLimits(max_series=-1)


def test_request_limits_count_labels_and_values_too() -> None:
    req = pb.WriteRequest(ids=[1], counts=[1], timestamps=[1], values=[1.0, 2.0, 3.0])
    for i in range(3):
        req.series.add(id=i)
    r = check_write_request(req, RequestLimits(max_series=2, max_samples=2))
    assert r is not None and r.reason == "request_series"
    r = check_write_request(req, RequestLimits(max_series=3, max_samples=2))
    assert r is not None and "3 samples" in r.message


def test_default_max_series_is_half_the_memory_over_the_bytes_per_series() -> None:
    assert default_max_series(8 * 2**30) == 8 * 2**30 // 2 // BYTES_PER_SERIES == 174_762
    assert default_max_series(2**20) == MIN_DEFAULT_SERIES


def test_series_limit_refusal() -> None:
    assert series_limit_refusal(10, 0, 10, "x") is None  # no new series: always accepted
    assert series_limit_refusal(8, 2, 10, "x") is None
    assert series_limit_refusal(10**6, 5, 0, "x") is None  # 0: unlimited
    msg = series_limit_refusal(9, 2, 10, 'cpu{pod="a"}')
    assert msg is not None and "holds 9 series and the limit is 10 (--max-series)" in msg
    assert "2 new series, e.g. cpu{pod=\"a\"}" in msg


def test_token_bucket_refills_at_the_rate_up_to_its_size() -> None:
    assert tokens_at(0.0, 0.0, 30.0, 100) == 50.0
    assert tokens_at(0.0, 0.0, 600.0, 100) == 100.0
    assert tokens_at(40.0, 10.0, 5.0, 100) == 40.0  # a clock that went back refills nothing


def test_new_series_rate_per_namespace() -> None:
    rate = NewSeriesRate(60)
    assert rate.refusal({"a": 60}, 0.0, {"a": "x"}) is None
    rate.charge({"a": 60}, 0.0)
    msg = rate.refusal({"a": 1, "b": 1}, 0.0, {"a": "cpu{}", "b": "y"})
    assert msg is not None and "namespace 'a' may create 60 new series per minute" in msg and "e.g. cpu{}" in msg
    assert rate.refusal({"b": 60}, 0.0, {"b": "y"}) is None  # another namespace has its own bucket
    assert rate.refusal({"a": 10}, 10.0, {"a": "x"}) is None  # 10 s later: 10 more
    assert rate.refusal({"a": 11}, 10.0, {"a": "x"}) is not None
    rate.prune(10.0)
    assert len(rate) == 1
    rate.prune(60.0)
    assert len(rate) == 0
    assert NewSeriesRate(0).refusal({"a": 10**9}, 0.0, {"a": "x"}) is None


def test_store_series_limit_refuses_new_series_whole_batch_and_keeps_existing() -> None:
    store = Store(StoreSettings(series_limits=SeriesLimits(max_series=3)))
    assert _write(store, [_labels(0), _labels(1)], 1000) == 2
    before = store.stats()
    with pytest.raises(SeriesLimitExceeded, match=r"holds 2 series and the limit is 3 \(--max-series\); this write "
                                                  r"would create 2 new series") as e:
        _write(store, [_labels(0), _labels(2), _labels(3)], 2000)  # one known, two new: all refused
    assert e.value.reason == "series_limit"
    assert store.stats() == before
    assert store.refused["series_limit"] == 3 and store.rejected["series_limit"] == 0
    assert _write(store, [_labels(0), _labels(1)], 2000) == 2  # existing series: accepted
    assert _write(store, [_labels(2)], 2000) == 1  # up to the limit
    assert store.stats()["series"] == 3
    # Without now_s (WAL replay, catch-up) the limits do not apply: that data was acknowledged.
    assert _write(store, [_labels(9)], 3000, now_s=None) == 1


def test_store_new_series_rate_is_per_namespace_and_charged_only_when_applied() -> None:
    store = Store(StoreSettings(series_limits=SeriesLimits(max_new_series_per_minute=60)))
    assert _write(store, [_labels(i) for i in range(60)], 1000, now_s=0.0) == 60
    before = store.stats()
    with pytest.raises(SeriesLimitExceeded, match="namespace 'shop' may create 60 new series per minute") as e:
        _write(store, [_labels(60)], 2000, now_s=0.5)
    assert e.value.reason == "new_series_rate" and store.stats() == before
    assert _write(store, [_labels(i) for i in range(60)], 2000, now_s=0.5) == 60  # known series: accepted
    assert _write(store, [_labels(0, ns="other")], 2000, now_s=0.5) == 1
    assert _write(store, [_labels(60), _labels(61)], 3000, now_s=2.5) == 2  # 2 s refilled 2
    with pytest.raises(SeriesLimitExceeded):
        _write(store, [_labels(62)], 4000, now_s=2.5)
