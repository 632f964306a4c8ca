"""Remote write never answers success for a sample it did not store: the valid samples of a request
are stored and the answer is 400 naming how many were refused and why, as Prometheus answers a
too-old, out-of-order or too-far-ahead sample; 2.0 still says how many were written. A real store
on its own clock behind a real HTTP server; refusals counted per sender in /metrics."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import cramjam
import pytest
from http_fixtures import with_write_path
from prometheus_client import CollectorRegistry
from test_http_remote_write import HEADERS, _payload
from test_http_remote_write_v2 import HEADERS as V2_HEADERS
from test_http_remote_write_v2 import encode as encode_v2

from metricsd.clock import ManualClock
from metricsd.http import HttpSettings, build_app, start_http, stop_http
from metricsd.store.api import LocalBackend, StoreAPI
from metricsd.store.engine import Store

# Every test on both remote-write paths: the hot path and aiohttp's route (tests/http/conftest.py).
pytestmark = pytest.mark.usefixtures("write_path")

NOW = 1_750_000_000_000  # 2025-06-15T15:06:40Z
DAY = 86_400_000
POD = {"__name__": "container_memory_working_set_bytes", "namespace": "shop", "pod": "cart-1"}
OTHER = {**POD, "pod": "cart-2"}


class Env:
    def __init__(self, url: str, store: Store, clock: ManualClock, session: aiohttp.ClientSession) -> None:
        self.url, self.store, self.clock, self.session = url, store, clock, session

    async def post(self, series: list[tuple[dict[str, str], list[tuple[int, float]]]], v2: bool = False
                   ) -> tuple[int, Any, Any]:
        body = bytes(cramjam.snappy.compress_raw(encode_v2(series))) if v2 else _payload(series)
        async with self.session.post(self.url + "/api/v1/write", data=body, headers=V2_HEADERS if v2 else HEADERS
                                     ) as r:
            return r.status, r.headers, (await r.json() if r.status != 204 else None)

    async def query(self, q: str, t_ms: int) -> list[tuple[str, str]]:
        params = {"query": q, "time": str(t_ms / 1000)}
        async with self.session.get(self.url + "/api/v1/query", params=params) as r:
            assert r.status == 200
            return sorted((x["metric"]["pod"], x["value"][1]) for x in (await r.json())["data"]["result"])

    async def metrics(self) -> str:
        async with self.session.get(self.url + "/metrics") as r:
            return await r.text()


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    store, clock = Store(), ManualClock(NOW)
    app = build_app(LocalBackend(StoreAPI(store, clock=clock)),
                    settings=with_write_path(HttpSettings(access_log=False)), registry=CollectorRegistry(), clock=clock)
    runner, port = await start_http(app, "127.0.0.1", 0)
    session = aiohttp.ClientSession()
    try:
        yield Env(f"http://127.0.0.1:{port}", store, clock, session)
    finally:
        await session.close()
        await stop_http(runner)


async def test_a_sample_a_day_ahead_is_a_400_and_the_valid_samples_of_the_request_are_stored(env: Env) -> None:
    status, _, body = await env.post([(POD, [(NOW - 1000, 1.0), (NOW + DAY, 9.0)]), (OTHER, [(NOW, 2.0)])])
    assert status == 400 and body["errorType"] == "bad_data"
    assert body["error"].startswith("1 of 3 samples not stored, 2 stored; samples refused: 1 too far ahead: more "
                                    "than 10m after the store's clock (2025-06-15T15:06:40Z), e.g. "), body
    assert 'pod="cart-1"} at 2025-06-16T15:06:40Z' in body["error"]
    assert await env.query("container_memory_working_set_bytes", NOW) == [("cart-1", "1"), ("cart-2", "2")]
    # The series is not dark: real-time samples after the refused one are stored (204).
    env.clock.advance(15_000)
    status, _, _ = await env.post([(POD, [(NOW + 15_000, 3.0)])])
    assert status == 204
    assert await env.query('container_memory_working_set_bytes{pod="cart-1"}', NOW + 15_000) == [("cart-1", "3")]
    text = await env.metrics()
    assert 'metricsd_remote_write_refused_samples_total{reason="too_far_ahead",sender="127.0.0.1"} 1.0' in text
    assert 'metricsd_samples_rejected_total{reason="too_far_ahead"} 1.0' in text


async def test_samples_from_1970_and_2100_and_too_old_for_their_series_are_each_a_400(env: Env) -> None:
    assert (await env.post([(POD, [(NOW, 1.0)])]))[0] == 204
    status, _, body = await env.post([(OTHER, [(0, 1.0)])])  # 1970
    assert status == 400 and "1 of 1 samples not stored, 0 stored; samples refused: 1 too old: before" in body["error"]
    status, _, body = await env.post([(OTHER, [(4_102_444_800_000, 1.0)])])  # 2100
    assert status == 400 and "1 too far ahead" in body["error"]
    status, _, body = await env.post([(POD, [(NOW - 2 * 3600_000, 1.0), (NOW + 1000, 2.0)])])  # out of order
    assert status == 400 and body["error"] == (
        "1 of 2 samples not stored, 1 stored; samples refused: 1 too old for their series: older than its newest "
        "sample by more than the out-of-order window (1h)")
    assert env.store.stats()["series"] == 1  # cart-2 never created
    status, _, _ = await env.post([(POD, [(NOW, 1.0), (NOW + 1000, 2.0)])])  # a resend of stored samples
    assert status == 204


async def test_remote_write_2_answers_400_with_the_samples_written(env: Env) -> None:
    status, headers, body = await env.post([(POD, [(NOW, 1.0), (NOW + DAY, 2.0)]), (OTHER, [(NOW, 3.0)])], v2=True)
    assert status == 400 and body["error"].startswith("1 of 3 samples not stored, 2 stored; ")
    assert headers["X-Prometheus-Remote-Write-Samples-Written"] == "2"
    assert await env.query("container_memory_working_set_bytes", NOW) == [("cart-1", "1"), ("cart-2", "3")]
