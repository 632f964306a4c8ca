"""The proxy's view of the cluster: the newest shard map, a connection per member, member health.

Every call to a store goes through :meth:`ClusterView.call`, which applies the per-call timeout
and retries and reports the outcome to :class:`MemberHealth`. The map comes from the MapSource
without blocking: when etcd is unreachable the source keeps the last map and so does the proxy.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import TypeVar

from metricsd.clock import Clock
from metricsd.cluster.mapsource import MapSource
from metricsd.cluster.shardmap import ShardMap
from metricsd.proxy.health import MemberHealth
from metricsd.proxy.members import Connect, MemberPool, SlotNotHeld, call_with_retries, is_slot_not_held
from metricsd.proxy.quorum import QuorumSettings
from metricsd.proxy.routing import KnownIds
from metricsd.proxy.settings import ProxySettings
from metricsd.rpc.backend import BadRequest, MetricsBackend, Unavailable

__all__ = ["ClusterView"]

log = logging.getLogger("metricsd.proxy")

T = TypeVar("T")


class ClusterView:
    """Not thread-safe (one event loop)."""

    def __init__(self, map_source: MapSource, settings: ProxySettings, clock: Clock, connect: Connect,
                 counters: Counter[str]) -> None:
        self.map_source = map_source
        self.settings = settings
        self.clock = clock
        self.counters = counters
        self.pool = MemberPool(connect)
        self.health = MemberHealth(settings.health, clock)
        self.known = KnownIds(settings.known_ids_per_member)
        self._version: int | None = None
        self._refreshing: asyncio.Task[None] | None = None
        self._rotation = 0

    def current_map(self) -> ShardMap:
        """The newest map; raises Unavailable before the first one. Drops the connections, health
        and known ids of members a new map no longer names."""
        shard_map = self.map_source.current()
        if shard_map is None:
            raise Unavailable("no shard map yet: the proxy has not reached the cluster's configuration")
        if shard_map.version != self._version:
            if self._version is not None:
                log.info("routing on shard map v%d (was v%s)", shard_map.version, self._version)
            self._version = shard_map.version
            gone = self.pool.prune(shard_map)
            gone += [m for m in self.health.down() if m not in shard_map.members]
            self.health.forget(gone)
            self.known.forget(gone)
        return shard_map

    def quorum(self, shard_map: ShardMap) -> QuorumSettings:
        try:
            return self.settings.quorum(shard_map.rf)
        except ValueError as e:
            raise Unavailable(f"quorum settings do not fit shard map v{shard_map.version}: {e}") from e

    def rotation(self) -> int:
        """A counter the read planner rotates replicas by, to spread reads."""
        self._rotation += 1
        return self._rotation

    async def call(self, shard_map: ShardMap, member: str, fn: Callable[[MetricsBackend], Awaitable[T]],
                   retries: int | None = None) -> T:
        """``fn(backend of member)`` with timeout and retries. Raises BadRequest, SlotNotHeld (the
        map is stale; the member is not marked down) or Unavailable (the member is marked down)."""
        backend = self.pool.get(shard_map, member)
        s = self.settings
        try:
            result = await call_with_retries(lambda: fn(backend), s.call_timeout_s,
                                             s.retries if retries is None else retries, s.retry_backoff_s)
        except BadRequest:
            raise
        except Unavailable as e:
            if is_slot_not_held(e):
                raise SlotNotHeld(str(e)) from e
            self.health.failure(member, str(e))
            raise
        self.health.success(member)
        return result

    async def refresh(self) -> ShardMap:
        """Ask the source to re-read the map now; raises Unavailable when there is none."""
        self.counters["map_refreshes"] += 1
        try:
            await self.map_source.refresh()
        except Exception as e:  # etcd down: keep the map we have
            log.warning("shard map refresh failed, keeping v%s: %s", self._version, e)
        return self.current_map()

    def refresh_soon(self) -> None:
        """A store said it does not hold a slot but the request succeeded anyway: refresh in the
        background, once at a time."""
        if self._refreshing is None or self._refreshing.done():
            async def run() -> None:
                await self.refresh()

            self._refreshing = asyncio.get_running_loop().create_task(run())

    async def close(self) -> None:
        if self._refreshing is not None:
            self._refreshing.cancel()
            await asyncio.gather(self._refreshing, return_exceptions=True)
        await self.pool.close()
