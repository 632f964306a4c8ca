"""The control plane as real processes on a real etcd: config servers, stores, an etcd outage."""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import grpc
import pytest
from cluster_procs import Procs, wait_listening, wait_map
from polling import wait_until

from metricsd.cluster.etcd_kv import EtcdKV
from metricsd.cluster.etcd_server import EtcdServer
from metricsd.cluster.shardmap import KeyLayout, ShardMap
from metricsd.cmd.localsecurity import LocalSecurity
from metricsd.model import make_labels, series_id
from metricsd.proto import metricsd_pb2 as pb
from metricsd.proto import metricsd_pb2_grpc as pb_grpc
from metricsd.rpc.backend import NotOwner
from metricsd.rpc.channel import open_channel
from metricsd.rpc.client import GrpcBackend
from metricsd.rpc.wire import labels_to_pb

pytestmark = pytest.mark.slow

TTL = 2


@pytest.fixture
def layout() -> KeyLayout:
    return KeyLayout(root=f"/proc-test-{uuid.uuid4().hex[:8]}", cluster="c1")


@pytest.fixture
def security(tmp_path: Path) -> LocalSecurity:
    """The cluster's CA and tokens, shared by its processes and the test's own clients."""
    return LocalSecurity(tmp_path / "security").create()


@pytest.fixture
def procs_for(tmp_path: Path, layout: KeyLayout, security: LocalSecurity) -> Iterator[Callable[[EtcdServer], Procs]]:
    made: list[Procs] = []

    def make(server: EtcdServer) -> Procs:
        p = Procs(tmp_path, server.endpoint, layout, security)
        made.append(p)
        return p

    yield make
    for p in made:
        p.close()


@pytest.fixture
async def grpc_channels(security: LocalSecurity) -> AsyncIterator[Callable[[str], GrpcBackend]]:
    channels: list[grpc.aio.Channel] = []

    def make(address: str) -> GrpcBackend:
        ch = open_channel(address, security.client("ops"))
        channels.append(ch)
        return GrpcBackend(pb_grpc.MetricsStub(ch), timeout_s=3.0)

    yield make
    for ch in channels:
        await ch.close(None)


def one_sample(pod: str, ts: int) -> pb.WriteRequest:
    labels = make_labels("cpu", {"namespace": "ns", "pod": pod})
    sid = series_id(labels)
    req = pb.WriteRequest(ids=[sid], counts=[1], timestamps=[ts], values=[1.0])
    req.series.add(id=sid).labels.extend(labels_to_pb(labels))
    return req


async def test_a_stand_by_config_server_takes_over_within_the_ttl_and_a_joining_store_gets_slots(
        etcd_server: EtcdServer, etcd_client: Callable[[EtcdServer], EtcdKV], layout: KeyLayout,
        procs_for: Callable[[EtcdServer], Procs], grpc_channels: Callable[[str], GrpcBackend]) -> None:
    kv = etcd_client(etcd_server)
    procs = procs_for(etcd_server)
    stores = [procs.store(f"store-{i}", ttl=TTL) for i in (1, 2, 3)]
    config = {cid: procs.config_server(cid, slots=16, rf=2, ttl=TTL) for cid in ("cs-1", "cs-2")}
    first = await wait_map(kv, layout, lambda m: len(m.members) == 3)
    assert all(len(r) == 2 for r in first.slots)
    assert sorted(first.load().values()) == [10, 11, 11]

    # A store refuses a slot it does not hold, over gRPC, naming the slot and the map version.
    missing = next(i for i, r in enumerate(first.slots) if "store-1" not in r)
    await wait_listening(stores[0])
    store1 = grpc_channels(first.address("store-1"))
    await wait_until("store-1 has the map", lambda: _has_map(store1))
    with pytest.raises(NotOwner, match=rf"does not hold slot {missing} in shard map version {first.version}"):
        await store1.read(pb.ReadRequest(start_ms=0, end_ms=1, slots=pb.SlotFilter(slot_count=16, slots=[missing])))

    leader_kv = await kv.get(layout.leader_key)
    assert leader_kv is not None
    leader = leader_kv.value.decode()
    stand_by = next(c for c in config if c != leader)
    config[leader].kill9()
    t0 = time.monotonic()
    await wait_until("the stand-by leads", lambda: _leader_is(kv, layout, stand_by), timeout_s=3 * TTL)
    took = time.monotonic() - t0
    assert took <= TTL + 1.5, f"take-over took {took:.1f}s with a {TTL}s lease"

    procs.store("store-4", ttl=TTL)
    joined = await wait_map(kv, layout, lambda m: bool(m.slots_of("store-4")), timeout_s=15)
    assert joined.version > first.version and sorted(joined.load().values()) == [8, 8, 8, 8]


