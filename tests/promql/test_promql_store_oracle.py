"""The engine over a real store (QueryRunner with LocalBackend: postings, the batch read, columns
all the way; and over a real gRPC store: the SeriesBatch wire) against the engine over
MemorySource, which selects series one by one with matches_all: random series with absent and
empty labels, stale markers and chunks, random matchers of every kind, queries of the shapes the
columnar path takes (range functions, aggregations by and without, scalar arithmetic and
comparisons) and some it hands to the general path."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator

import grpc
import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from promql_script_http import _request as _write

from metricsd.model import STALE_NAN_BITS, Labels
from metricsd.promql import Engine, MemorySource, PromQLError, to_prometheus_json
from metricsd.promql.queries import QueryRunner
from metricsd.proto import metricsd_pb2_grpc as pb_grpc
from metricsd.rpc.client import GrpcBackend
from metricsd.rpc.server import start_grpc_server
from metricsd.store.api import LocalBackend, StoreAPI, StoreServicer
from metricsd.store.engine import Store
from metricsd.store.settings import StoreSettings

STALE = np.array([STALE_NAN_BITS], dtype=np.uint64).view(np.float64)[0]
SETTINGS = StoreSettings(chunk_samples=8, head_keep=3, require_pod_labels=False)
VALUES = ["a", "b", "ab", "ns-1", "ns-10", "kube-x"]
T_END = 600_000

MATCHERS = st.sampled_from([
    "", 'ns="a"', 'ns!="a"', 'ns=~"a.*"', 'ns!~"ns-1.*"', 'c!=""', 'c=""', 'c=~".+"', 'c!~".+"', 'c!="b"',
    'absent!="7"', 'absent=""', 'ns=~"kube-.*|b"', 'c=~"(?i)A"', 'ns!~"a|b"',
])
QUERIES = st.sampled_from([
    "{sel}", "rate({sel}[2m])", "count_over_time({sel}[3m])", "sum_over_time({sel}[90s])",
    "count(count_over_time({sel}[30s]))", "sum by (ns) (rate({sel}[1m]))", "avg without (c) ({sel})",
    "max by (c) (max_over_time({sel}[5m]))", "count({sel} > 2)", "{sel} * 2 + 1", "2 - {sel}",
    "count({sel} >= bool 1)", "abs({sel} - 3)", "topk(2, {sel})", "stddev by (ns) ({sel})",
    "sum({sel}) / count({sel})", "last_over_time({sel}[10m])", "deriv({sel}[5m])",
])


@st.composite
def dataset(draw: st.DrawFn) -> list[tuple[Labels, np.ndarray, np.ndarray]]:
    out = []
    for i in range(draw(st.integers(1, 10))):
        d = {"__name__": draw(st.sampled_from(["m", "n"])), "ns": draw(st.sampled_from(VALUES)), "i": str(i)}
        if draw(st.booleans()):
            d["c"] = draw(st.sampled_from(["a", "b", "A"]))
        n = draw(st.integers(1, 40))
        ts = np.cumsum(np.array(draw(st.lists(st.integers(1, 40), min_size=n, max_size=n)), dtype=np.int64)) * 1000
        vals = np.array(draw(st.lists(st.integers(0, 50), min_size=n, max_size=n)), dtype=np.float64) / 4
        if draw(st.booleans()):
            vals[draw(st.integers(0, n - 1))] = STALE
        out.append((tuple(sorted(d.items())), ts, vals))
    return out


def _canonical(body: dict[str, object]) -> object:
    """Results in a comparable form: series sorted by labels, values to 1e-9 (summation order)."""
    if body.get("status") != "success":
        return ("error", body.get("errorType"))
    data = body["data"]
    assert isinstance(data, dict)
    res = data["result"]
    if data["resultType"] in ("scalar", "string"):
        return res
    rows = []
    for r in res:
        points = r.get("values") or [r["value"]]
        rows.append((tuple(sorted(r["metric"].items())), [(t, float(v)) for t, v in points]))
    return sorted(rows)


def _close(a: object, b: object) -> bool:
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    return a == b


@pytest.fixture
async def grpc_store() -> AsyncIterator[tuple[StoreAPI, GrpcBackend]]:
    api = StoreAPI(Store(SETTINGS))
    server, port = await start_grpc_server(StoreServicer(api.store), "127.0.0.1", 0)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    yield api, GrpcBackend(pb_grpc.MetricsStub(channel))
    await channel.close()
    await server.stop(None)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(dataset(), st.sampled_from(["m", '__name__=~"m|n"']), MATCHERS, QUERIES, st.booleans())
async def test_store_answers_as_the_memory_source(grpc_store: tuple[StoreAPI, GrpcBackend],
                                                  data: list[tuple[Labels, np.ndarray, np.ndarray]], name: str,
                                                  sel: str, query: str, ranged: bool) -> None:
    api, remote = grpc_store
    api.store.__init__(SETTINGS)  # type: ignore[misc]  # a fresh store behind the same server
    mem = MemorySource()
    for labels, ts, vals in data:
        mem.add(labels, ts, vals)
    api.write(_write(data))
    inner = ",".join(x for x in (sel, name if name != "m" else "") if x)
    expr = query.format(sel=("m" if name == "m" else "") + "{" + inner + "}")
    engine = Engine(mem)
    try:
        want = to_prometheus_json(engine.range(expr, 0, T_END, 30_000) if ranged else engine.instant(expr, T_END))
        want_body: dict[str, object] = {"status": "success", "data": want}
    except PromQLError as e:
        want_body = {"status": "error", "errorType": e.kind}
    event(f"oracle: {want_body['status']}")
    for backend in (LocalBackend(api), remote):
        runner = QueryRunner(backend, allow_pushdown=False)
        try:
            if ranged:
                got, _ = await runner.range(expr, 0, T_END, 30_000)
            else:
                got, _ = await runner.instant(expr, T_END)
            got_body: dict[str, object] = {"status": "success", "data": to_prometheus_json(got)}
        except PromQLError as e:
            got_body = {"status": "error", "errorType": e.kind}
        assert _close(_canonical(got_body), _canonical(want_body)), (expr, type(backend).__name__)
    await asyncio.sleep(0)
