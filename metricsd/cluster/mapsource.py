"""Where a proxy or a store gets the shard map from: the seam between data path and control plane.

A proxy routes by ``current()`` and never blocks on etcd: an etcd-backed source watches the map
key and keeps the last map it saw while etcd is unreachable. When a store answers that it does
not hold a slot (FAILED_PRECONDITION), the caller asks for ``refresh()`` and retries once.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from metricsd.cluster.shardmap import ShardMap

__all__ = ["MapSource", "StaticMapSource"]


class MapSource(Protocol):
    def current(self) -> ShardMap | None:
        """The newest map seen, or None before the first one arrived. Never blocks."""
        ...

    async def wait_ready(self, timeout_s: float) -> ShardMap:
        """The first map; raises TimeoutError when none arrives in time."""
        ...

    async def refresh(self) -> ShardMap | None:
        """Re-read the map now if the source can (a store said it does not hold a slot)."""
        ...

    async def next_map(self, seen: ShardMap | None, timeout_s: float) -> ShardMap | None:
        """The current map as soon as it is not ``seen`` (at once if it is not already), or None
        when ``timeout_s`` passes first: what a loop that acts on map changes waits on, instead of
        waking to look (a store's replication loop looked twice a second)."""
        ...

    async def close(self) -> None: ...


class StaticMapSource:
    """A fixed map: `metricsd up`-style single-node setups and tests of the data path."""

    def __init__(self, shard_map: ShardMap) -> None:
        self._map = shard_map
        self._changed = asyncio.Event()  # set (and replaced) by each set()

    def current(self) -> ShardMap | None:
        return self._map

    async def wait_ready(self, timeout_s: float) -> ShardMap:
        return self._map

    async def refresh(self) -> ShardMap | None:
        return self._map

    async def next_map(self, seen: ShardMap | None, timeout_s: float) -> ShardMap | None:
        changed = self._changed
        if self._map is not seen:
            return self._map
        try:
            async with asyncio.timeout(timeout_s):
                await changed.wait()
        except TimeoutError:
            return None
        return self._map

    def set(self, shard_map: ShardMap) -> None:
        """Swap the map (tests of a proxy or a store seeing a new map)."""
        self._map = shard_map
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def close(self) -> None:
        return None
