"""Write limits through remote write on a real aiohttp server: 400 / 429 / 413 with the message,
nothing stored, /metrics counting the refusals by reason, other requests answered meanwhile."""

from __future__ import annotations

import io
from typing import Any

import cramjam
import pytest
from http_fixtures import Env, start_env

from metricsd.http import HttpSettings, stop_http
from metricsd.proto import prometheus_remote_pb2 as prom
from metricsd.rpc.limits import RequestLimits
from metricsd.store.limits import SeriesLimits
from metricsd.store.settings import StoreSettings

# Every test on both remote-write paths: the hot path and aiohttp's route (tests/http/conftest.py).
pytestmark = pytest.mark.usefixtures("write_path")

HEADERS = {"Content-Encoding": "snappy", "Content-Type": "application/x-protobuf"}


def _body(pods: range, ns: str = "shop", t: int = 1000, **extra: str) -> bytes:
    req = prom.WriteRequest()
    for i in pods:
        ts = req.timeseries.add()
        for k, v in sorted({"__name__": "cpu", "namespace": ns, "pod": f"p{i}", **extra}.items()):
            ts.labels.add(name=k, value=v)
        ts.samples.add(timestamp=t, value=1.0)
    return bytes(cramjam.snappy.compress_raw(req.SerializeToString()))


async def _post(env: Env, body: bytes) -> tuple[int, Any]:
    async with env.session.post(env.url + "/api/v1/write", data=io.BytesIO(body), headers=HEADERS) as r:
        return r.status, (await r.json() if r.status != 204 else None)


async def _refused(env: Env, body: bytes, status: int, message: str) -> None:
    before = env.stats()
    got, err = await _post(env, body)
    assert got == status, err
    assert message in err["error"]
    assert env.stats() == before
    async with env.session.get(env.url + "/api/v1/metricsd/stats") as r:
        assert r.status == 200  # other requests are answered


async def test_write_limits_over_remote_write() -> None:
    env = await start_env(HttpSettings(access_log=False, request_limits=RequestLimits(max_series=4, max_samples=8)),
                          StoreSettings(series_limits=SeriesLimits(max_series=3)))
    try:
        assert (await _post(env, _body(range(2))))[0] == 204
        await _refused(env, _body(range(5)), 400, "write request has 5 series, more than the limit of 4")
        await _refused(env, _body(range(2, 4), v="x" * 1025), 400,
                       "value of label v is 1025 bytes, more than the limit of 1024 bytes")
        await _refused(env, _body(range(4)), 429, "series limit reached: the store holds 2 series and the limit "
                                                  "is 3 (--max-series); this write would create 2 new series")
        assert (await _post(env, _body(range(2), t=2000)))[0] == 204  # existing series: accepted
        assert (await _post(env, _body(range(3), t=3000)))[0] == 204  # one new: up to the limit
        async with env.session.get(env.url + "/metrics") as r:
            text = await r.text()
        # refused when its series were counted, before its samples were read: none counted
        assert 'metricsd_samples_rejected_total{reason="request_series"} 0.0' in text
        assert 'metricsd_samples_rejected_total{reason="series_limit"} 4.0' in text
        assert 'metricsd_store_rejected_samples{reason="series_limit"} 4.0' in text
        assert 'metricsd_store_rejected_samples{reason="label_value_length"} 2.0' in text
    finally:
        await env.session.close()
        await stop_http(env.runner)  # type: ignore[arg-type]


async def test_a_snappy_bomb_is_refused_from_its_header_before_it_is_inflated() -> None:
    """A real bomb: 129 MiB of zeros compress to about 6 MiB, under the 32 MiB body limit; the block
    header declares the size, and the receiver refuses it (413) without decompressing."""
    env = await start_env()
    try:
        body = bytes(cramjam.snappy.compress_raw(bytes(129 * 2**20)))
        assert len(body) < HttpSettings().client_max_size
        await _refused(env, body, 413, f"body decompresses to {129 * 2**20} bytes, more than the limit of "
                                       f"{128 * 2**20}")
    finally:
        await env.session.close()
        await stop_http(env.runner)  # type: ignore[arg-type]
