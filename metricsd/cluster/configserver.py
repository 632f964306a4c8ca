"""The config server: assigns slots to live store members and writes the shard map.

Several run; one leads through :class:`~metricsd.cluster.election.LeaderElection` on the leader
key, the others stand by and campaign again when its key goes (it resigned, or its lease expired:
a stand-by takes over within one lease TTL). Only the leader writes the map:

1. It watches the member records. A change starts a short debounce (``debounce_s``, slept on the
   injected ``sleep``) so that a burst (a cluster starting, a rolling restart, stores
   re-registering after an etcd outage) yields one new map rather than several moves.
2. It reads every member record and the map, calls the pure :func:`~metricsd.cluster.assign.assign`
   (live members, old map) and, when the result differs, writes it with a compare-and-swap on
   the map key's revision guarded by its leader key's revision: a deposed leader that has not
   noticed yet cannot overwrite its successor's map, and a lost race is simply retried.
3. Every change is logged with the replicas that moved.

Safety rules on top of ``assign``: no map is ever written with no members (a cluster that lost all
its stores' records, say after etcd lost their leases, keeps its last map until they return); the
first map waits for ``min_members`` registrations; the slot count of an existing map is kept.

A member of the map without a record is kept in it for one lease TTL (plus the debounce) after a
term begins and after the member watch comes back from an etcd outage: those are the moments when
live stores are still re-registering. Moving a live store's slots away and back costs two rounds
of catch-up, and the stores that gain the slots briefly hold less than the one that lost them (a
chaos run with an etcd outage moved 12 replicas away from a store that re-registered 0.8 s later).
A member still without a record after that is taken out as before.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from metricsd import __version__
from metricsd.cluster.assign import assign, moved_replicas
from metricsd.cluster.election import LeaderElection
from metricsd.cluster.kv import KV, KVError, WatchCompacted, cancel_and_wait
from metricsd.cluster.shardmap import KeyLayout, MemberState, ShardMap, ShardMapError, validate_member_id
from metricsd.maths.slots import DEFAULT_SLOTS
from metricsd.proto import metricsd_pb2 as pb

__all__ = ["ConfigServer", "ConfigServerSettings", "describe_changes"]

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ConfigServerSettings:
    """One config server. ``num_slots`` applies only to a cluster's first map."""

    server_id: str
    num_slots: int = DEFAULT_SLOTS
    rf: int = 3
    lease_ttl: int = 5
    debounce_s: float = 1.0
    min_members: int = 1
    retry_s: float = 0.5

    def __post_init__(self) -> None:
        validate_member_id(self.server_id)
        if self.num_slots < 1 or self.rf < 1 or self.min_members < 1:
            raise ValueError("slots, rf and min-members must each be at least 1")
        if self.lease_ttl < 2:
            raise ValueError(f"the lease TTL must be at least 2 s (etcd's minimum), got {self.lease_ttl}")


def describe_changes(old: ShardMap | None, new: ShardMap, limit: int = 12) -> list[str]:
    """One line per changed slot, ``"slot 5: +store-4 -store-1"``; at most ``limit`` plus a count."""
    lines = []
    for i, replicas in enumerate(new.slots):
        before = old.slots[i] if old is not None and i < old.num_slots else ()
        added = [m for m in replicas if m not in before]
        removed = [m for m in before if m not in replicas]
        if added or removed:
            lines.append(f"slot {i}: " + " ".join([f"+{m}" for m in added] + [f"-{m}" for m in removed]))
    if len(lines) > limit:
        lines = [*lines[:limit], f"... and {len(lines) - limit} more slots"]
    return lines


