"""The data path as real processes: 3 stores (RF 3), a config server, 2 proxies (W 2, R 2), real etcd."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import numpy as np
import pytest
from cluster_procs import Proc, Procs, wait_listening, wait_map
from polling import wait_until

from metricsd.agent.buffer import BufferSettings, PushBuffer
from metricsd.agent.pusher import Pusher
from metricsd.clock import SystemClock
from metricsd.cluster.etcd_kv import EtcdKV
from metricsd.cluster.etcd_server import EtcdServer
from metricsd.cluster.shardmap import KeyLayout, ShardMap
from metricsd.maths.slots import slot_of
from metricsd.model import Labels, make_labels, series_id
from metricsd.proto import metricsd_pb2 as pb
from metricsd.proto import metricsd_pb2_grpc as pb_grpc
from metricsd.rpc.backend import Unavailable
from metricsd.rpc.channel import open_channel
from metricsd.rpc.client import GrpcBackend
from metricsd.rpc.server import GRPC_OPTIONS
from metricsd.rpc.wire import labels_to_pb

pytestmark = pytest.mark.slow

SLOTS = 16
T0 = 1_700_000_000_000
METRIC = [pb.Matcher(name="__name__", value="load")]


def workload_series(pods: int = 96) -> list[Labels]:
    """``pods`` pods in 4 workloads, covering every slot."""
    series = [make_labels("load", {"namespace": "ns", "pod": f"pod-{i}", "workload": f"w{i % 4}"})
              for i in range(pods)]
    assert {slot_of(f"ns/pod-{i}", SLOTS) for i in range(pods)} == set(range(SLOTS))
    return series


def tick(series: list[Labels], ts: int, values: np.ndarray) -> pb.WriteRequest:
    ids = [series_id(s) for s in series]
    req = pb.WriteRequest(ids=ids, counts=[1] * len(ids), timestamps=[ts] * len(ids), values=values.tolist())
    for sid, lab in zip(ids, series, strict=True):
        req.series.add(id=sid).labels.extend(labels_to_pb(lab))
    return req


def samples_of(resp: pb.ReadResponse) -> dict[int, dict[int, float]]:
    return {s.id: dict(zip(s.timestamps, s.values, strict=True)) for s in resp.series}


@dataclass
class Cluster:
    procs: Procs
    kv: EtcdKV
    layout: KeyLayout
    shard_map: ShardMap
    stores: dict[str, Proc]
    proxies: list[Proc]
    channels: list[grpc.aio.Channel] = field(default_factory=list)

    def backend(self, address: str) -> GrpcBackend:
        ch = open_channel(address, self.procs.client(), GRPC_OPTIONS)
        self.channels.append(ch)
        return GrpcBackend(pb_grpc.MetricsStub(ch), timeout_s=5.0)

    def proxy(self, i: int) -> GrpcBackend:
        return self.backend(f"127.0.0.1:{self.proxies[i].port}")


@pytest.fixture
async def cluster(etcd_server: EtcdServer, etcd_client: Callable[[EtcdServer], EtcdKV],
                  tmp_path: Path) -> AsyncIterator[Cluster]:
    layout = KeyLayout(root=f"/proxy-test-{uuid.uuid4().hex[:8]}", cluster="c1")
    kv = etcd_client(etcd_server)
    procs = Procs(tmp_path, etcd_server.endpoint, layout)
    try:
        stores = {f"store-{i}": procs.store(f"store-{i}", ttl=5) for i in (1, 2, 3)}
        procs.config_server("cs-1", slots=SLOTS, rf=3, ttl=2, min_members=3)
        proxies = [procs.proxy(f"proxy-{i}") for i in (1, 2)]
        shard_map = await wait_map(kv, layout, lambda m: len(m.members) == 3)
        for p in [*stores.values(), *proxies]:
            await wait_listening(p)
        c = Cluster(procs, kv, layout, shard_map, stores, proxies)
        for i in (0, 1):
            proxy = c.proxy(i)
            await wait_until(f"proxy-{i + 1} serving", lambda p=proxy: _serving(p))  # type: ignore[misc]
        yield c
        for ch in c.channels:
            await ch.close(None)
    except BaseException:
        print(procs.logs())
        raise
    finally:
        procs.close()


async def _serving(backend: GrpcBackend) -> bool:
    try:
        return (await backend.health()).status == pb.HealthResponse.SERVING
    except Unavailable:
        return False


async def test_any_proxy_serves_what_another_acknowledged_and_aggregates_match_brute_force(cluster: Cluster) -> None:
    series = workload_series()
    ids = np.array([series_id(s) for s in series], dtype=np.uint64)
    rng = np.random.default_rng(7)
    values = rng.uniform(0, 4, size=(10, len(series)))
    p1, p2 = cluster.proxy(0), cluster.proxy(1)
    for k in range(10):
        ack = await p1.write(tick(series, T0 + (k + 1) * 10_000, values[k]))
        assert ack.samples_written == len(series) and not ack.unknown_ids

    got = samples_of(await p2.read(pb.ReadRequest(matchers=METRIC, start_ms=T0, end_ms=T0 + 200_000)))
    assert set(got) == {int(i) for i in ids}
    for j, sid in enumerate(ids.tolist()):
        assert got[sid] == {T0 + (k + 1) * 10_000: float(values[k, j]) for k in range(10)}

    workload = np.array([int(dict(s)["workload"][1:]) for s in series])
    per_series_avg = values.mean(axis=0)
    t_end = T0 + 100_000
    for across, brute in ((pb.ACROSS_SUM, lambda v: v.sum()), (pb.ACROSS_MAX, lambda v: v.max()),
                          (pb.ACROSS_AVG, lambda v: v.mean()), (pb.ACROSS_COUNT, lambda v: float(len(v)))):
        resp = await p2.aggregate(pb.AggregateRequest(
            query=pb.AggregateQuery(matchers=METRIC, series_fn=pb.SERIES_AVG, window_ms=100_000),
            across=across, group_by=["workload"], start_ms=t_end, end_ms=t_end))
        answer = {g.labels[0].value: resp.values[i] for i, g in enumerate(resp.groups)}
        expected = {f"w{w}": float(brute(per_series_avg[workload == w])) for w in range(4)}
        assert answer.keys() == expected.keys()
        for w, v in expected.items():
            assert answer[w] == pytest.approx(v, rel=1e-12), (across, w)


async def test_a_client_with_two_proxies_carries_on_when_one_is_killed(cluster: Cluster) -> None:
    series = workload_series()
    p1_addr, p2_addr = (f"127.0.0.1:{p.port}" for p in cluster.proxies)
    pusher = Pusher(PushBuffer(BufferSettings()), [(p1_addr, cluster.backend(p1_addr)),
                                                   (p2_addr, cluster.backend(p2_addr))], SystemClock())
    sender = asyncio.create_task(pusher.run())
    try:
        for k in range(10):
            if k == 5:
                cluster.proxies[0].kill9()
            pusher.push_samples(T0 + k * 10_000, [(s, float(k)) for s in series])
            await asyncio.wait_for(pusher.flush(), 20)
    finally:
        sender.cancel()
        await asyncio.gather(sender, return_exceptions=True)
    assert pusher.stats.sent_samples == 10 * len(series) and pusher.stats.failures[p1_addr] >= 1
    got = samples_of(await cluster.proxy(1).read(pb.ReadRequest(matchers=METRIC, start_ms=T0, end_ms=T0 + 10**6)))
    assert len(got) == len(series) and all(len(v) == 10 for v in got.values())


async def test_with_one_store_killed_acknowledged_writes_survive_and_the_replicas_are_level_after(
        cluster: Cluster) -> None:
    series = workload_series()
    writer_proxy, reader_proxy = cluster.proxy(0), cluster.proxy(1)
    acked: dict[int, set[int]] = {series_id(s): set() for s in series}
    stats = {"write_fail": 0, "read_ok": 0, "read_fail": 0, "reads_while_down": 0}
    victim = cluster.stores["store-2"]
    down = asyncio.Event()
    stop = asyncio.Event()

    async def writer() -> None:
        ts = T0
        while not stop.is_set():
            ts += 1000
            try:
                await writer_proxy.write(tick(series, ts, np.full(len(series), float(ts % 97))))
            except Unavailable:
                stats["write_fail"] += 1
            else:
                for s in acked.values():
                    s.add(ts)
            await asyncio.sleep(0.02)

    async def reader() -> None:
        while not stop.is_set():
            try:
                await reader_proxy.read(pb.ReadRequest(matchers=METRIC, start_ms=T0, end_ms=T0 + 10**7))
                await reader_proxy.aggregate(pb.AggregateRequest(
                    query=pb.AggregateQuery(matchers=METRIC, series_fn=pb.SERIES_LAST, window_ms=60_000),
                    across=pb.ACROSS_SUM, start_ms=T0 + 10_000, end_ms=T0 + 10_000))
                stats["read_ok"] += 1
                stats["reads_while_down"] += down.is_set()
            except Unavailable:
                stats["read_fail"] += 1
            await asyncio.sleep(0.05)

    tasks = [asyncio.create_task(writer()), asyncio.create_task(reader())]
    await asyncio.sleep(2.0)
    victim.kill9()
    down.set()
    await asyncio.sleep(3.0)
    restarted = cluster.procs.store("store-2", port=victim.port, ttl=5)  # empty: no data dir
    await wait_listening(restarted)
    down.clear()
    await asyncio.sleep(3.0)
    stop.set()
    await asyncio.gather(*tasks)
    n_acked = len(next(iter(acked.values())))
    assert n_acked > 100 and stats["write_fail"] <= 5, stats
    assert stats["reads_while_down"] >= 5 and stats["read_fail"] <= 2, stats

    got = samples_of(await reader_proxy.read(pb.ReadRequest(matchers=METRIC, start_ms=T0, end_ms=T0 + 10**7)))
    lost = {sid: ts - set(got.get(sid, {})) for sid, ts in acked.items() if ts - set(got.get(sid, {}))}
    assert not lost, f"{sum(map(len, lost.values()))} acknowledged samples missing"

    # Replicas level: reads through the proxies (rotating replicas) let read repair fill store-2.
    replicas = {m: cluster.backend(cluster.shard_map.address(m)) for m in cluster.shard_map.members}
    all_slots = pb.SlotFilter(slot_count=SLOTS, slots=list(range(SLOTS)))
    deadline = time.monotonic() + 30
    while True:
        for proxy in (writer_proxy, reader_proxy):
            await proxy.read(pb.ReadRequest(matchers=METRIC, start_ms=T0, end_ms=T0 + 10**7))
        raw = {m: samples_of(await b.read(pb.ReadRequest(matchers=METRIC, start_ms=T0, end_ms=T0 + 10**7,
                                                          slots=all_slots)))
               for m, b in replicas.items()}
        sizes = {m: sum(len(v) for v in r.values()) for m, r in raw.items()}
        if raw["store-1"] == raw["store-2"] == raw["store-3"]:
            break
        assert time.monotonic() < deadline, f"replicas not level after 30 s: samples per replica {sizes}"
        await asyncio.sleep(0.5)
    assert all(set(raw["store-2"][sid]) >= ts for sid, ts in acked.items())
