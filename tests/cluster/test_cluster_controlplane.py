"""The control plane in one process on a real etcd: map watching, member registration, config servers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest

from metricsd.cluster.assign import assign
from metricsd.cluster.configserver import ConfigServer, ConfigServerSettings, describe_changes
from metricsd.cluster.etcd_kv import EtcdKV
from metricsd.cluster.kv import KV
from metricsd.cluster.mapwatch import EtcdMapSource
from metricsd.cluster.member import ClusterMember, MemberRegistration
from metricsd.cluster.shardmap import KeyLayout, Member, ShardMap

TIMEOUT = 10.0


@pytest.fixture
def layout(prefix: str) -> KeyLayout:
    return KeyLayout(root=prefix.rstrip("/"), cluster="c1")


def members(*ids: str) -> list[Member]:
    return [Member(m, f"127.0.0.1:{7100 + i}") for i, m in enumerate(ids)]


@pytest.fixture
async def closers() -> AsyncIterator[list[Callable[[], object]]]:
    """Things to close at the end of a test, last first."""
    to_close: list[Callable[[], object]] = []
    yield to_close
    for close in reversed(to_close):
        result = close()
        if asyncio.iscoroutine(result):
            await result


async def test_the_map_source_reads_the_map_then_follows_each_change(kv: KV, layout: KeyLayout,
                                                                      closers: list[Callable[[], object]]) -> None:
    first = assign(members("a", "b"), None, 8, 2)
    await kv.put(layout.map_key, first.to_json())
    seen: list[int] = []
    source = EtcdMapSource(kv, layout, on_change=lambda old, new: seen.append(new.version))
    closers.append(source.close)
    assert (await source.wait_ready(TIMEOUT)).version == 1
    second = assign(members("a", "b", "c"), first, 8, 2)
    await kv.put(layout.map_key + "x", b"not a map")  # same prefix, another key: ignored
    await kv.put(layout.map_key, second.to_json())
    got = await source.wait_for(lambda m: m.version == 2, TIMEOUT)
    assert got.slots == second.slots and seen == [1, 2]


async def test_next_map_waits_for_a_map_other_than_the_one_seen(kv: KV, layout: KeyLayout,
                                                                 closers: list[Callable[[], object]]) -> None:
    source = EtcdMapSource(kv, layout)
    closers.append(source.close)
    assert await source.next_map(None, 0.2) is None  # no map yet
    first = assign(members("a", "b"), None, 8, 2)
    await kv.put(layout.map_key, first.to_json())
    seen = await source.next_map(None, TIMEOUT)
    assert seen is not None and seen.version == 1
    assert await source.next_map(seen, 0.3) is None  # nothing changed: it waited the whole timeout
    waiting = asyncio.ensure_future(source.next_map(seen, TIMEOUT))
    await kv.put(layout.map_key, assign(members("a", "b", "c"), first, 8, 2).to_json())
    got = await waiting
    assert got is not None and got.version == 2
    assert await source.next_map(seen, 0) is got  # already other than seen: at once


async def test_the_map_source_keeps_the_last_good_map_over_invalid_or_deleted_ones(
        kv: KV, layout: KeyLayout, closers: list[Callable[[], object]], caplog: pytest.LogCaptureFixture) -> None:
    good = assign(members("a"), None, 4, 1)
    await kv.put(layout.map_key, good.to_json())
    source = EtcdMapSource(kv, layout)
    closers.append(source.close)
    await source.wait_ready(TIMEOUT)
    await kv.put(layout.map_key, b'{"format": 1, "version": "x"}')
    await kv.delete(layout.map_key)
    newer = assign(members("a", "b"), good, 4, 1)
    await kv.put(layout.map_key, newer.to_json())
    await source.wait_for(lambda m: m.version == 2, TIMEOUT)
    assert "ignoring an invalid shard map" in caplog.text and "was deleted; keeping v1" in caplog.text


async def test_refresh_reads_the_key_and_never_steps_back(kv: KV, layout: KeyLayout,
                                                          closers: list[Callable[[], object]]) -> None:
    source = EtcdMapSource(kv, layout)
    closers.append(source.close)
    assert await source.refresh() is None
    first = assign(members("a"), None, 4, 1)
    await kv.put(layout.map_key, first.to_json())
    refreshed = await source.refresh()
    assert refreshed is not None and refreshed.version == 1
    await source.wait_ready(TIMEOUT)
    assert source.current() is refreshed or source.current() == refreshed


async def test_a_member_registers_and_registers_again_when_its_lease_is_revoked(
        kv: KV, layout: KeyLayout, closers: list[Callable[[], object]]) -> None:
    me = Member("store-1", "127.0.0.1:7101")
    reg = MemberRegistration(kv, layout, me, ttl=3, retry_s=0.05)
    closers.append(reg.close)
    reg.start()
    await asyncio.wait_for(reg.registered.wait(), TIMEOUT)
    got = await kv.get(layout.member_key("store-1"))
    assert got is not None and Member.from_json(got.value) == me
    assert isinstance(kv, EtcdKV) and reg.lease is not None
    first_lease = reg.lease.id
    await kv.revoke_lease_id(first_lease)  # an operator evicting it, or etcd expiring it
    async with asyncio.timeout(TIMEOUT):
        while reg.registrations < 2 or await kv.get(layout.member_key("store-1")) is None:
            await asyncio.sleep(0.05)
    assert reg.lease is not None and reg.lease.id != first_lease
    await reg.close(deregister=True)
    assert await kv.get(layout.member_key("store-1")) is None


def settings(server_id: str, **kw: object) -> ConfigServerSettings:
    base: dict[str, object] = {"num_slots": 16, "rf": 2, "lease_ttl": 2, "debounce_s": 0.05, "retry_s": 0.05}
    base.update(kw)
    return ConfigServerSettings(server_id, **base)  # type: ignore[arg-type]


async def test_the_leader_assigns_live_members_and_a_joining_member_gets_slots(
        kv_factory: Callable[[], KV], layout: KeyLayout, closers: list[Callable[[], object]]) -> None:
    kv = kv_factory()
    for m in members("s1", "s2"):
        cm = ClusterMember(kv_factory(), layout, m, ttl=3, retry_s=0.05)
        closers.append(cm.close)
        cm.start()
    server = ConfigServer(kv_factory(), layout, settings("cs-1"))
    closers.append(server.close)
    server.start()
    watch = EtcdMapSource(kv, layout)
    closers.append(watch.close)
    first = await watch.wait_for(lambda m: set(m.members) == {"s1", "s2"}, TIMEOUT)
    assert all(len(r) == 2 for r in first.slots)
    joiner = ClusterMember(kv_factory(), layout, Member("s3", "127.0.0.1:7103"), ttl=3, retry_s=0.05)
    closers.append(joiner.close)
    joiner.start()
    second = await watch.wait_for(lambda m: "s3" in m.members, TIMEOUT)
    assert len(second.slots_of("s3")) in (10, 11)  # 32 replicas over 3 members
    held = await joiner.maps.wait_for(lambda m: "s3" in m.members, TIMEOUT)
    assert joiner.held_slots() == frozenset(held.slots_of("s3"))
    assert describe_changes(first, second)[0].startswith("slot ")


async def test_a_stand_by_takes_over_when_the_leader_goes_and_keeps_assigning(
        kv_factory: Callable[[], KV], layout: KeyLayout, closers: list[Callable[[], object]]) -> None:
    kv = kv_factory()
    reg = MemberRegistration(kv_factory(), layout, members("s1")[0], ttl=3, retry_s=0.05)
    closers.append(reg.close)
    reg.start()
    one, two = (ConfigServer(kv_factory(), layout, settings(f"cs-{i}")) for i in (1, 2))
    closers.extend([one.close, two.close])
    one.start()
    watch = EtcdMapSource(kv, layout)
    closers.append(watch.close)
    await watch.wait_for(lambda m: "s1" in m.members, TIMEOUT)
    two.start()
    await asyncio.sleep(0.2)
    assert one.is_leader and not two.is_leader
    await one.close()
    reg2 = MemberRegistration(kv_factory(), layout, Member("s2", "127.0.0.1:7102"), ttl=3, retry_s=0.05)
    closers.append(reg2.close)
    reg2.start()
    got = await watch.wait_for(lambda m: "s2" in m.members and bool(m.slots_of("s2")), TIMEOUT)
    # The watch may see the new map before `two` resumes from its compare-and-swap to count it.
    for _ in range(100):
        if two.maps_written:
            break
        await asyncio.sleep(0.02)
    assert two.is_leader and two.maps_written >= 1 and got.version == 2


async def test_the_first_map_waits_for_min_members_and_no_map_is_written_without_members(
        kv_factory: Callable[[], KV], layout: KeyLayout, closers: list[Callable[[], object]]) -> None:
    kv = kv_factory()
    server = ConfigServer(kv, layout, settings("cs-1", min_members=2))
    closers.append(server.close)
    await server.election.campaign()
    assert await server.reconcile() and await kv.get(layout.map_key) is None  # nobody registered
    await kv.put(layout.member_key("s1"), members("s1")[0].to_json())
    assert await server.reconcile() and await kv.get(layout.map_key) is None  # 1 of 2
    await kv.put(layout.member_key("s2"), members("s1", "s2")[1].to_json())
    assert await server.reconcile()
    stored = await kv.get(layout.map_key)
    assert stored is not None and set(ShardMap.from_json(stored.value).members) == {"s1", "s2"}
    await kv.delete(layout.member_key("s1"))
    await kv.delete(layout.member_key("s2"))
    assert await server.reconcile()
    still = await kv.get(layout.map_key)
    assert still is not None and still.mod_revision == stored.mod_revision


async def test_a_deposed_leaders_map_write_is_refused(kv_factory: Callable[[], KV], layout: KeyLayout,
                                                     closers: list[Callable[[], object]]) -> None:
    kv = kv_factory()
    server = ConfigServer(kv, layout, settings("cs-1"))
    closers.append(server.close)
    await server.election.campaign()
    await kv.put(layout.member_key("s1"), members("s1")[0].to_json())
    # Someone else takes the leader key behind the server's back before it notices.
    await kv.delete(layout.leader_key)
    await kv.put(layout.leader_key, b"cs-2")
    await asyncio.wait_for(server.election.deposed.wait(), TIMEOUT)
    server.election.is_leader = True  # as if it had not noticed yet
    assert not await server.reconcile()
    assert await kv.get(layout.map_key) is None


async def test_members_without_a_record_keep_their_slots_for_one_lease_ttl_after_a_term_begins(
        kv_factory: Callable[[], KV], layout: KeyLayout, closers: list[Callable[[], object]]) -> None:
    """After an etcd outage or a leader change, live stores are still re-registering: a member of the
    map without a record keeps its slots for the grace (lease TTL + debounce), then loses them."""
    kv = kv_factory()
    now = [1000.0]
    server = ConfigServer(kv, layout, settings("cs-1"), clock=lambda: now[0])
    closers.append(server.close)
    await server.election.campaign()
    three = assign(members("s1", "s2", "s3"), None, 16, 2)
    await kv.put(layout.map_key, three.to_json())
    for m in members("s1", "s2"):  # s3 has not re-registered yet
        await kv.put(layout.member_key(m.id), m.to_json())
    server.begin_grace()
    now[0] += 1.0
    assert await server.reconcile()
    kept = await kv.get(layout.map_key)
    assert kept is not None and ShardMap.from_json(kept.value).version == three.version
    now[0] += 2 + 0.05  # past lease_ttl (2) + debounce (0.05) from the grace's start
    assert await server.reconcile()
    stored = await kv.get(layout.map_key)
    assert stored is not None
    after = ShardMap.from_json(stored.value)
    assert set(after.members) == {"s1", "s2"} and not after.slots_of("s3") and after.version == three.version + 1
