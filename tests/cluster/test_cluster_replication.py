"""Replicas keeping level: ReplicaSync over gRPC in one process, the member state it publishes, the
proxy leaving joining members out of reads, and the chaos schedule and checks."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import numpy as np
import pytest

from metricsd.clock import SystemClock
from metricsd.cluster.assign import assign
from metricsd.cluster.chaosplan import AckLog, Workload, lost_samples, plan_events
from metricsd.cluster.kv import KV
from metricsd.cluster.mapsource import StaticMapSource
from metricsd.cluster.member import MemberRegistration
from metricsd.cluster.shardmap import KeyLayout, Member, MemberState, ShardMap
from metricsd.model import make_labels, series_id
from metricsd.proto import metricsd_pb2 as pb
from metricsd.proxy.fanout import plan_reads
from metricsd.proxy.quorum import QuorumSettings
from metricsd.replica.catchup_client import local_apply
from metricsd.replica.digest import store_digest
from metricsd.replica.ownership import OwnershipBackend, store_write_slots
from metricsd.replica.readiness import SlotReadiness
from metricsd.replica.replication import ReplicaSync, SyncSettings
from metricsd.replica.servicer import StoreNodeServicer
from metricsd.rpc.backend import NotOwner
from metricsd.rpc.server import start_grpc_server
from metricsd.rpc.wire import labels_to_pb
from metricsd.store.api import LocalBackend, StoreAPI
from metricsd.store.engine import Store

T0 = (int(time.time() * 1000) - 600_000) // 1000 * 1000  # ReplicaSync looks back from the real clock
SLOTS = 8


def labels(i: int) -> tuple[tuple[str, str], ...]:
    return make_labels("cpu", {"namespace": "ns", "pod": f"p{i}"})


def write(store: Store, series: range, ts: list[int]) -> None:
    ids = [series_id(labels(i)) for i in series]
    t = np.tile(np.array(ts, dtype=np.int64), len(ids))
    vals = (t // 1000 % 997 + np.repeat(np.arange(len(ids)), len(ts))).astype(np.float64)  # one value per sample
    store.write(np.array(ids, dtype=np.uint64), np.full(len(ids), len(ts)), t, vals,
                {series_id(labels(i)): labels(i) for i in series})


class Node:
    def __init__(self, name: str) -> None:
        self.name = name
        self.store = Store()
        self.api = StoreAPI(self.store, name)
        self.port = 0
        self.server: grpc.aio.Server | None = None

    async def start(self) -> None:
        self.server, self.port = await start_grpc_server(StoreNodeServicer(LocalBackend(self.api), self.api),
                                                         "127.0.0.1", 0)

    def member(self, state: MemberState = MemberState.ACTIVE) -> Member:
        return Member(self.name, f"127.0.0.1:{self.port}", state)


@pytest.fixture
async def nodes() -> AsyncIterator[list[Node]]:
    out = [Node(f"s{i}") for i in range(3)]
    for n in out:
        await n.start()
    yield out
    for n in out:
        assert n.server is not None
        await n.server.stop(None)


def digest(store: Store, slots: list[int]) -> pb.DigestResponse:
    return store_digest(store, pb.DigestRequest(slots=pb.SlotFilter(slot_count=SLOTS, slots=slots), start_ms=T0,
                                                end_ms=T0 + 10**9, bucket_ms=60_000))


async def test_a_restarted_replica_catches_up_its_slots_then_a_gained_slot(nodes: list[Node]) -> None:
    a, b, c = nodes
    full = [a.member(), b.member(), c.member(MemberState.JOINING)]
    shard_map = ShardMap(1, 2, tuple(("s0", "s2") if s % 2 else ("s1", "s2") for s in range(SLOTS)),
                         {m.id: m for m in full})
    for n in (a, b):
        write(n.store, range(40), [T0 + 1000 * k for k in range(50)])
    write(c.store, range(40), [T0 + 1000 * k for k in range(20)])  # c restarted: it kept the first 20 s
    source = StaticMapSource(shard_map)
    published: list[MemberState] = []

    async def publish(state: MemberState) -> None:
        published.append(state)

    clock = SystemClock()
    settings = SyncSettings(interval_s=3600, window_ms=3_600_000, retry_s=0.05, page_samples=100)
    settings = SyncSettings(interval_s=3600, window_ms=3_600_000, retry_s=0.05, page_samples=100)
    sync = ReplicaSync(c.store, local_apply(c.store), c.api, "s2", source, clock, settings, publish=publish)
    task = asyncio.ensure_future(sync.run())
    try:
        async with asyncio.timeout(20):
            while sync.counters.catch_ups < 1:
                await asyncio.sleep(0.02)
        held = list(range(SLOTS))
        assert c.api.status == pb.HealthResponse.SERVING and published == [MemberState.JOINING, MemberState.ACTIVE]
        want_a = digest(a.store, [s for s in held if s % 2])
        assert digest(c.store, [s for s in held if s % 2]) == want_a
        assert digest(c.store, [s for s in held if not s % 2]) == digest(b.store, [s for s in held if not s % 2])
        assert sync.counters.copied.samples_written == 40 * 30
        # a new map gives s2 a slot it did not hold (slot 0 moves onto it); s0 holds new data there
        new_map = ShardMap(2, 2, (("s0", "s2"), *tuple(shard_map.slots[1:])), shard_map.members)
        source.set(ShardMap(2, 2, ((("s0", "s1"), *tuple(shard_map.slots[1:]))), shard_map.members))
        await asyncio.sleep(0.6)  # s2 sees a map without slot 0 first
        slot0 = [i for i in range(100, 400) if _slot(labels(i)) == 0][:5]
        for i in slot0:
            write(a.store, range(i, i + 1), [T0 + 7])
        source.set(new_map)
        async with asyncio.timeout(20):
            while sync.counters.catch_ups < 2:
                await asyncio.sleep(0.02)
        assert digest(c.store, [0]) == digest(a.store, [0]) and digest(c.store, [0]).slots[0].samples > 0
        assert published[-2:] == [MemberState.JOINING, MemberState.ACTIVE]
        # anti-entropy: a sample only a peer has is copied in the next round
        extra = next(i for i in range(1000, 2000) if _slot(labels(i)) % 2 == 0 and _slot(labels(i)) != 0)
        write(b.store, range(extra, extra + 1), [T0 + 3])
        target = _slot(labels(extra))
        assert digest(c.store, [target]) != digest(b.store, [target])
        stats = await sync.anti_entropy_round()
        assert stats.slots_compared == SLOTS and stats.samples_written == 1
        assert digest(c.store, [target]) == digest(b.store, [target])
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await sync.close()


class CountingReadiness(SlotReadiness):
    """Records the version of every map the replication loop (or anyone) hands it."""

    def __init__(self, member_id: str) -> None:
        super().__init__(member_id)
        self.observed: list[int] = []

    def observe(self, shard_map: ShardMap) -> None:
        self.observed.append(shard_map.version)
        super().observe(shard_map)


async def _started_sync(nodes: list[Node], source: StaticMapSource, settings: SyncSettings,
                        readiness: SlotReadiness | None = None) -> tuple[ReplicaSync, asyncio.Future[None]]:
    c = nodes[2]
    sync = ReplicaSync(c.store, local_apply(c.store), c.api, "s2", source, SystemClock(), settings,
                       readiness=readiness)
    task = asyncio.ensure_future(sync.run())
    async with asyncio.timeout(20):
        while sync.counters.catch_ups < 1:
            await asyncio.sleep(0.02)
    return sync, task


async def test_the_replication_loop_sleeps_until_the_map_changes(nodes: list[Node]) -> None:
    """Nothing is looked at while nothing changes (the loop looked at the map twice a second), and
    a new map is still acted on as soon as it arrives."""
    shard_map = ShardMap(1, 3, tuple(("s0", "s1", "s2") for _ in range(SLOTS)), {n.name: n.member() for n in nodes})
    source = StaticMapSource(shard_map)
    readiness = CountingReadiness("s2")
    sync, task = await _started_sync(nodes, source, SyncSettings(interval_s=3600, window_ms=3_600_000),
                                     readiness)
    try:
        looked = len(readiness.observed)
        await asyncio.sleep(1.2)
        assert len(readiness.observed) == looked
        source.set(ShardMap(2, 3, shard_map.slots, shard_map.members))
        async with asyncio.timeout(5):
            while readiness.observed[-1] != 2:
                await asyncio.sleep(0.01)
        assert len(readiness.observed) == looked + 1 and sync.counters.rounds == 0
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await sync.close()


async def test_anti_entropy_rounds_come_when_due_with_no_map_change(nodes: list[Node]) -> None:
    shard_map = ShardMap(1, 3, tuple(("s0", "s1", "s2") for _ in range(SLOTS)), {n.name: n.member() for n in nodes})
    sync, task = await _started_sync(nodes, StaticMapSource(shard_map),
                                     SyncSettings(interval_s=0.2, window_ms=3_600_000))
    try:
        async with asyncio.timeout(10):
            while sync.counters.rounds < 3:
                await asyncio.sleep(0.02)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await sync.close()


@pytest.mark.parametrize("behind", [False, True])
async def test_a_store_whose_restart_lost_data_stays_out_of_reads_until_its_first_catch_up(
        nodes: list[Node], behind: bool) -> None:
    """``behind`` (recovery reported a loss, metricsd/store/recovery.py): it registered joining and says
    CATCHING_UP until a catch-up has run, even when it turns out to lack nothing; without it a store
    that lacks nothing never leaves active."""
    c = nodes[2]
    shard_map = ShardMap(1, 3, tuple(("s0", "s1", "s2") for _ in range(SLOTS)),
                         {n.name: n.member(MemberState.JOINING if behind and n is c else MemberState.ACTIVE)
                          for n in nodes})
    for n in nodes:
        write(n.store, range(20), [T0 + 1000 * k for k in range(10)])
    published: list[MemberState] = []
    seen_status: list[int] = []

    async def publish(state: MemberState) -> None:
        seen_status.append(c.api.status)
        published.append(state)

    c.api.status = pb.HealthResponse.CATCHING_UP if behind else pb.HealthResponse.SERVING  # as cmd/store.py does
    settings = SyncSettings(interval_s=3600, window_ms=3_600_000, retry_s=0.05)
    sync = ReplicaSync(c.store, local_apply(c.store), c.api, "s2", StaticMapSource(shard_map), SystemClock(),
                       settings, publish=publish, behind=behind)
    task = asyncio.ensure_future(sync.run())
    try:
        async with asyncio.timeout(20):
            while sync.counters.catch_ups < 1:
                await asyncio.sleep(0.02)
        assert sync.counters.copied.samples_written == 0
        assert published == ([MemberState.ACTIVE] if behind else [])
        assert seen_status == ([pb.HealthResponse.SERVING] if behind else [])
        assert c.api.status == pb.HealthResponse.SERVING
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await sync.close()


async def test_a_catch_up_takes_the_union_of_the_replicas_and_of_a_moved_slots_former_owners(
        nodes: list[Node]) -> None:
    """Samples acknowledged by W replicas may sit on one of them only, until anti-entropy spreads
    them. A store catching up must therefore copy from every replica, not the first that answers;
    and a store given a slot by a new map must also copy from the slot's former owners, which keep
    their samples (chaos seed 5 stranded 36 acknowledged samples on a former owner otherwise)."""
    a, b, c = nodes
    members = {n.name: n.member() for n in nodes}
    in_slot = {slot: [i for i in range(2000) if _slot(labels(i)) == slot][:4] for slot in (0, 1)}
    # Slot 1 on all three: a and b each hold a sample the other lacks, c (wiped) holds nothing.
    write(a.store, range(in_slot[1][0], in_slot[1][0] + 1), [T0 + 1000])
    write(b.store, range(in_slot[1][1], in_slot[1][1] + 1), [T0 + 2000])
    # Slot 0 on a and b at first; then a new map moves it from a to c.
    write(a.store, range(in_slot[0][0], in_slot[0][0] + 1), [T0 + 3000])
    write(b.store, range(in_slot[0][1], in_slot[0][1] + 1), [T0 + 4000])
    slots = tuple(("s0", "s1", "s2") if s == 1 else ("s0", "s1") for s in range(SLOTS))
    source = StaticMapSource(ShardMap(1, 3, slots, members))
    settings = SyncSettings(interval_s=3600, window_ms=3_600_000, retry_s=0.05)
    sync = ReplicaSync(c.store, local_apply(c.store), c.api, "s2", source, SystemClock(), settings)
    task = asyncio.ensure_future(sync.run())
    try:
        async with asyncio.timeout(20):
            while sync.counters.catch_ups < 1:
                await asyncio.sleep(0.02)
        union = digest(a.store, [1]).slots[0].samples + digest(b.store, [1]).slots[0].samples
        assert digest(c.store, [1]).slots[0].samples == union == 2
        source.set(ShardMap(2, 3, (("s1", "s2"), *slots[1:]), members))  # slot 0: -s0 +s2
        async with asyncio.timeout(20):
            while sync.counters.catch_ups < 2:
                await asyncio.sleep(0.02)
        assert digest(c.store, [0]).slots[0].samples == 2  # s1's sample, and s0's from the former owner
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await sync.close()


async def test_a_slot_given_by_a_new_map_is_refused_to_reads_until_caught_up_but_takes_writes(
        nodes: list[Node]) -> None:
    """A member that leaves has its replicas handed to others at once; the new replica holds nothing
    of the slot until its catch-up is done. Counted in a quorum read meanwhile, it and a replica
    whose hinted hand-off has not arrived can both lack an acknowledged sample (chaos run of
    2026-11-27: a read of pod-54 missed 6 samples that only store-2 held). So it refuses the read
    (NotOwner: the proxy asks another replica without marking it down) from the moment it sees
    the map, unless its catch-up ends within ``catch_up_wait_s``: then the read waits for it and is
    answered whole."""
    a, _, c = nodes
    members = {n.name: n.member() for n in nodes}
    pods = [i for i in range(2000) if _slot(labels(i)) == 0][:3]
    for i in pods:
        write(a.store, range(i, i + 1), [T0 + 1000, T0 + 2000])
    slots = tuple(("s0", "s1") if s == 0 else ("s0", "s1", "s2") for s in range(SLOTS))
    source = StaticMapSource(ShardMap(1, 3, slots, members))
    readiness = SlotReadiness("s2")
    owner = OwnershipBackend(LocalBackend(c.api), "s2", source, store_write_slots(c.store), readiness=readiness)
    impatient = OwnershipBackend(LocalBackend(c.api), "s2", source, store_write_slots(c.store), readiness=readiness,
                                 catch_up_wait_s=0.0)
    settings = SyncSettings(interval_s=3600, window_ms=3_600_000, retry_s=0.05)
    sync = ReplicaSync(c.store, local_apply(c.store), c.api, "s2", source, SystemClock(), settings,
                       readiness=readiness)
    read = pb.ReadRequest(matchers=[pb.Matcher(type=pb.Matcher.EQ, name="namespace", value="ns"),
                                    pb.Matcher(type=pb.Matcher.EQ, name="pod", value=f"p{pods[0]}")],
                          start_ms=T0, end_ms=T0 + 10_000, slots=pb.SlotFilter(slot_count=SLOTS, slots=[0]))
    task = asyncio.ensure_future(sync.run())
    try:
        async with asyncio.timeout(20):
            while sync.counters.catch_ups < 1:
                await asyncio.sleep(0.02)
        other = pb.ReadRequest(start_ms=T0, end_ms=T0 + 10_000, slots=pb.SlotFilter(slot_count=SLOTS, slots=[1]))
        await owner.read(other)  # slots of the first map are served
        source.set(ShardMap(2, 3, (("s1", "s2"), *slots[1:]), members))  # slot 0: -s0 +s2
        with pytest.raises(NotOwner, match=r"member s2 is still catching up slot 0, given to it in shard map "
                                           r"version 2; read refused until it is level \(writes are taken\)"):
            await impatient.read(read)
        with pytest.raises(NotOwner, match="catching up"):
            await impatient.aggregate(pb.AggregateRequest(slots=pb.SlotFilter(slot_count=SLOTS, slots=[0, 1])))
        labs = labels(pods[1])
        resp = await owner.write(pb.WriteRequest(ids=[series_id(labs)], counts=[1], timestamps=[T0 + 3000],
                                                 values=[1.0], series=[pb.SeriesLabels(id=series_id(labs),
                                                                                       labels=labels_to_pb(labs))]))
        assert resp.samples_written == 1 and sync.counters.catch_ups == 1
        got = await owner.read(read)  # waits for the catch-up (the next loop turn, within 0.5 s)
        assert [list(s.timestamps) for s in got.series] == [[T0 + 1000, T0 + 2000]]  # copied from s0
        assert not readiness.any and sync.counters.catch_ups == 2
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await sync.close()


def _slot(lab: tuple[tuple[str, str], ...]) -> int:
    from metricsd.maths.slots import slot_of_labels

    return slot_of_labels(lab, SLOTS)


async def test_a_member_publishes_its_state_and_the_map_carries_it(kv: KV, prefix: str) -> None:
    layout = KeyLayout(root=prefix.rstrip("/"), cluster="c1")
    reg = MemberRegistration(kv, layout, Member("store-1", "127.0.0.1:7101", MemberState.JOINING), ttl=3,
                             retry_s=0.05)
    reg.start()
    try:
        await asyncio.wait_for(reg.registered.wait(), 10)
        got = await kv.get(layout.member_key("store-1"))
        assert got is not None and Member.from_json(got.value).state is MemberState.JOINING
        await reg.set_state(MemberState.ACTIVE)
        got = await kv.get(layout.member_key("store-1"))
        assert got is not None and Member.from_json(got.value).state is MemberState.ACTIVE
    finally:
        await reg.close(deregister=True)
    joining = {"a": Member("a", "127.0.0.1:1", MemberState.JOINING), "b": Member("b", "127.0.0.1:2")}
    first = assign(joining, None, 4, 2)
    assert first.members["a"].state is MemberState.JOINING
    again = assign({**joining, "a": Member("a", "127.0.0.1:1")}, first, 4, 2)
    assert again.version == 2 and again.slots == first.slots and again.members["a"].state is MemberState.ACTIVE


class FakeView:
    def __init__(self, healthy: set[str]) -> None:
        self.health = self
        self._healthy = healthy

    def healthy(self, members: Any) -> set[str]:
        return {m for m in members if m in self._healthy}

    def quorum(self, shard_map: ShardMap) -> QuorumSettings:
        return QuorumSettings(3, 2, 2)

    def rotation(self) -> int:
        return 0


def test_reads_leave_out_a_joining_replica_unless_too_few_others_are_up() -> None:
    members = {"a": Member("a", "127.0.0.1:1", MemberState.JOINING), "b": Member("b", "127.0.0.1:2"),
               "c": Member("c", "127.0.0.1:3")}
    shard_map = ShardMap(1, 3, (("a", "b", "c"),), members)
    (plan,) = plan_reads(FakeView({"a", "b", "c"}), shard_map, [0])  # type: ignore[arg-type]
    assert set(plan.targets) == {"b", "c"} and plan.spares == ("a",)  # asked only when b or c fails
    (plan,) = plan_reads(FakeView({"a", "b"}), shard_map, [0])  # type: ignore[arg-type]
    assert set(plan.targets) | set(plan.spares) == {"a", "b", "c"}  # better a union with it than no answer


def test_the_fault_schedule_is_seeded_and_one_store_is_away_at_a_time() -> None:
    first = plan_events(1, 600, 4, 2)
    assert first == plan_events(1, 600, 4, 2) and first != plan_events(2, 600, 4, 2)
    kinds = {e.kind for e in plan_events(3, 60, 4, 2)}
    assert kinds == {"kill_store", "wipe_store", "corrupt_store", "kill_launcher", "fill_disk", "stop_etcd",
                     "kill_proxy"}
    assert {e.target for e in plan_events(3, 600, 4, 2) if e.kind == "fill_disk"} == {"store-1"}
    assert "fill_disk" not in {e.kind for e in plan_events(3, 60, 4, 2, disk_store=None)}
    kills = [e for e in first if e.kind.endswith("_store")]
    assert all(x.at_s + x.down_s < y.at_s for x, y in itertools.pairwise(kills))
    assert all(0 < e.at_s < 600 for e in first) and all(e.target.startswith("store-") for e in kills)


def test_lost_samples_names_missing_and_changed_acknowledged_samples() -> None:
    w = Workload(pods=4, metrics=2, writers=2, seed=7)
    log = AckLog()
    log.ack(0, T0, 4)
    log.ack(1, T0, 4)
    assert log.count(w) == 8
    found: dict[int, dict[int, float]] = {}
    for writer in (0, 1):
        index = np.array([i for i, _ in w.series(writer)])
        for i, v in zip(index.tolist(), w.values(index, T0).tolist(), strict=True):
            found[i] = {T0: v}
    assert lost_samples(w, log, found) == []
    found[3] = {}
    found[5] = {T0: found[5][T0] + 1}
    assert sorted(lost_samples(w, log, found)) == [(3, T0), (5, T0)]
