"""The shard map as proxies and stores see it: read from etcd, then followed through a watch.

:class:`EtcdMapSource` reads the map key, then watches it from the revision after the read, so no
change can slip between the two. While etcd is unreachable it keeps serving the last good map
(routing on a slightly old map is safe: a store that no longer holds a slot says so, and the caller
refreshes); the KV's watch resumes from its revision when etcd returns. A map that fails
validation is logged and ignored, for the same reason: one bad write must not take routing down.

Maps are adopted in the order etcd changed them (by the key's ``mod_revision``), so a
:meth:`refresh` racing with the watch never steps back to an older map. A deleted map key is
logged and the last map kept: an empty cluster is never inferred from a missing key.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from metricsd.cluster.kv import KV, EventType, KVError, WatchCompacted, cancel_and_wait
from metricsd.cluster.shardmap import KeyLayout, ShardMap, ShardMapError

__all__ = ["EtcdMapSource"]

_log = logging.getLogger(__name__)

MapListener = Callable[[ShardMap | None, ShardMap], None]


class EtcdMapSource:
    """:class:`~metricsd.cluster.mapsource.MapSource` following ``layout.map_key`` in a KV.

    The watch starts on first use (:meth:`start`, :meth:`current`, :meth:`wait_ready` or
    :meth:`refresh`) inside a running event loop; :meth:`close` stops it (the KV is the caller's).
    ``on_change(old, new)`` runs on the event loop for every adopted map; it must not block.
    Use from one event loop.
    """

    def __init__(
        self,
        kv: KV,
        layout: KeyLayout,
        *,
        name: str = "",
        on_change: MapListener | None = None,
        retry_s: float = 0.5,
    ) -> None:
        self.kv = kv
        self.layout = layout
        self.name = name or "map watch"
        self.retry_s = retry_s
        self._listeners: list[MapListener] = [on_change] if on_change is not None else []
        self._map: ShardMap | None = None
        self._revision = 0  # mod_revision of the adopted map
        self._changed = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    # -- MapSource -------------------------------------------------------------------------------

    def current(self) -> ShardMap | None:
        self.start()
        return self._map

    async def wait_ready(self, timeout_s: float) -> ShardMap:
        """The first map; TimeoutError if none arrives within ``timeout_s``."""
        return await self.wait_for(lambda m: True, timeout_s)

    async def wait_for(self, predicate: Callable[[ShardMap], bool], timeout_s: float) -> ShardMap:
        """The first map (the current one included) that satisfies ``predicate``."""
        self.start()
        async with asyncio.timeout(timeout_s), self._changed:
            await self._changed.wait_for(lambda: self._map is not None and predicate(self._map))
        assert self._map is not None
        return self._map

    async def next_map(self, seen: ShardMap | None, timeout_s: float) -> ShardMap | None:
        """The current map as soon as it is not ``seen``; None after ``timeout_s`` (MapSource)."""
        try:
            return await self.wait_for(lambda m: m is not seen, timeout_s)
        except TimeoutError:
            return None

    async def refresh(self) -> ShardMap | None:
        """Read the map key now; on an etcd error keep the map we have and return it."""
        self.start()
        try:
            got = await self.kv.get(self.layout.map_key)
        except KVError as e:
            _log.warning("%s: cannot refresh the shard map, keeping v%s: %s", self.name, self._version(), e)
            return self._map
        if got is not None:
            await self._offer(got.value, got.mod_revision)
        return self._map

    async def close(self) -> None:
        self._closed = True
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait(task)

    # -- extras ----------------------------------------------------------------------------------

    def add_listener(self, listener: MapListener) -> None:
        self._listeners.append(listener)

    @property
    def revision(self) -> int:
        """The etcd mod_revision of the map in use (0 before the first)."""
        return self._revision

    def start(self) -> None:
        """Start following the map key (idempotent; needs a running event loop)."""
        if self._task is None and not self._closed:
            self._task = asyncio.get_running_loop().create_task(self._follow(), name=f"{self.name}")

    # -- internals -------------------------------------------------------------------------------

    def _version(self) -> str:
        return "-" if self._map is None else str(self._map.version)

    async def _follow(self) -> None:
        key = self.layout.map_key
        while True:
            try:
                result = await self.kv.range(key)
                for item in result.items:
                    if item.key == key:
                        await self._offer(item.value, item.mod_revision)
                async for event in self.kv.watch(key, result.revision + 1):
                    if event.key != key:  # the watch is by prefix: ".../map" also matches ".../mapx"
                        continue
                    if event.type is EventType.PUT:
                        await self._offer(event.value, event.mod_revision)
                    else:
                        _log.warning("%s: the shard map key %s was deleted; keeping v%s", self.name, key,
                                     self._version())
            except WatchCompacted as e:
                _log.warning("%s: %s; re-reading the map", self.name, e)
            except KVError as e:
                _log.warning("%s: cannot read the shard map (keeping v%s), retrying in %.1fs: %s", self.name,
                             self._version(), self.retry_s, e)
                await asyncio.sleep(self.retry_s)

    async def _offer(self, value: bytes, mod_revision: int) -> None:
        if mod_revision <= self._revision:
            return
        try:
            new = ShardMap.from_json(value)
        except ShardMapError as e:
            _log.error("%s: ignoring an invalid shard map at revision %d (keeping v%s): %s", self.name,
                       mod_revision, self._version(), e)
            self._revision = mod_revision
            return
        old, self._map, self._revision = self._map, new, mod_revision
        if old is None:
            _log.info("%s: shard map v%d: %s", self.name, new.version, new)
        elif old.version != new.version:
            _log.info("%s: shard map v%d -> v%d: %s", self.name, old.version, new.version, new)
        for listener in self._listeners:
            try:
                listener(old, new)
            except Exception:
                _log.exception("%s: a shard map listener failed", self.name)
        async with self._changed:
            self._changed.notify_all()
