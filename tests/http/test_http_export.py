"""/api/v1/export and /api/v1/import over a real store and a real aiohttp server: VictoriaMetrics'
JSON lines, an export imported back bit for bit, bad bodies refused whole with nothing stored,
the body limits, and reads a few pods at a time."""

from __future__ import annotations

import gzip
import io
import json
import math
import ssl
import struct
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import numpy as np
import pytest
from http_fixtures import Env, pod_labels, running_env, start_env
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from metricsd.clock import SystemClock
from metricsd.http import HttpSettings, stop_http
from metricsd.http.export import read_batches
from metricsd.http.server import serve_http
from metricsd.http.vmjson import format_line, parse_line
from metricsd.model import STALE_NAN_BITS, stale_marker
from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc.wire import labels_from_pb
from metricsd.security.auth import Authenticator
from metricsd.security.certs import LocalPKI
from metricsd.security.policy import http_role
from metricsd.security.settings import ServerSecurity
from metricsd.security.tls import ServerTLS
from metricsd.security.tokens import Role, TokenFile, hash_token
from metricsd.store.api import LocalBackend, StoreAPI
from metricsd.store.engine import Store


@pytest.fixture
async def other() -> AsyncIterator[Env]:
    async with running_env() as e:
        yield e


async def _export(env: Env, match: str = '{__name__=~".+"}', **params: str) -> bytes:
    async with env.session.get(env.url + "/api/v1/export", params={"match[]": match, **params}) as r:
        assert r.status == 200, await r.text()
        return await r.read()


async def _import(env: Env, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, str]:
    async with env.session.post(env.url + "/api/v1/import", data=body, headers=headers) as r:
        return r.status, await r.text()


def _read_all(env: Env) -> dict[tuple[tuple[str, str], ...], tuple[list[int], bytes]]:
    resp = env.backend.api.read(pb.ReadRequest(matchers=[pb.Matcher(type=pb.Matcher.RE, name="__name__", value=".+")],
                                               start_ms=-(2**62), end_ms=2**62))
    return {labels_from_pb(s.labels): (list(s.timestamps), np.array(s.values).tobytes()) for s in resp.series}


def test_a_line_is_written_as_victoria_metrics_writes_it() -> None:
    labels = pod_labels("up", "p-1", job="node")
    ts = np.array([1549891472010, 1549891487724, 1549891503438, 1549891519152, 1549891534866], np.int64)
    vals = np.array([1.0, 0.25, math.inf, float("nan"), stale_marker()])
    assert format_line(labels, ts, vals) == (
        b'{"metric":{"__name__":"up","job":"node","namespace":"default","pod":"p-1"},'
        b'"values":[1,0.25,"Infinity","NaN",null],'
        b'"timestamps":[1549891472010,1549891487724,1549891503438,1549891519152,1549891534866]}\n')
    # As Go's strconv 'f' format with the shortest digits: never an exponent.
    assert b'"values":[0.0000001,150000000000000000000]' in format_line(labels, ts[:2], np.array([1e-7, 1.5e20]))


values = st.one_of(st.floats(allow_nan=False), st.just(math.nan), st.just(stale_marker()), st.just(1e300),
                   st.just(5e-324), st.just(-0.0), st.integers(-(2**53), 2**53).map(float),
                   st.builds(lambda m, e: m * 2.0**e, st.integers(2**50, 2**53), st.integers(-80, 20)))


