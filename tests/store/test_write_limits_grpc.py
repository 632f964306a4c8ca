"""Every write limit over a real gRPC server on loopback: the exact status and message, nothing
stored (Stats before and after equal), and the server answering other requests meanwhile."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
import pytest

from metricsd.clock import ManualClock
from metricsd.model import Labels, make_labels, series_id
from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc.client import MetricsClient
from metricsd.rpc.limits import RequestLimits
from metricsd.rpc.server import GRPC_OPTIONS, start_grpc_server
from metricsd.rpc.servicer import MetricsServicer
from metricsd.rpc.wire import labels_to_pb
from metricsd.store.api import LocalBackend, StoreAPI
from metricsd.store.engine import Store
from metricsd.store.limits import SeriesLimits
from metricsd.store.settings import StoreSettings


@dataclass
class Env:
    client: MetricsClient
    store: Store
    clock: ManualClock
    port: int


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    store = Store(StoreSettings(series_limits=SeriesLimits(max_series=5, max_new_series_per_minute=3),
                                request_limits=RequestLimits(max_series=4, max_samples=8)))
    clock = ManualClock(0)
    server, port = await start_grpc_server(MetricsServicer(LocalBackend(StoreAPI(store, clock=clock))),
                                           "127.0.0.1", 0)
    client = MetricsClient(f"127.0.0.1:{port}")
    yield Env(client, store, clock, port)
    await client.close()
    await server.stop(None)


def _labels(i: int, ns: str = "shop", **extra: str) -> Labels:
    return make_labels("cpu", {"namespace": ns, "pod": f"p{i}", **extra})


def _request(labels: list[Labels], t: int = 1000, per_series: int = 1) -> pb.WriteRequest:
    req = pb.WriteRequest()
    for lab in labels:
        sid = series_id(lab)
        req.ids.append(sid)
        req.counts.append(per_series)
        req.timestamps.extend(range(t, t + per_series))
        req.values.extend([1.0] * per_series)
        req.series.add(id=sid).labels.extend(labels_to_pb(lab))
    return req


async def _refused(env: Env, req: pb.WriteRequest, code: grpc.StatusCode, message: str) -> None:
    """The write fails with ``code`` and ``message``, stores nothing, and the server still answers."""
    before = await env.client.stats()
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await env.client.write(req)
    assert e.value.code() == code
    assert message in (e.value.details() or "")
    after = await env.client.stats()
    assert (after.series, after.samples, after.pods) == (before.series, before.samples, before.pods)
    assert (await env.client.health()).status == pb.HealthResponse.SERVING
    ok = await env.client.write(_request([_labels(0)], t=int(after.samples) + 10_000))  # a known series
    assert ok.samples_written == 1


async def test_per_request_limits_are_invalid_argument(env: Env) -> None:
    await env.client.write(_request([_labels(0)]))
    await _refused(env, _request([_labels(i) for i in range(5)]), grpc.StatusCode.INVALID_ARGUMENT,
                   "write request has 5 series, more than the limit of 4 series per request")
    await _refused(env, _request([_labels(1)], per_series=9), grpc.StatusCode.INVALID_ARGUMENT,
                   "write request has 9 samples, more than the limit of 8 samples per request")
    st = await env.client.stats()
    assert st.rejected["request_series"] == 5 and st.rejected["request_samples"] == 9


@pytest.mark.parametrize(
    ("labels", "reason", "message"),
    [
        (_labels(1, v="x" * 1025), "label_value_length", "value of label v is 1025 bytes, more than the limit of 1024"),
        (_labels(1, **{"n" * 257: "1"}), "label_name_length", "is 257 bytes, more than the limit of 256 bytes"),
        (_labels(1, **{f"l{i}": "1" for i in range(31)}), "labels_per_series",
         "33 labels, more than the limit of 32 labels per series"),
    ],
)
async def test_label_limits_are_invalid_argument_naming_the_series(env: Env, labels: Labels, reason: str,
                                                                   message: str) -> None:
    await env.client.write(_request([_labels(0)]))
    await _refused(env, _request([_labels(2), labels]), grpc.StatusCode.INVALID_ARGUMENT, message)
    assert (await env.client.stats()).rejected[reason] == 2
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await env.client.write(_request([labels]))
    assert (e.value.details() or "").startswith("series cpu{")  # names the series


async def test_series_limit_is_resource_exhausted_and_existing_series_keep_being_written(env: Env) -> None:
    await env.client.write(_request([_labels(i) for i in range(3)]))
    env.clock.advance(60_000)
    await env.client.write(_request([_labels(i) for i in range(3, 5)]))  # 5 series: the limit
    await _refused(env, _request([_labels(0), _labels(5)], t=5000), grpc.StatusCode.RESOURCE_EXHAUSTED,
                   "series limit reached: the store holds 5 series and the limit is 5 (--max-series); this write "
                   'would create 1 new series, e.g. cpu{namespace="shop",pod="p5"}')
    resp = await env.client.write(_request([_labels(i) for i in range(4)], t=6000))
    assert resp.samples_written == 4
    assert (await env.client.stats()).rejected["series_limit"] == 2


async def test_new_series_rate_is_resource_exhausted_per_namespace(env: Env) -> None:
    await env.client.write(_request([_labels(i) for i in range(3)]))
    await _refused(env, _request([_labels(3)], t=2000), grpc.StatusCode.RESOURCE_EXHAUSTED,
                   "new-series rate limit: namespace 'shop' may create 3 new series per minute "
                   "(--max-new-series-per-minute); this write would create 1")
    assert (await env.client.write(_request([_labels(3, ns="other")]))).samples_written == 1
    env.clock.advance(20_000)  # a third of a minute: one more
    assert (await env.client.write(_request([_labels(3)], t=2000))).samples_written == 1
    assert (await env.client.stats()).rejected["new_series_rate"] == 1


async def test_a_message_over_64_mib_is_resource_exhausted_and_the_server_keeps_answering(env: Env) -> None:
    limit = dict(GRPC_OPTIONS)["grpc.max_receive_message_length"]
    assert limit == 64 * 1024 * 1024
    values = bytes(limit + 8)  # WriteRequest field 4 (values, packed doubles), just past the limit
    n, head = len(values), bytearray([0x22])
    while n >= 0x80:
        head.append((n & 0x7F) | 0x80)
        n >>= 7
    head.append(n)
    big = bytes(head) + values
    async with grpc.aio.insecure_channel(f"127.0.0.1:{env.port}",
                                         options=[("grpc.max_send_message_length", 2 * limit)]) as ch:
        write = ch.unary_unary("/metricsd.v1.Metrics/Write", request_serializer=lambda b: b,
                               response_deserializer=pb.WriteResponse.FromString)
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await write(big, timeout=30)
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "larger than max" in (e.value.details() or "")
    assert (await env.client.stats()).samples == 0
    assert (await env.client.write(_request([_labels(0)]))).samples_written == 1
