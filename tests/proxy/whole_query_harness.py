"""The harness of the whole-query tests (tests/proxy/test_proxy_whole_query*.py): three real stores,
each with its slot-ownership check, gRPC server and read port answering QUERY frames
(metricsd/http/wholequery.py); a real ProxyBackend dialling them and its real HTTP API on
loopback. The ``harness`` fixture (conftest.py) yields one."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from prometheus_client import CollectorRegistry
from proxy_cluster import SLOTS, fast_settings, workload, write_request

from metricsd.clock import SystemClock
from metricsd.cluster.assign import assign
from metricsd.cluster.mapsource import StaticMapSource
from metricsd.cluster.shardmap import Member, ShardMap
from metricsd.http.server import build_app, start_http, stop_http
from metricsd.http.settings import HttpSettings
from metricsd.http.wholequery import QueryService
from metricsd.promql.limits import QueryLimits
from metricsd.proxy.backend import ProxyBackend
from metricsd.proxy.members import MemberClient
from metricsd.replica.ownership import OwnershipBackend, store_write_slots
from metricsd.rpc.readport import AdvertisedReadPort, ReadPortServer
from metricsd.rpc.server import start_grpc_server
from metricsd.rpc.servicer import MetricsServicer
from metricsd.rpc.wholequery import LIMIT_NAMES, RunnerSettings
from metricsd.store.api import LocalBackend, StoreAPI
from metricsd.store.engine import Store

T0 = 1_700_000_000_000
TIMES = [T0 + i * 15_000 for i in range(40)]  # 10 minutes
AT = str((T0 + 600_000) / 1000)

# Instant and range queries: pushed-down aggregations, the engine, topk across pods, every slot.
QUERIES = [
    "sum(rate(container_cpu_usage_seconds_total[5m]))",
    "sum by (namespace) (rate(container_cpu_usage_seconds_total[5m]))",
    "topk(3, rate(container_cpu_usage_seconds_total[5m]))",
    'rate(container_cpu_usage_seconds_total{namespace="ns1", pod="pod-4"}[5m])',
    "sum(rate(container_cpu_usage_seconds_total[5m])) / sum(kube_pod_container_resource_requests)",
    "count(kube_pod_container_resource_requests)",
    "1",
]


@dataclass
class Node:
    member: str
    store: Store = field(default_factory=Store)
    maps: StaticMapSource | None = None
    answers_queries: bool = True
    service: QueryService | None = None
    port: int = 0
    servers: list[Any] = field(default_factory=list)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


@dataclass
class Harness:
    nodes: dict[str, Node]
    proxy: ProxyBackend
    proxy_maps: StaticMapSource
    url: str
    http: aiohttp.ClientSession

    async def get(self, path: str, **params: str) -> tuple[int, Any]:
        async with self.http.get(self.url + path, params=params) as r:
            return r.status, await r.json()

    def counter(self, name: str) -> int:
        return int(self.proxy.counters[name])


async def _start_node(node: Node) -> None:
    """As metricsd/cmd/store.py wires a cluster member (ownership check, read port, gRPC)."""
    assert node.maps is not None
    backend = OwnershipBackend(LocalBackend(StoreAPI(node.store, node.member)), node.member, node.maps,
                               store_write_slots(node.store))
    node.service = QueryService(backend) if node.answers_queries else None
    rp = ReadPortServer(backend, query=node.service.answer if node.service is not None else None)
    advertised = AdvertisedReadPort(backend, await rp.start("127.0.0.1", 0))
    server, node.port = await start_grpc_server(MetricsServicer(advertised), "127.0.0.1", node.port)
    node.servers = [rp, server]


def _map(nodes: list[Node], rf: int = 3) -> ShardMap:
    return assign([Member(n.member, n.address) for n in nodes], None, SLOTS, rf)


@asynccontextmanager
async def start_harness(param: dict[str, Any]) -> AsyncIterator[Harness]:
    """Three stores and a proxy with its HTTP API, all three stores holding the workload;
    ``param`` (a test's indirect parameter): ``old`` stores that do not answer whole queries,
    ``settings`` for the proxy, ``max_samples`` for its HTTP API."""
    old = param.get("old", ())
    nodes = {f"store-{i}": Node(f"store-{i}", answers_queries=f"store-{i}" not in old) for i in range(3)}
    # Servers bound to port 0 first, then the map from the ports they got: a port picked free
    # beforehand can be taken by another process before the bind (seen under a loaded machine).
    for n in nodes.values():
        n.maps = StaticMapSource(ShardMap.empty(SLOTS, 3))  # no request is served before the real map
        await _start_node(n)
    shard_map = _map(list(nodes.values()))
    for n in nodes.values():
        assert n.maps is not None
        n.maps.set(shard_map)
    proxy_maps = StaticMapSource(shard_map)
    proxy = ProxyBackend(proxy_maps, fast_settings(whole_queries=True, **param.get("settings", {})), SystemClock())
    series = workload(24)
    await proxy.write(write_request(series, TIMES, labels=True))
    # The write returns at W = 2 acknowledgements; a read of one replica may go to the third, so
    # every test starts from all three holding the data (under load the third lagged: an empty answer)
    deadline = time.monotonic() + 20.0
    while len({n.store.stats()["samples"] for n in nodes.values()}) > 1:
        assert time.monotonic() < deadline, {m: n.store.stats()["samples"] for m, n in nodes.items()}
        await asyncio.sleep(0.02)
    settings = HttpSettings(max_samples=param.get("max_samples", 50_000_000))
    app = build_app(proxy, settings=settings, registry=CollectorRegistry(), clock=SystemClock())
    runner, port = await start_http(app, "127.0.0.1", 0)
    try:
        async with aiohttp.ClientSession() as http:
            yield Harness(nodes, proxy, proxy_maps, f"http://127.0.0.1:{port}", http)
    finally:
        await stop_http(runner)
        await proxy.close()
        for n in nodes.values():
            await n.servers[0].stop()
            await n.servers[1].stop(None)


def learn_slow(h: Harness, seconds: float, members: list[str] | None = None) -> None:
    """Every store's (or ``members``') hedging delay learnt at ``seconds`` (its p99 of a full
    window), so that a loaded machine's slow answer is not hedged where a test counts which store
    answered (the initial delay is 50 ms)."""
    latency = h.proxy.whole_queries.latency
    for member in members if members is not None else list(h.nodes):
        for _ in range(latency.settings.window):
            latency.record(member, seconds)


async def warm(h: Harness) -> dict[str, MemberClient]:
    """Every store's read port connection opened, as after a few queries."""
    shard_map = h.proxy.view.current_map()
    members: dict[str, MemberClient] = {}
    for m in h.nodes:
        backend = h.proxy.view.pool.get(shard_map, m)
        assert isinstance(backend, MemberClient)
        client = await backend._read_port()
        assert client is not None
        await client._connection()
        members[m] = backend
    return members


def stall(h: Harness, member: str, released: asyncio.Event) -> None:
    """``member``'s read port answers no query until ``released`` is set."""
    service = h.nodes[member].service
    assert service is not None

    async def stalled(body: bytes, answer: Any = service.answer) -> bytes:
        await released.wait()
        return bytes(await answer(body))

    h.nodes[member].servers[0].query = stalled


async def rates_together(h: Harness, n: int) -> list[Any]:
    """``n`` whole queries of one pod's rate started in the same turn of the loop (a dashboard's
    panels, or concurrency n); their answers (None where the proxy would evaluate it itself)."""
    limits = QueryLimits()
    settings = RunnerSettings(300_000, 50_000_000, True, 10.0, tuple((k, int(getattr(limits, k))) for k in LIMIT_NAMES))
    at = int(float(AT) * 1000)
    return await asyncio.gather(*(h.proxy.whole_queries.run(
        QUERIES[3], instant=True, start_ms=at, end_ms=at, step_ms=1, timeout_s=10.0, settings=settings)
        for _ in range(n)))