class ConfigServer:
    """Campaign, lead (watch members, assign, write the map), stand by after losing; until closed."""

    def __init__(self, kv: KV, layout: KeyLayout, settings: ConfigServerSettings, *,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.kv = kv
        self.layout = layout
        self.settings = settings
        self.sleep = sleep
        self.clock = clock
        self._grace_until = 0.0  # clock() before which members of the map without a record are kept
        self._recheck_at: float | None = None  # when a kept member's grace ends, reconcile again
        self.election = LeaderElection(kv, layout.leader_key, settings.server_id, settings.lease_ttl,
                                       retry_s=settings.retry_s)
        self.maps_written = 0
        self.terms = 0
        self._task: asyncio.Task[None] | None = None

    @property
    def is_leader(self) -> bool:
        return self.election.is_leader

    def start(self) -> None:
        if self._task is None:
            name = f"config-server-{self.settings.server_id}"
            self._task = asyncio.get_running_loop().create_task(self.run(), name=name)

    async def close(self) -> None:
        """Stop, resigning if leading so that a stand-by takes over at once."""
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait(task)
        await self.election.close()

    async def health(self) -> pb.HealthResponse:
        return pb.HealthResponse(status=pb.HealthResponse.SERVING, member=self.settings.server_id,
                                 version=__version__)

    async def run(self) -> None:
        sid = self.settings.server_id
        while True:
            _log.info("%s: campaigning for %s", sid, self.layout.leader_key)
            await self.election.campaign()
            self.terms += 1
            self.begin_grace()
            _log.info("%s: leading (term at revision %d); assigning %s", sid, self.election.leader_revision,
                      self.layout.base)
            try:
                await self._lead()
            except KVError as e:
                _log.warning("%s: leader work interrupted: %s", sid, e)
            if self.election.is_leader:  # _lead only returns early on an error; let someone else try
                await self.election.resign()
                await self.sleep(self.settings.retry_s)

    def begin_grace(self) -> None:
        """Keep members of the map that have no record for one lease TTL plus the debounce from
        now (a term begins, or the member watch is back after an etcd outage)."""
        self._grace_until = self.clock() + self.settings.lease_ttl + self.settings.debounce_s

    async def _lead(self) -> None:
        dirty = asyncio.Event()
        dirty.set()
        deposed = self.election.deposed
        watcher = asyncio.get_running_loop().create_task(self._watch_members(dirty), name="members-watch")
        try:
            while self.election.is_leader:
                waiters = [asyncio.ensure_future(dirty.wait()), asyncio.ensure_future(deposed.wait())]
                try:
                    await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for w in waiters:
                        await cancel_and_wait(w)
                if not self.election.is_leader:
                    return
                await self.sleep(self.settings.debounce_s)
                dirty.clear()
                try:
                    if not await self.reconcile():
                        dirty.set()
                    elif self._recheck_at is not None:  # a member kept by the grace: look again after it
                        asyncio.get_running_loop().call_later(max(0.0, self._recheck_at - self.clock()), dirty.set)
                except KVError as e:
                    _log.warning("%s: cannot update the shard map, retrying: %s", self.settings.server_id, e)
                    dirty.set()
                    await self.sleep(self.settings.retry_s)
        finally:
            await cancel_and_wait(watcher)
            _log.info("%s: leader work stopped", self.settings.server_id)

    async def _watch_members(self, dirty: asyncio.Event) -> None:
        prefix = self.layout.members_prefix
        interrupted = False
        while True:
            try:
                result = await self.kv.range(prefix)
                if interrupted:  # etcd is back: stores whose leases it lost are re-registering
                    self.begin_grace()
                    interrupted = False
                dirty.set()
                async for _ in self.kv.watch(prefix, result.revision + 1):
                    dirty.set()
            except WatchCompacted:
                continue
            except KVError as e:
                _log.warning("%s: member watch interrupted: %s", self.settings.server_id, e)
                interrupted = True
                await self.sleep(self.settings.retry_s)

    async def reconcile(self) -> bool:
        """Bring the map in line with the member records once. Returns False when the write lost
        a race (the caller retries); True when the map is current or deliberately left alone."""
        s = self.settings
        result = await self.kv.range(self.layout.members_prefix)
        members, errors = self.layout.members_from((item.key, item.value) for item in result.items)
        for error in errors:
            _log.error("%s: %s", s.server_id, error)
        live = {mid: m for mid, m in members.items() if m.state is not MemberState.LEAVING}
        current = await self.kv.get(self.layout.map_key)
        old: ShardMap | None = None
        if current is not None:
            try:
                old = ShardMap.from_json(current.value)
            except ShardMapError as e:
                _log.error("%s: the stored shard map is invalid and will be replaced: %s", s.server_id, e)
        num_slots = s.num_slots
        if old is not None and old.num_slots != s.num_slots:
            _log.warning("%s: the map has %d slots, not the configured %d; keeping %d (the slot count is "
                         "fixed when a cluster is created)", s.server_id, old.num_slots, s.num_slots, old.num_slots)
            num_slots = old.num_slots
        if not live:
            _log.warning("%s: no live members; keeping the shard map as it is", s.server_id)
            return True
        if (old is None or not old.members) and len(live) < s.min_members:
            _log.info("%s: %d of %d members registered; waiting before the first map", s.server_id, len(live),
                      s.min_members)
            return True
        self._recheck_at = None
        unregistered = sorted(m for m in (old.members if old is not None else {}) if m not in members)
        if unregistered and old is not None and self.clock() < self._grace_until:
            _log.info("%s: %s in the map without a record; keeping %s for %.1f s more (stores re-register after "
                      "an etcd outage or a new leader)", s.server_id, ", ".join(unregistered),
                      "it" if len(unregistered) == 1 else "them", self._grace_until - self.clock())
            live = {**live, **{m: old.members[m] for m in unregistered}}
            self._recheck_at = self._grace_until
        new = assign(live, old, num_slots, s.rf)
        if new is old:
            return True
        if not self.election.is_leader:
            return True
        ok = await self.kv.compare_and_swap(
            self.layout.map_key, 0 if current is None else current.mod_revision, new.to_json(),
            guards={self.layout.leader_key: self.election.leader_revision},
        )
        if not ok:
            _log.warning("%s: the shard map or the leader key changed during the update; re-reading", s.server_id)
            return False
        self.maps_written += 1
        moved = moved_replicas(old.slots, new.slots) if old is not None else sum(len(r) for r in new.slots)
        _log.info("%s: shard map v%d -> v%d: %d replicas moved; members %s; %s", s.server_id,
                  0 if old is None else old.version, new.version, moved, ", ".join(sorted(live)), new)
        for line in describe_changes(old, new):
            _log.info("%s:   %s", s.server_id, line)
        return True