@settings(max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(st.lists(values, min_size=1, max_size=30))
async def test_an_export_imported_back_is_the_same_bit_for_bit(vals: list[float]) -> None:
    a, b = await start_env(), await start_env()
    try:
        series = {pod_labels("m", f"p{i}"): (list(range(1000, 1000 + 10 * len(vals), 10)), vals) for i in range(3)}
        await a.write(series)
        body = await _export(a)
        assert body.count(b"\n") == 3
        status, text = await _import(b, body)
        assert status == 204, text
        assert _read_all(b) == _read_all(a)
        assert await _export(b) == body
        line = parse_line(body.splitlines()[0], 1)
        assert line is not None
        stale = [struct.unpack("<Q", struct.pack("<d", v))[0] == STALE_NAN_BITS for v in line.values.tolist()]
        assert stale == [struct.unpack("<Q", struct.pack("<d", v))[0] == STALE_NAN_BITS for v in vals]
    finally:
        for e in (a, b):
            await e.close()


async def test_export_selects_by_match_start_and_end_and_exports_a_series_once(env: Env) -> None:
    await env.write({pod_labels("cpu", "a"): ([1000, 2000, 3000], [1, 2, 3]),
                     pod_labels("mem", "a"): ([1000, 2000], [5, 6])})
    async with env.session.get(env.url + "/api/v1/export",
                               params=[("match[]", "cpu"), ("match[]", '{pod="a"}'), ("start", "1.5"),
                                       ("end", "3")]) as r:
        assert r.status == 200 and r.content_type == "application/stream+json"
        lines = [json.loads(x) for x in (await r.read()).splitlines()]
    assert sorted((x["metric"]["__name__"], x["timestamps"]) for x in lines) == [
        ("cpu", [2000, 3000]), ("mem", [2000])]


@pytest.mark.parametrize(("params", "message"), [
    ({}, "at least one series selector"),
    ({"match[]": "rate(x[1m])"}, "is not a series selector"),
    ({"match[]": "x", "start": "yesterday"}, 'invalid parameter "start"'),
    ({"match[]": "x", "start": "10", "end": "5"}, "end timestamp must not be before"),
])
async def test_a_bad_export_request_is_a_400_naming_the_parameter(env: Env, params: dict[str, str],
                                                                  message: str) -> None:
    async with env.session.get(env.url + "/api/v1/export", params=params) as r:
        assert r.status == 400
        assert message in (await r.json())["error"]


@pytest.mark.parametrize(("body", "message"), [
    (b'{"metric":{"__name__":"m","namespace":"n","pod":"p"},"values":[1],"timestamps":[1]}\nnot json\n',
     "line 2: not JSON"),
    (b'{"metric":{"__name__":"m","pod":"p"},"values":[1,2],"timestamps":[1]}', "array size must match"),
    (b'{"metric":{},"values":[1],"timestamps":[1]}', "missing `metric`"),
    (b'{"metric":{"__name__":"m","namespace":"n","pod":"p"},"values":["x"],"timestamps":[1]}', "value 1 is 'x'"),
    (b'{"metric":{"__name__":"m","namespace":"n","pod":"p"},"values":[1],"timestamps":[1.5]}',
     "timestamp 1 is 1.5"),
    (b'{"metric":{"__name__":"m","namespace":"n","pod":"p","a-b":"x"},"values":[1],"timestamps":[1]}',
     "label name 'a-b'"),
    (b'[' * 100_000, "line 1: not JSON"),
])
async def test_a_bad_import_is_a_400_naming_the_line_and_stores_nothing(env: Env, body: bytes, message: str) -> None:
    status, text = await _import(env, body)
    assert status == 400, text
    assert message in json.loads(text)["error"]
    assert env.stats()["samples"] == 0


async def test_import_takes_gzip_and_keys_series_as_remote_write_does(env: Env) -> None:
    body = b'{"metric":{"__name__":"up","instance":"host:9100"},"values":[1,1],"timestamps":[2000,1000]}\n' \
           b'{"metric":{"__name__":"up","instance":"host:9100"},"values":[0],"timestamps":[3000]}\n'
    status, text = await _import(env, gzip.compress(body), {"Content-Encoding": "gzip"})
    assert status == 204, text
    (got,) = [json.loads(x) for x in (await _export(env, "up")).splitlines()]
    assert got["metric"] == {"__name__": "up", "instance": "host:9100", "namespace": "_cluster", "pod": "host:9100"}
    assert got["timestamps"] == [1000, 2000, 3000] and got["values"] == [1, 1, 0]


async def test_import_bodies_past_the_limits_are_413() -> None:
    env = await start_env(HttpSettings(access_log=False, client_max_size=1 << 20))
    try:
        async with env.session.post(env.url + "/api/v1/import", data=io.BytesIO(b" " * (2 << 20))) as r:
            assert r.status == 413
        bomb = gzip.compress(b" " * (64 << 20))  # 64 KiB that inflate to 64 MiB
        async with env.session.post(env.url + "/api/v1/import", data=io.BytesIO(bomb),
                                    headers={"Content-Encoding": "gzip"}) as r:
            assert r.status == 413 and "larger than the limit" in await r.text()
        assert env.stats()["samples"] == 0
    finally:
        await env.session.close()
        await stop_http(env.runner)  # type: ignore[arg-type]


def test_import_needs_the_write_role_and_export_the_read_role() -> None:
    assert http_role("POST", "/api/v1/import") is Role.WRITE
    assert http_role("GET", "/api/v1/export") is Role.READ


def test_reads_take_whole_pods_of_one_namespace_about_n_series_at_a_time() -> None:
    listed = [(i, pod_labels(f"m{i % 4}", f"p{i // 4}", namespace=f"ns{i // 40}")) for i in range(200)]
    groups = read_batches(listed, 10)
    assert [len(pods) for _, pods in groups] == [2] * 25  # 4 series a pod, whole pods: 8 series a read
    seen = sorted((ns, p) for ns, pods in groups for p in pods)
    assert seen == sorted({(dict(lab)["namespace"], dict(lab)["pod"]) for _, lab in listed})


async def test_export_and_import_over_tls_with_tokens_need_their_roles(pki: LocalPKI, tmp_path: Path) -> None:
    """The same 401 and 403 as every other route, on a real TLS server with a token file: import
    needs ``write`` (a read token is refused, nothing stored), export ``read``."""
    tokens = tmp_path / "tokens"
    tokens.write_text(f"graf read {hash_token('r')}\nagent write {hash_token('w')}\n")
    store = Store()
    runner, port = await serve_http(LocalBackend(StoreAPI(store)), "127.0.0.1", 0, CollectorRegistry(),
                                    SystemClock(), security=ServerSecurity(ServerTLS(pki.cert, pki.key),
                                                                           Authenticator(TokenFile(tokens))))
    url = f"https://127.0.0.1:{port}"
    line = b'{"metric":{"__name__":"m","namespace":"ns","pod":"p"},"values":[1.5],"timestamps":[60000]}\n'
    read, write = {"Authorization": "Bearer r"}, {"Authorization": "Bearer w"}
    try:
        async with aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=ssl.create_default_context(cafile=str(pki.ca)))) as s:
            for headers, status in (({}, 401), (read, 403)):
                async with s.post(url + "/api/v1/import", data=line, headers=headers) as r:
                    assert r.status == status
            assert store.stats()["samples"] == 0
            async with s.post(url + "/api/v1/import", data=line, headers=write) as r:
                assert r.status == 204
            for headers, status in (({}, 401), (write, 403)):
                async with s.get(url + "/api/v1/export", params={"match[]": "m"}, headers=headers) as r:
                    assert r.status == status
            async with s.get(url + "/api/v1/export", params={"match[]": "m"}, headers=read) as r:
                assert r.status == 200 and json.loads(await r.read())["values"] == [1.5]
    finally:
        await stop_http(runner)


async def test_an_export_is_not_cut_by_the_request_timeout() -> None:
    """An export streams for as long as it takes (an hour of 40,000 series took longer than the
    30 s request timeout, which cut the stream and left the client waiting on it). Megabytes
    written as the client reads them: the handler waits on the socket, where a 1 ms timeout
    would cut it (mutation-checked: with the timeout the client never gets the end)."""
    env = await start_env(HttpSettings(access_log=False, request_timeout_s=0.001))
    try:
        ts = list(range(1000, 201_000, 1000))  # 1,400 series of 200 samples: megabytes, written as the client reads
        await env.write({pod_labels("cpu", f"p{i}", namespace=f"ns{i % 7}"): (ts, [i + k / 7 for k in range(200)])
                         for i in range(1400)})
        async with env.session.get(env.url + "/api/v1/export", params={"match[]": "cpu"},
                                   timeout=aiohttp.ClientTimeout(total=30)) as r:  # cut: the stream never ends
            lines = (await r.read()).splitlines()
        assert len(lines) == 1400 and all(json.loads(x)["timestamps"] == ts for x in lines)
    finally:
        await env.session.close()
        await stop_http(env.runner)  # type: ignore[arg-type]
