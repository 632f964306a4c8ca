"""The proxy's view of the cluster: the newest shard map, a connection per member, member health.

Every call to a store goes through :meth:`ClusterView.call`, which applies the per-call timeout
and retries and reports the outcome to :class:`MemberHealth`. The map comes from the MapSource
without blocking: when etcd is unreachable the source keeps the last map and so does the proxy.

A member marked down is watched through its gRPC channel: when the channel, having lost its
connection, is READY again (the store restarted: it serves only after its recovery), the member is
healthy at once and the listeners of :meth:`on_back` hear of it (hinted hand-off delivers then),
instead of waiting for the health and hand-off back-offs (up to 5 s each) to run out. A member
that failed while its channel stayed connected (a timeout: a slow or paused store) is left to
the back-off: only a reconnection counts as coming back.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import TypeVar

import grpc

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

    WATCH_ROUND_S = 1.0  # a down member's watch re-checks its health at least this often

    def __init__(self, map_source: MapSource, settings: ProxySettings, clock: Clock, connect: Connect,
                 counters: Counter[str]) -> None:
        self.map_source = map_source
        self.settings = settings
        self.clock = clock
        self.counters = counters
        self.pool = MemberPool(connect)
        self.health = MemberHealth(settings.health, clock, on_down=self._watch)
        self.known = KnownIds(settings.known_ids_per_member)
        self._version: int | None = None
        self._refreshing: asyncio.Task[None] | None = None
        self._rotation = 0
        self._watchers: dict[str, asyncio.Task[None]] = {}
        self._back_listeners: list[Callable[[str], None]] = []

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

    def on_back(self, listener: Callable[[str], None]) -> None:
        """``listener(member)`` is called when a member marked down reconnects."""
        self._back_listeners.append(listener)

    def _watch(self, member: str) -> None:
        """Health's on_down: watch the member's channel until it reconnects or is healthy again."""
        have = self._watchers.get(member)
        if have is not None and not have.done():
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop (a synchronous test of the health table): nothing to watch with
        task = loop.create_task(self._await_reconnect(member), name=f"reconnect-{member}")
        self._watchers[member] = task
        task.add_done_callback(self._watch_ended)

    def _watch_ended(self, task: asyncio.Task[None]) -> None:
        """Forget a finished watch, unless a newer one for its member already took its place."""
        member = task.get_name().removeprefix("reconnect-")
        if self._watchers.get(member) is task:
            del self._watchers[member]

    async def _await_reconnect(self, member: str) -> None:
        shard_map = self.map_source.current()
        if shard_map is None or member not in shard_map.members:
            return
        channel = getattr(self.pool.get(shard_map, member), "channel", None)
        if not isinstance(channel, grpc.aio.Channel):
            return  # an in-process backend: nothing reconnects
        state = channel.get_state(try_to_connect=False)
        lost = False
        while self.health.failed(member):
            if state != grpc.ChannelConnectivity.READY:
                lost = True
            elif lost:
                self.health.success(member)
                log.info("%s: reconnected; healthy again, hinted hand-off resumes", member)
                for listener in self._back_listeners:
                    listener(member)
                return
            try:
                async with asyncio.timeout(self.WATCH_ROUND_S):  # also notices a success by another call
                    await channel.wait_for_state_change(state)
            except TimeoutError:
                pass
            self.counters["reconnect_watch_rounds"] += 1
            try:
                state = channel.get_state(try_to_connect=True)
            except Exception as e:  # the channel was closed (the member left the map)
                log.debug("%s: stopped watching its channel: %s", member, e)
                return

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
        tasks = list(self._watchers.values())
        if self._refreshing is not None:
            tasks.append(self._refreshing)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.pool.close()
