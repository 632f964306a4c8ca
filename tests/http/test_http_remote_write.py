"""Prometheus remote write 1.0 into a real store, and every way a body can be wrong."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
import textwrap
from typing import Any

import cramjam
import pytest
from http_fixtures import Env, start_env

from metricsd.http import HttpSettings, stop_http
from metricsd.proto import prometheus_remote_pb2 as prom

# Every test on both remote-write paths: the hot path and aiohttp's route (tests/http/conftest.py).
pytestmark = pytest.mark.usefixtures("write_path")

HEADERS = {"Content-Encoding": "snappy", "Content-Type": "application/x-protobuf",
           "X-Prometheus-Remote-Write-Version": "0.1.0"}


def _payload(series: list[tuple[dict[str, str], list[tuple[int, float]]]]) -> bytes:
    req = prom.WriteRequest()
    for labels, samples in series:
        ts = req.timeseries.add()
        for k, v in sorted(labels.items()):
            ts.labels.add(name=k, value=v)
        for t, x in samples:
            ts.samples.add(timestamp=t, value=x)
    return bytes(cramjam.snappy.compress_raw(req.SerializeToString()))


async def _post(env: Env, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    async with env.session.post(env.url + "/api/v1/write", data=body, headers=headers or HEADERS) as r:
        return r.status, (await r.json() if r.status != 204 else None)


async def _query_range(env: Env, query: str, start: int, end: int, step: int) -> Any:
    params = {"query": query, "start": str(start), "end": str(end), "step": str(step)}
    async with env.session.get(env.url + "/api/v1/query_range", params=params) as r:
        assert r.status == 200
        return (await r.json())["data"]["result"]


POD = {"__name__": "container_memory_working_set_bytes", "namespace": "shop", "pod": "cart-1", "container": "app"}


async def test_remote_write_round_trips_through_query_range(env: Env) -> None:
    samples = [(t * 1000, float(t * 10)) for t in range(0, 601, 15)]
    # The same series split over two entries, out of order: merged and sorted.
    status, _ = await _post(env, _payload([(POD, samples[20:]), (POD, samples[:20])]))
    assert status == 204
    result = await _query_range(env, 'container_memory_working_set_bytes{pod="cart-1"}', 0, 600, 60)
    assert result == [{"metric": POD, "values": [[t, str(t * 10)] for t in range(0, 601, 60)]}]
    assert env.stats()["samples"] == len(samples)
    async with env.session.get(env.url + "/metrics") as r:
        text = await r.text()
    assert f'metricsd_samples_ingested_total{{path="remote_write"}} {float(len(samples))}' in text


async def test_series_without_pod_labels_are_refused_by_name_when_no_fallback_is_set() -> None:
    env = await start_env(HttpSettings(default_namespace=None, pod_labels=(), access_log=False))
    try:
        ok = (POD, [(1000, 1.0)])
        bad = ({"__name__": "up", "job": "node", "instance": "10.0.0.1:9100"}, [(1000, 1.0)])
        status, body = await _post(env, _payload([ok, bad]))
        assert status == 400
        assert body["errorType"] == "bad_data"
        assert 'up{instance="10.0.0.1:9100",job="node"}' in body["error"]
        assert "namespace/pod" in body["error"] and "default namespace: none; pod from labels: none" in body["error"]
        assert env.stats()["series"] == 0
        async with env.session.get(env.url + "/metrics") as r:
            assert 'metricsd_remote_write_refused_series_total{rule="fallback"} 1.0' in await r.text()
    finally:
        await env.session.close()
        await stop_http(env.runner)  # type: ignore[arg-type]


async def test_series_without_namespace_and_pod_get_the_cluster_level_key_by_default(env: Env) -> None:
    up = {"__name__": "up", "job": "prometheus", "instance": "localhost:9090"}
    only_job = {"__name__": "prometheus_build_info", "job": "prometheus", "version": "2.42.0"}
    status, _ = await _post(env, _payload([(up, [(1000, 1.0)]), (only_job, [(1000, 1.0)])]))
    assert status == 204
    result = await _query_range(env, '{namespace="_cluster"}', 0, 60, 60)
    assert sorted((r["metric"] for r in result), key=lambda m: m["__name__"]) == [
        {**only_job, "namespace": "_cluster", "pod": "prometheus"},
        {**up, "namespace": "_cluster", "pod": "localhost:9090"},
    ]


async def test_configured_defaults_fill_in_namespace_and_pod() -> None:
    env = await start_env(HttpSettings(default_namespace="scraped", pod_labels=("instance",), access_log=False))
    try:
        status, _ = await _post(env, _payload([({"__name__": "up", "instance": "node-a:9100"}, [(1000, 1.0)])]))
        assert status == 204
        result = await _query_range(env, "up", 0, 60, 60)
        assert result[0]["metric"] == {"__name__": "up", "instance": "node-a:9100", "namespace": "scraped",
                                       "pod": "node-a:9100"}
    finally:
        await env.session.close()
        await stop_http(env.runner)  # type: ignore[arg-type]


def _framed(data: bytes) -> bytes:
    return bytes(cramjam.snappy.compress(data))


@pytest.mark.parametrize(
    ("body", "headers", "status", "message"),
    [
        (b"", None, 400, "empty body"),
        (b"\x0anot snappy at all", None, 400, "snappy"),
        (_framed(prom.WriteRequest().SerializeToString() + b"x"), None, 400, "snappy"),
        (bytes(cramjam.snappy.compress_raw(b"\x0a\xff\xff\xff\x0f")), None, 400, "protobuf"),
        (bytes(cramjam.snappy.compress_raw(b"\x08\x01\x12garbage")), None, 400, "protobuf"),
        (b"\xff\xff\xff\xff\x0f" + b"\x00" * 10, None, 413, "decompresses to 4294967295 bytes"),
        (_payload([(POD, [(1000, 1.0)])]), {**HEADERS, "Content-Encoding": "identity"}, 400, "Content-Encoding"),
        (_payload([(POD, [(1000, 1.0)])]),
         {**HEADERS, "Content-Type": "application/x-protobuf;proto=io.prometheus.write.v3.Request"}, 415,
         "remote write 1.0 (prometheus.WriteRequest) and 2.0"),
        (_payload([(POD, [(1000, 1.0)])]),
         {**HEADERS, "Content-Type": "application/x-protobuf;proto=io.prometheus.write.v2.Request"}, 400,
         "a 1.0 prometheus.WriteRequest sent as 2.0"),
        (_payload([({**POD, "bad-name": "x"}, [(1000, 1.0)])]), None, 400, "bad-name"),
        (_payload([(POD, [(1000, 1.0)]), ({**POD, "pod": "p2"}, [(-(2**63), 1.0)])]), None, 400, "out of range"),
    ],
)
async def test_bad_bodies_are_4xx_and_store_nothing(env: Env, body: bytes, headers: dict[str, str] | None,
                                                    status: int, message: str) -> None:
    got, err = await _post(env, body, headers)
    assert got == status, err
    assert message in err["error"]
    assert env.stats()["series"] == 0 and env.stats()["samples"] == 0


async def test_oversized_body_is_413_and_stores_nothing() -> None:
    env = await start_env(HttpSettings(client_max_size=4096, access_log=False))
    try:
        big = _payload([({**POD, "pod": f"p{i * 7919 % 10007:x}{i ** 3:x}"}, [(1000 + i, i / 7)]) for i in range(400)])
        assert len(big) > 4096
        status, body = await _post(env, big)
        assert status == 413
        assert body["errorType"] == "too_large"
        assert env.stats()["series"] == 0
    finally:
        await env.session.close()
        await stop_http(env.runner)  # type: ignore[arg-type]


_CLIENT = textwrap.dedent("""
    import sys
    from prometheus_remote_writer import RemoteWriter

    writer = RemoteWriter(url=sys.argv[1], retries=0, auto_convert_seconds_to_ms=False)
    res = writer.send([
        {"metric": {"__name__": "queue_depth", "namespace": "jobs", "pod": "worker-0"},
         "values": [3, 5, 8], "timestamps": [60000, 120000, 180000]},
        {"metric": {"__name__": "queue_depth", "namespace": "jobs", "pod": "worker-1"},
         "values": [1, 1, 2], "timestamps": [60000, 120000, 180000]},
    ])
    print(res.last_response.status_code)
""")


@pytest.mark.skipif(importlib.util.find_spec("prometheus_remote_writer") is None,
                    reason="the prometheus-remote-writer client library is not installed")
async def test_a_real_client_librarys_payload_round_trips(env: Env) -> None:
    # Another process: the library registers its own prometheus.* protobuf types in the default pool.
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _CLIENT, env.url + "/api/v1/write",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    assert out.decode().strip() == "204"
    result = await _query_range(env, "sum by (pod) (queue_depth)", 60, 180, 60)
    assert result == [
        {"metric": {"pod": "worker-0"}, "values": [[60, "3"], [120, "5"], [180, "8"]]},
        {"metric": {"pod": "worker-1"}, "values": [[60, "1"], [120, "1"], [180, "2"]]},
    ]