async def _has_map(backend: GrpcBackend) -> bool:
    return (await backend.health()).status == pb.HealthResponse.SERVING


async def _leader_is(kv: EtcdKV, layout: KeyLayout, expected: str) -> bool:
    got = await kv.get(layout.leader_key)
    return got is not None and got.value.decode() == expected


async def test_through_an_etcd_outage_stores_and_config_servers_keep_running_and_watches_resume(
        private_etcd: EtcdServer, etcd_client: Callable[[EtcdServer], EtcdKV], layout: KeyLayout,
        procs_for: Callable[[EtcdServer], Procs], grpc_channels: Callable[[str], GrpcBackend]) -> None:
    kv = etcd_client(private_etcd)
    procs = procs_for(private_etcd)
    stores = [procs.store(f"store-{i}", ttl=TTL) for i in (1, 2)]
    configs = [procs.config_server(cid, slots=8, rf=2, ttl=TTL) for cid in ("cs-1", "cs-2")]
    before = await wait_map(kv, layout, lambda m: len(m.members) == 2)
    backends = {m: grpc_channels(before.address(m)) for m in before.members}
    for b in backends.values():
        await wait_until("the store has the map", lambda b=b: _has_map(b))  # type: ignore[misc]

    proxy_proc = procs.proxy("proxy-1", w=2, r=2)
    await wait_listening(proxy_proc)
    proxy = grpc_channels(f"127.0.0.1:{proxy_proc.port}")
    await wait_until("the proxy has the map", lambda: _has_map(proxy))

    private_etcd.stop()
    t_end = time.monotonic() + 20.0
    ts, written = 1_000, 0
    while time.monotonic() < t_end:  # the stores and the proxy keep serving on the last map they saw
        ts += 1000
        for i in range(8):
            assert (await proxy.write(one_sample(f"p{i}", ts))).samples_written == 1
            written += 1
        got = await proxy.read(pb.ReadRequest(start_ms=0, end_ms=ts, matchers=[pb.Matcher(name="__name__",
                                                                                          value="cpu")]))
        assert sum(len(s.timestamps) for s in got.series) == written
        await asyncio.sleep(1.0)
    assert all(p.alive for p in [*stores, *configs, proxy_proc]), procs.logs()

    private_etcd.start()
    procs.store("store-3", ttl=TTL)
    after = await wait_map(kv, layout, lambda m: bool(m.slots_of("store-3")) and len(m.members) == 3, timeout_s=30)
    assert after.version > before.version

    async def registered() -> bool:  # the map may keep store-1 and 2 a lease TTL before they re-register
        records = await kv.range(layout.members_prefix)
        return {i.key.rsplit("/", 1)[1] for i in records.items} == {"store-1", "store-2", "store-3"}

    await wait_until("store-1 and store-2 registered again", registered)
    for member in ("store-1", "store-2"):  # their watches resumed: they refuse the slots they lost
        assert set(before.slots_of(member)) - set(after.slots_of(member))
        await wait_until(f"{member} follows the newest map",
                         lambda b=backends[member], m=member: _follows(kv, layout, b, m, before))  # type: ignore[misc]
    assert "re-subscribing from revision" in procs.logs()


async def _follows(kv: EtcdKV, layout: KeyLayout, backend: GrpcBackend, member: str, before: ShardMap) -> bool:
    """The store refuses a slot the newest map took from it, naming that map's version or a later
    one (the map may change again once members kept by the config server's grace re-register)."""
    stored = await kv.get(layout.map_key)
    if stored is None:
        return False
    newest = ShardMap.from_json(stored.value)
    lost = sorted(set(before.slots_of(member)) - set(newest.slots_of(member)))
    return bool(lost) and await _refuses(backend, lost[0], newest.num_slots, newest.version)


async def _refuses(backend: GrpcBackend, slot: int, slot_count: int, version: int) -> bool:
    try:
        await backend.read(pb.ReadRequest(start_ms=0, end_ms=1, slots=pb.SlotFilter(slot_count=slot_count,
                                                                                    slots=[slot])))
    except NotOwner as e:  # a newer map may follow once the kept members have registered again
        seen = re.search(r"version (\d+)", str(e))
        return seen is not None and int(seen.group(1)) >= version
    return False
