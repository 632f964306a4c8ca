"""A cluster store keeping level with the other replicas of its slots.

:class:`ReplicaSync` runs in the store process, next to its gRPC server:

1. **Catch-up.** When the first shard map arrives (the store started: after a crash it holds what
   its WAL kept, after a wipe nothing) it brings every slot it holds level with every other
   replica of it over the window (default: the store's retention), copying only the time buckets
   whose digests differ (catchup_client.sync_slots): it ends with the union of what they hold, so
   a sample acknowledged by W replicas survives one of them being wiped even when the others had
   not received it yet. Slots a later map gives it are caught up the same way, and also from the
   replicas that held them in the map before: a store that loses a slot keeps its samples, and
   may hold the only copy of some (it acknowledged them with a replica that was wiped since).
   While any catch-up runs the store answers Health with CATCHING_UP; once a slot's digests show
   that it lacks data its member record says ``joining`` too, so proxies leave it out of read
   quorums (it still takes writes), and the slots a later map gave it are refused to reads by the
   store itself from the moment it sees that map (readiness.py), without waiting for the record to
   go round through etcd; when all are done it says SERVING / ``active`` again. A store
   that finds nothing to copy (a new cluster, a quick restart that missed nothing) never leaves
   ``active``, so the map does not change for it.
2. **Anti-entropy.** Every ``interval_s`` it compares a few slots (``slots_per_round``, round
   robin) with one other replica each (rotating) up to ``settle_ms`` ago, and copies what differs.
   Each replica pulls what it lacks, so replicas converge without a coordinator.

Anti-entropy picks its peer among the slot's other replicas in the map, ``active`` ones first; a
peer that fails is skipped for the rest of that pass. A catch-up asks all of them; a slot is
level once one of its current replicas answered (or it has no other), else it is retried after
``retry_s``; a replica that failed meanwhile is compared by anti-entropy later.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import grpc

from metricsd.clock import Clock
from metricsd.cluster.mapsource import MapSource
from metricsd.cluster.member import describe_slots
from metricsd.cluster.membership import MemberEvent, transition
from metricsd.cluster.shardmap import MemberState, ShardMap
from metricsd.defaults import ANTI_ENTROPY_INTERVAL_S
from metricsd.proto import metricsd_pb2 as pb
from metricsd.proto import metricsd_pb2_grpc as pb_grpc
from metricsd.replica.catchup_client import Apply, CatchUpError, CatchUpStats, sync_slots
from metricsd.replica.readiness import SlotReadiness
from metricsd.rpc.channel import open_channel
from metricsd.security.settings import ClientSecurity
from metricsd.store.api import StoreAPI
from metricsd.store.engine import Store
from metricsd.store.wal import WalError

__all__ = ["ReplicaSync", "SyncSettings"]

log = logging.getLogger("metricsd.replica.replication")

Publish = Callable[[MemberState], Awaitable[None]]


@dataclass(frozen=True)
class SyncSettings:
    """How a store keeps level with its peers.

    interval_s: seconds between anti-entropy rounds. A round digests its slots over the whole
        window from the hash sums each sealed chunk keeps (metricsd/store/chunks.py), decoding
        only the chunks cut by the window's edges, and hashing the heads' newest samples: every
        minute, with 64 slots a pass takes 4 minutes. Before the sums were kept a round decoded
        every chunk and, every 30 s, cost more CPU than the writes on a 40,000-series cluster
        (perf/RESULTS.md, "Anti-entropy digests"). Hinted hand-off and read repair do the quick
        repairs; this is the backstop.
    slots_per_round: slots compared per round (bounded work; a full pass takes
        held slots / slots_per_round rounds).
    window_ms: how far back catch-up and anti-entropy look; None: the store's retention.
    settle_ms: anti-entropy leaves the newest samples alone: writes still in flight (or in
        hinted hand-off) would look like differences.
    lead_ms: a catch-up copies up to this far past the clock (writers' clocks may run ahead).
    bucket_ms: width of the digest time buckets; a differing bucket is copied whole.
    page_samples: samples per CatchUp page.
    retry_s: pause before retrying slots whose catch-up failed.
    call_timeout_s: per Digest call and per CatchUp stream (a stream cut by it resumes).
    """

    interval_s: float = ANTI_ENTROPY_INTERVAL_S
    slots_per_round: int = 16
    window_ms: int | None = None
    settle_ms: int = 10_000
    lead_ms: int = 60_000
    bucket_ms: int = 600_000
    page_samples: int = 20_000
    retry_s: float = 1.0
    call_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        if self.interval_s <= 0 or self.slots_per_round < 1 or self.bucket_ms < 1 or self.retry_s <= 0:
            raise ValueError("interval, slots per round, bucket width and retry must be positive")


@dataclass
class SyncCounters:
    catch_ups: int = 0
    level_seconds: list[float] = field(default_factory=list)
    rounds: int = 0
    repaired_samples: int = 0
    failures: int = 0
    copied: CatchUpStats = field(default_factory=CatchUpStats)


class ReplicaSync:
    """Not thread-safe: runs on the store's event loop, like its gRPC handlers."""

    def __init__(self, store: Store, apply: Apply, api: StoreAPI, member_id: str, maps: MapSource, clock: Clock,
                 settings: SyncSettings | None = None, *, publish: Publish | None = None,
                 security: ClientSecurity | None = None, behind: bool = False,
                 readiness: SlotReadiness | None = None) -> None:
        self.store = store
        self.apply = apply
        self.api = api
        self.member_id = member_id
        self.maps = maps
        self.clock = clock
        self.settings = settings or SyncSettings()
        self.publish = publish
        self.security = security  # TLS and the (admin) token towards peers
        self.counters = SyncCounters()
        self._held: set[int] = set()
        self._pending: set[int] = set()
        # Slots a map change gave this member, whose reads the ownership check refuses until
        # their catch-up below is done (readiness.py); shared with the OwnershipBackend.
        self.readiness = readiness or SlotReadiness(member_id)
        # What the store registered as (metricsd/cmd/store.py): joining when its restart lost data
        # (``behind``), so no proxy reads from it until a catch-up has copied what it lacks.
        self._published = MemberState.JOINING if behind else MemberState.ACTIVE
        self._cursor = 0
        self._rotation = 0
        self._channels: dict[str, tuple[grpc.aio.Channel, pb_grpc.MetricsStub]] = {}

    @property
    def level(self) -> bool:
        return self.api.status == pb.HealthResponse.SERVING

    def _window(self) -> int:
        return self.settings.window_ms or self.store.settings.retention_ms

    def stub(self, address: str) -> pb_grpc.MetricsStub:
        have = self._channels.get(address)
        if have is None:
            channel = open_channel(address, self.security)
            have = (channel, pb_grpc.MetricsStub(channel))
            self._channels[address] = have
        return have[1]

    async def close(self) -> None:
        channels, self._channels = self._channels, {}
        for channel, _ in channels.values():
            with contextlib.suppress(Exception):
                await channel.close(None)

    # --- the loop ---------------------------------------------------------------------------

    async def run(self) -> None:
        """Catch up, then keep level; until cancelled."""
        self.api.status = pb.HealthResponse.CATCHING_UP
        shard_map = await self._first_map()
        self.readiness.observe(shard_map)
        self._held = set(shard_map.slots_of(self.member_id))
        await self.catch_up(self._held)
        seen = shard_map
        next_round = self.clock.monotonic() + self.settings.interval_s
        while True:
            # Asleep until the map changes or the round is due (it looked twice a second: 0.2-0.3
            # of a store's ~2 ms of CPU a second idle, perf/RESULTS.md "Session 42, s42-24i").
            current = await self.maps.next_map(seen, max(0.0, next_round - self.clock.monotonic()))
            if current is not None:
                self.readiness.observe(current)
                held = set(current.slots_of(self.member_id))
                # Slots the ownership check refuses are caught up even when this loop did not see
                # them go and come back between two of its looks (never refused for good).
                gained = (held - self._held) | (self.readiness.gaining() & held)
                self._held = held
                if gained:
                    log.info("member %s gained slots %s: catching up", self.member_id, describe_slots(gained))
                    await self.catch_up(gained, former=seen)
                seen = current
            if current is None or self.clock.monotonic() >= next_round:
                await self.anti_entropy_round()
                next_round = self.clock.monotonic() + self.settings.interval_s

    async def _first_map(self) -> ShardMap:
        while True:
            current = await self.maps.next_map(None, 60.0)
            if current is not None:
                return current

    async def _set_state(self, event: MemberEvent) -> None:
        state = transition(self._published, event)
        self.api.status = (pb.HealthResponse.CATCHING_UP if state is MemberState.JOINING
                           else pb.HealthResponse.SERVING)
        await self._publish(event)

    async def _publish(self, event: MemberEvent) -> None:
        state = transition(self._published, event)
        if self.publish is not None and state is not self._published:
            self._published = state
            try:
                await self.publish(state)
            except Exception as e:  # etcd unreachable: the registration loop writes the state later
                log.warning("member %s: cannot publish state %s: %s", self.member_id, state.value, e)

    async def catch_up(self, slots: set[int], former: ShardMap | None = None) -> CatchUpStats:
        """Bring ``slots`` level with every other replica of each, and with its replicas in
        ``former`` (the map before a new one gave them to this store), retrying until done or no
        longer held; reports CATCHING_UP / joining meanwhile."""
        t0 = self.clock.monotonic()
        self._pending |= slots
        self.api.status = pb.HealthResponse.CATCHING_UP
        total = CatchUpStats()
        now = self.clock.now_ms()
        start, end = now - self._window(), now + self.settings.lead_ms
        while self._pending:
            current = self.maps.current()
            assert current is not None
            self._pending &= set(current.slots_of(self.member_id))
            stats, done = await self._sync_all(current, former, sorted(self._pending), start, end,
                                               on_differ=lambda: self._publish(MemberEvent.BEHIND))
            self._pending -= done
            total.add(stats)
            if self._pending:
                await asyncio.sleep(self.settings.retry_s)
        took = self.clock.monotonic() - t0
        self.counters.catch_ups += 1
        self.counters.level_seconds.append(took)
        self.counters.copied.add(total)
        log.info("member %s level with its peers after %.2f s: %d slots compared, %d differed, %d samples copied "
                 "(%d pages, %d resumes)", self.member_id, took, total.slots_compared, total.slots_differing,
                 total.samples_written, total.pages, total.resumes)
        self.readiness.level(slots)
        await self._set_state(MemberEvent.LEVEL)
        return total

    async def anti_entropy_round(self) -> CatchUpStats:
        """Compare the next ``slots_per_round`` held slots with one peer each; copy what differs."""
        current = self.maps.current()
        held = sorted(self._held)
        if current is None or not held:
            return CatchUpStats()
        n = min(self.settings.slots_per_round, len(held))
        picked = [held[(self._cursor + i) % len(held)] for i in range(n)]
        self._cursor = (self._cursor + n) % len(held)
        self._rotation += 1
        now = self.clock.now_ms()
        end = now - self.settings.settle_ms
        stats = await self._sync(current, picked, end - self._window(), end)
        self.counters.rounds += 1
        self.counters.repaired_samples += stats.samples_written
        self.counters.copied.add(stats)
        if stats.samples_written:
            log.info("anti-entropy: %d of %d slots differed; %d samples copied", stats.slots_differing,
                     stats.slots_compared, stats.samples_written)
        return stats

    def _peers(self, shard_map: ShardMap, slot: int, skip: set[str]) -> list[str]:
        others = [m for m in shard_map.replicas(slot) if m != self.member_id and m not in skip]
        k = self._rotation % len(others) if others else 0
        others = others[k:] + others[:k]
        active = [m for m in others if shard_map.members[m].state is MemberState.ACTIVE]
        return active + [m for m in others if m not in active]

    async def _pull(self, peer: str, address: str, num_slots: int, slots: list[int], start: int, end: int,
                    on_differ: Callable[[], Awaitable[None]] | None) -> CatchUpStats | None:
        """What ``peer`` holds of ``slots`` and this store lacks, copied; None (logged) when it fails."""
        s = self.settings
        try:
            return await sync_slots(self.stub(address), self.store, self.apply, num_slots, slots, start, end,
                                    s.bucket_ms, page_samples=s.page_samples, timeout_s=s.call_timeout_s,
                                    on_differ=on_differ)
        except (grpc.aio.AioRpcError, CatchUpError, WalError) as e:
            self.counters.failures += 1
            why = f"{e.code().name}: {e.details()}" if isinstance(e, grpc.aio.AioRpcError) else str(e)
            log.warning("member %s: syncing slots %s from %s failed: %s", self.member_id, describe_slots(slots),
                        peer, why)
            return None

    async def _sync_all(self, shard_map: ShardMap, former: ShardMap | None, slots: list[int], start: int, end: int,
                        on_differ: Callable[[], Awaitable[None]]) -> tuple[CatchUpStats, set[int]]:
        """One pass of a catch-up: each slot against every other replica of it in ``shard_map``
        and in ``former``. Returns what was copied and the slots done: one of their current
        replicas answered, or they have none but this store."""
        total = CatchUpStats()
        done: set[int] = set()
        by_peer: dict[tuple[str, str], list[int]] = {}
        for slot in slots:
            current = [m for m in shard_map.replicas(slot) if m != self.member_id]
            if not current:
                done.add(slot)  # the only replica: nothing to copy from
            peers = [(m, shard_map.address(m)) for m in current]
            if former is not None and slot < former.num_slots:
                peers += [(m, former.address(m)) for m in former.replicas(slot)
                          if m != self.member_id and m not in current]
            for source in peers:
                by_peer.setdefault(source, []).append(slot)
        for (peer, address), peer_slots in by_peer.items():
            stats = await self._pull(peer, address, shard_map.num_slots, peer_slots, start, end, on_differ)
            if stats is None:
                continue
            total.add(stats)
            done.update(slot for slot in peer_slots if peer in shard_map.replicas(slot))
        return total, done

    async def _sync(self, shard_map: ShardMap, slots: list[int], start: int, end: int) -> CatchUpStats:
        """One anti-entropy pass: each slot against its first usable peer (rotating); a peer that
        fails is skipped for the slots left in the pass."""
        total = CatchUpStats()
        failed: set[str] = set()
        todo = list(slots)
        while todo:
            by_peer: dict[str, list[int]] = {}
            for slot in todo:
                peers = self._peers(shard_map, slot, failed)
                if peers:
                    by_peer.setdefault(peers[0], []).append(slot)
            todo = []
            for peer, peer_slots in by_peer.items():
                stats = await self._pull(peer, shard_map.address(peer), shard_map.num_slots, peer_slots, start, end,
                                         None)
                if stats is None:
                    failed.add(peer)
                    todo.extend(peer_slots)
                    continue
                total.add(stats)
        return total
