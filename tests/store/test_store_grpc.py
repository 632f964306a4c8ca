"""The store's gRPC API on a real loopback server: round trips, bad input, the id handshake."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import numpy as np
import pytest

from metricsd.model import make_labels, series_id
from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc.client import MetricsClient
from metricsd.rpc.server import start_grpc_server
from metricsd.rpc.wire import labels_to_pb, matchers_to_pb, values_matrix
from metricsd.selector import parse_selector
from metricsd.store.api import StoreServicer
from metricsd.store.engine import Store

LABELS = [make_labels("cpu", {"namespace": "ns", "pod": f"p{i}", "workload": "web" if i < 3 else "db"})
          for i in range(5)]
IDS = [series_id(lab) for lab in LABELS]


@pytest.fixture
async def client() -> AsyncIterator[tuple[MetricsClient, Store]]:
    store = Store()
    server, port = await start_grpc_server(StoreServicer(store), "127.0.0.1", 0)
    c = MetricsClient(f"127.0.0.1:{port}")
    yield c, store
    await c.close()
    await server.stop(None)


def _batch(t0: int, n: int, with_labels: bool = True) -> pb.WriteRequest:
    req = pb.WriteRequest(ids=IDS, counts=[n] * len(IDS))
    for i in range(len(IDS)):
        req.timestamps.extend(range(t0, t0 + n * 10_000, 10_000))
        req.values.extend(float(i * 100 + k) for k in range(n))
    if with_labels:
        for sid, lab in zip(IDS, LABELS, strict=True):
            req.series.add(id=sid).labels.extend(labels_to_pb(lab))
    return req


async def test_write_then_read_and_aggregate(client: tuple[MetricsClient, Store]) -> None:
    c, _ = client
    resp = await c.write(_batch(0, 30))
    assert resp.samples_written == 150 and not resp.unknown_ids
    read = await c.read(pb.ReadRequest(matchers=matchers_to_pb(parse_selector('pod="p1"', "cpu")), start_ms=0,
                                       end_ms=50_000))
    assert [list(s.timestamps) for s in read.series] == [[0, 10_000, 20_000, 30_000, 40_000, 50_000]]
    assert list(read.series[0].values) == [100.0, 101.0, 102.0, 103.0, 104.0, 105.0]
    req = pb.AggregateRequest(across=pb.ACROSS_SUM, group_by=["workload"], start_ms=290_000, end_ms=290_000)
    req.query.matchers.extend(matchers_to_pb(parse_selector("", "cpu")))
    req.query.series_fn = pb.SERIES_RATE
    req.query.window_ms = 60_000
    agg = await c.aggregate(req)
    groups = [{lab.name: lab.value for lab in g.labels} for g in agg.groups]
    assert groups == [{"workload": "db"}, {"workload": "web"}]
    np.testing.assert_allclose(values_matrix(agg)[:, 0], [0.2, 0.3])  # 2 and 3 series at 0.1/s
    assert list(agg.numerator.count) == [2.0, 3.0]


async def test_unknown_ids_are_reported_and_the_client_resends_labels(client: tuple[MetricsClient, Store]) -> None:
    c, store = client
    bare = _batch(0, 2, with_labels=False)
    resp = await c.stub.Write(bare)
    assert sorted(resp.unknown_ids) == sorted(IDS) and resp.samples_written == 0
    assert store.stats()["samples"] == 0
    resp = await c.write(bare, {sid: labels_to_pb(lab) for sid, lab in zip(IDS, LABELS, strict=True)})
    assert resp.samples_written == 10


async def test_retried_batch_is_idempotent(client: tuple[MetricsClient, Store]) -> None:
    c, _ = client
    await c.write(_batch(0, 5))
    again = await c.write(_batch(0, 5))
    assert again.samples_written == 0 and again.rejected_duplicate == 25
    st = await c.stats()
    assert st.samples == 25 and st.rejected["duplicate"] == 25


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda r: r.series[1].labels.add(name="bad-label", value="x"), "bad-label"),
        (lambda r: r.counts.__setitem__(0, 99), "counts add up to"),
        (lambda r: r.values.append(1.0), "timestamps but"),
        (lambda r: r.timestamps.__setitem__(1, 0), "strictly increase"),
        (lambda r: r.timestamps.__setitem__(0, 10**17), "out of range"),
    ],
    ids=["bad label name", "counts mismatch", "values mismatch", "non-increasing", "time out of range"],
)
async def test_bad_write_is_invalid_argument_and_stores_nothing(client: tuple[MetricsClient, Store], mutate: object,
                                                                 message: str) -> None:
    c, store = client
    req = _batch(0, 3)
    mutate(req)  # type: ignore[operator]
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await c.stub.Write(req)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in (err.value.details() or "")
    assert store.stats()["series"] == 0 and store.stats()["samples"] == 0


async def test_bad_selector_and_aggregate_are_invalid_argument(client: tuple[MetricsClient, Store]) -> None:
    c, _ = client
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await c.read(pb.ReadRequest(matchers=[pb.Matcher(type=pb.Matcher.RE, name="pod", value="(")]))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "regular expression" in (err.value.details() or "")
    req = pb.AggregateRequest(across=pb.ACROSS_AVG, start_ms=0, end_ms=0)
    req.query.matchers.extend(matchers_to_pb(parse_selector("", "cpu")))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await c.aggregate(req)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "series_fn" in (err.value.details() or "")
    req.query.series_fn = pb.SERIES_AVG
    req.query.window_ms = 1000
    req.end_ms, req.step_ms = 10**9, 1
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await c.aggregate(req)
    assert "evaluation times exceed" in (err.value.details() or "")
    req.end_ms, req.step_ms = 10_000, 1_000
    req.top_k = req.bottom_k = 2
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await c.aggregate(req)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "top_k and bottom_k cannot both be set" in (err.value.details() or "")


async def test_list_series_label_values_rollups_health_stats(client: tuple[MetricsClient, Store]) -> None:
    c, _ = client
    await c.write(_batch(3_500_000, 30))
    ls = await c.stub.ListSeries(pb.ListSeriesRequest(matchers=matchers_to_pb(parse_selector('workload="web"'))))
    assert sorted(s.id for s in ls.series) == sorted(IDS[:3])
    lv = await c.stub.LabelValues(pb.LabelValuesRequest(name="workload"))
    assert list(lv.values) == ["db", "web"]
    ro = await c.stub.Rollups(pb.ReadRequest(matchers=matchers_to_pb(parse_selector('pod="p0"')), start_ms=0,
                                             end_ms=10**10))
    (s,) = ro.series
    # samples at 3,500,000 .. 3,790,000: 10 in hour 0 (0..9), 20 in hour 1 (10..29)
    assert list(s.hours) == [0, 3_600_000]
    assert list(s.count) == [10.0, 20.0] and list(s.max) == [9.0, 29.0] and list(s.min) == [0.0, 10.0]
    assert list(s.sum) == [45.0, float(sum(range(10, 30)))] and list(s.last) == [9.0, 29.0]
    h = await c.health()
    assert h.status == pb.HealthResponse.SERVING
    st = await c.stats()
    assert st.series == 5 and st.samples == 150 and st.pods == 5
