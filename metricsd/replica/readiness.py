"""Which of a cluster store's slots it may answer reads for: not the ones a new map just gave it.

When a member leaves (its lease ran out, it was wiped), the config server hands its replicas of
each slot to other members at once. The new replica of a slot holds nothing of it until its
catch-up (replication.py) has copied the slot from the others, yet in the new map it is a replica
like any other, and a quorum read may pick it with the one other replica that also lacks a
sample (say, one whose hinted hand-off has not arrived yet): the read then misses a sample that
W replicas acknowledged, of which one has just been lost. ``metricsd chaos`` saw exactly that:
a store wiped seconds after another restarted, a read of a slot moved to a third store 0.3 s
before, answered by it and by the restarted one, both without the sample.

Publishing ``joining`` in the member record closes that gap only after a round trip through etcd
and the config server (2-3 s under load), and only for the whole member. So the store refuses,
itself and at once, reads of the slots it gained by a map change until their catch-up is done
(:class:`metricsd.replica.ownership.OwnershipBackend`), as it refuses slots it does not hold: the
proxy asks another replica of the slot (a refusal never marks the store down, so it keeps taking
writes). The slots of the first map a store sees are not refused: a starting store registers
``joining`` when its restart lost data, and a new cluster has nothing to copy.

A read that meets such a slot first waits for its catch-up, up to a bound below the proxy's call
timeout (:meth:`wait`): catch-ups take 1-8 s, and when a member's lease runs out and it comes back,
two maps a few seconds apart can give two of a slot's three replicas to new members, so refusing at
once would fail quorum reads (``metricsd chaos`` saw that too) where waiting answers them whole.

Bookkeeping: the ownership check and the replication loop both call :meth:`observe` with the map
they see (so a change is noticed by whichever sees it first), the loop catches up :meth:`gaining`
and calls :meth:`level` when done. Not thread-safe (one event loop).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import numpy as np

from metricsd.cluster.shardmap import ShardMap

__all__ = ["SlotReadiness"]


class SlotReadiness:
    def __init__(self, member_id: str) -> None:
        self.member_id = member_id
        self._seen: ShardMap | None = None
        self._held = np.zeros(0, dtype=bool)
        self._gaining = np.zeros(0, dtype=bool)
        self.since: dict[int, int] = {}  # slot -> the map version that gave it (for messages)
        self.any = False  # some slot is refused: the read check's fast path
        self._changed: asyncio.Event | None = None  # set (and dropped) when slots stop being refused

    def observe(self, shard_map: ShardMap) -> None:
        """Note the slots ``shard_map`` gives this member that the map seen before did not."""
        if shard_map is self._seen:
            return
        held = np.zeros(shard_map.num_slots, dtype=bool)
        held[shard_map.slots_of(self.member_id)] = True
        if self._seen is None or len(self._held) != len(held):
            gaining = np.zeros(len(held), dtype=bool)  # the first map (or a new slot count): not refused
            self.since = {}
        else:
            new = held & ~self._held
            gaining = (self._gaining | new) & held
            for s in np.flatnonzero(new).tolist():
                self.since[s] = shard_map.version
        self._seen, self._held, self._gaining = shard_map, held, gaining
        self.since = {s: v for s, v in self.since.items() if gaining[s]}
        self.any = bool(gaining.any())
        self._wake()

    def gaining(self) -> set[int]:
        """Slots gained and not yet level."""
        return set(np.flatnonzero(self._gaining).tolist())

    def refused(self, slots: np.ndarray) -> np.ndarray:
        """Those of ``slots`` (in range) whose reads are refused."""
        if not self.any or not len(slots):
            return slots[:0]
        slots = slots[slots < len(self._gaining)]  # a map with fewer slots came meanwhile
        return slots[self._gaining[slots]]

    async def wait(self, slots: np.ndarray, timeout_s: float) -> bool:
        """Wait until none of ``slots`` is refused any more; False if ``timeout_s`` runs out first."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while len(self.refused(slots)):
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            if self._changed is None:
                self._changed = asyncio.Event()
            try:
                await asyncio.wait_for(self._changed.wait(), remaining)
            except TimeoutError:
                return False
        return True

    def _wake(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    def level(self, slots: Iterable[int]) -> None:
        """The catch-up of ``slots`` is done: serve their reads."""
        for s in slots:
            if 0 <= s < len(self._gaining):
                self._gaining[s] = False
                self.since.pop(s, None)
        self.any = bool(self._gaining.any())
        self._wake()
