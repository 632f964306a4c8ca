"""Helpers for the proxy tests: a small cluster in one process, real stores served over real gRPC
on loopback, a static shard map, and a ProxyBackend in front of them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
import numpy as np

from metricsd.clock import SystemClock
from metricsd.cluster.assign import assign
from metricsd.cluster.mapsource import StaticMapSource
from metricsd.cluster.shardmap import Member, ShardMap
from metricsd.maths.slots import slot_of_labels
from metricsd.model import Labels, make_labels, series_id
from metricsd.proto import metricsd_pb2 as pb
from metricsd.proxy.backend import ProxyBackend
from metricsd.proxy.members import Connect
from metricsd.proxy.settings import HandoffSettings, HealthSettings, ProxySettings
from metricsd.rpc.server import start_grpc_server
from metricsd.rpc.wire import labels_to_pb, matchers_to_pb
from metricsd.selector import parse_selector
from metricsd.store.api import StoreServicer
from metricsd.store.engine import Store

SLOTS = 16


def fast_settings(**kw: object) -> ProxySettings:
    """Short timeouts and back-offs so that failure tests run in well under a second."""
    base: dict[str, object] = dict(
        call_timeout_s=2.0, retries=0, retry_backoff_s=0.01,
        health=HealthSettings(down_initial_s=0.05, down_max_s=0.2),
        handoff=HandoffSettings(retry_initial_s=0.02, retry_max_s=0.1),
        whole_first=0,  # whole queries start from the first store in member-id order: tests name it
    )
    base.update(kw)
    return ProxySettings(**base)  # type: ignore[arg-type]


@dataclass
class StoreNode:
    member: str
    store: Store
    port: int = 0
    server: grpc.aio.Server | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> None:
        self.server, self.port = await start_grpc_server(StoreServicer(self.store, self.member), "127.0.0.1",
                                                         self.port)

    async def stop(self) -> None:
        assert self.server is not None
        await self.server.stop(None)
        self.server = None

    async def restart(self, store: Store | None = None) -> None:
        """Back on the same port, with the same Store (a quick restart) or another (a new disk)."""
        if self.server is not None:
            await self.stop()
        if store is not None:
            self.store = store
        await self.start()


@dataclass
class LocalCluster:
    nodes: dict[str, StoreNode]
    shard_map: ShardMap
    source: StaticMapSource
    proxies: list[ProxyBackend] = field(default_factory=list)

    def proxy(self, settings: ProxySettings | None = None, connect: Connect | None = None,
              source: StaticMapSource | None = None) -> ProxyBackend:
        p = ProxyBackend(source or self.source, settings or fast_settings(), SystemClock(), connect=connect)
        self.proxies.append(p)
        return p

    def holders(self, labels: Labels) -> list[str]:
        return list(self.shard_map.replicas(slot_of_labels(labels, SLOTS)))

    async def close(self) -> None:
        for p in self.proxies:
            await p.close()
        for n in self.nodes.values():
            if n.server is not None:
                await n.stop()


def make_map(nodes: Sequence[StoreNode], rf: int = 3, slots: int = SLOTS) -> ShardMap:
    return assign([Member(n.member, n.address) for n in nodes], None, slots, rf)


async def start_cluster(members: int = 3, rf: int = 3) -> LocalCluster:
    nodes = {f"store-{i}": StoreNode(f"store-{i}", Store()) for i in range(members)}
    for n in nodes.values():
        await n.start()
    shard_map = make_map(list(nodes.values()), rf)
    return LocalCluster(nodes, shard_map, StaticMapSource(shard_map))


# --- workload ----------------------------------------------------------------------------------


def workload(pods: int, namespaces: int = 3) -> list[Labels]:
    """Per pod a CPU counter and a CPU request, over several workloads, spread over all slots."""
    out = []
    for p in range(pods):
        base = {"namespace": f"ns{p % namespaces}", "pod": f"pod-{p}", "workload": f"w{p % 4}"}
        out.append(make_labels("container_cpu_usage_seconds_total", base))
        out.append(make_labels("kube_pod_container_resource_requests", {**base, "resource": "cpu"}))
    return out


def value_of(i: int, t_ms: int) -> float:
    """Deterministic values: counters grow at a per-series rate, requests stay flat."""
    return (1 + i % 7) * t_ms / 1000.0 if i % 2 == 0 else 0.25 * (1 + i % 5)


def write_request(series: Sequence[Labels], times: Sequence[int], labels: bool,
                  value: Callable[[int, int], float] = value_of) -> pb.WriteRequest:
    req = pb.WriteRequest()
    for i, lab in enumerate(series):
        sid = series_id(lab)
        req.ids.append(sid)
        req.counts.append(len(times))
        req.timestamps.extend(times)
        req.values.extend(value(i, t) for t in times)
        if labels:
            req.series.add(id=sid).labels.extend(labels_to_pb(lab))
    return req


def raw(store: Store, labels: Labels) -> list[tuple[int, float]]:
    """A store's raw samples of one series, straight from the engine."""
    row = store.index.row_of(series_id(labels))
    if row is None:
        return []
    t, v = store.series_samples(row, 0, 2**62)
    return list(zip(t.tolist(), v.tolist(), strict=True))


def selector(text: str, metric: str | None = None) -> list[pb.Matcher]:
    return matchers_to_pb(parse_selector(text, metric))


def agg_request(at_ms: int, end_ms: int | None = None, step_ms: int = 10_000, window_ms: int = 60_000,
                across: Any = pb.ACROSS_AVG, group_by: Sequence[str] = ()) -> pb.AggregateRequest:
    req = pb.AggregateRequest(across=across, start_ms=at_ms, end_ms=at_ms if end_ms is None else end_ms,
                              step_ms=step_ms, group_by=list(group_by))
    req.query.matchers.extend(selector("", "container_cpu_usage_seconds_total"))
    req.query.series_fn = pb.SERIES_RATE
    req.query.window_ms = window_ms
    return req


def all_values(resp: pb.AggregateResponse) -> np.ndarray:
    return np.array(resp.values, dtype=np.float64)


# --- a stale map ------------------------------------------------------------------------------


class RefreshingSource(StaticMapSource):
    """A stale map until refresh() is called, then the current one."""

    def __init__(self, stale: ShardMap, fresh: ShardMap) -> None:
        super().__init__(stale)
        self.fresh = fresh
        self.refreshes = 0

    async def refresh(self) -> ShardMap | None:
        self.refreshes += 1
        self.set(self.fresh)
        return self.fresh


def moved_maps(cluster: LocalCluster, slot: int) -> tuple[ShardMap, ShardMap, str, str]:
    """(stale, fresh, old owner, new owner): in the stale map ``slot`` is on a member that no longer
    holds it; the fresh one is the cluster's map."""
    fresh = cluster.shard_map
    replicas = fresh.replicas(slot)
    old_owner = next(m for m in fresh.members if m not in replicas)
    new_owner = replicas[0]
    stale_slots = list(fresh.slots)
    stale_slots[slot] = tuple(old_owner if m == new_owner else m for m in replicas)
    stale = ShardMap(version=fresh.version - 1 if fresh.version else 0, rf=fresh.rf, slots=tuple(stale_slots),
                     members=fresh.members)
    return stale, fresh, old_owner, new_owner
