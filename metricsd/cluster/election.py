"""Leader election through a key held under a lease, on top of the :class:`~metricsd.cluster.kv.KV`.

Several config servers run; one leads. The protocol is etcd's usual one:

- **Campaign.** Create the leader key (value: our id) with a compare-and-swap that succeeds only
  if the key is absent, attached to our lease. Whoever creates it leads. The others watch the key
  and try again when it is deleted, which happens when the leader resigns or its lease expires
  (it died, or lost etcd for a whole TTL), so a stand-by takes over within one TTL.
- **Fencing.** :attr:`LeaderElection.leader_revision` is the leader key's revision when we won;
  the leader passes it as a guard of every compare-and-swap (``guards={key: leader_revision}``),
  so a deposed leader that has not noticed yet cannot overwrite its successor's work.
- **Stepping down.** When the lease is lost or the key is deleted or overwritten behind our
  back, we stop leading at once: :attr:`is_leader` turns False, :attr:`deposed` is set and
  ``on_step_down`` is called with the reason. The owner stops its leader work and may campaign
  again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

from metricsd.cluster.kv import KV, EventType, KVError, Lease, cancel_and_wait

__all__ = ["LeaderElection"]

_log = logging.getLogger(__name__)


class LeaderElection:
    """One candidate in an election for ``key``. Use from one event loop.

    ``ttl`` (seconds) bounds how long the cluster is leaderless after a leader dies; etcd's
    minimum is about 2 s. ``retry_s`` is the pause after etcd was unreachable.
    """

    def __init__(
        self,
        kv: KV,
        key: str,
        candidate_id: str,
        ttl: int = 5,
        *,
        on_step_down: Callable[[str], None] | None = None,
        retry_s: float = 0.5,
    ) -> None:
        if not candidate_id:
            raise ValueError("a candidate needs a non-empty id")
        self.kv = kv
        self.key = key
        self.candidate_id = candidate_id
        self.ttl = ttl
        self.retry_s = retry_s
        self._on_step_down = on_step_down
        self._lease: Lease | None = None
        self._guard: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[None]] = set()
        self.is_leader = False
        self.leader_revision = 0
        self.deposed = asyncio.Event()

    async def campaign(self) -> None:
        """Return once we lead. Retries through etcd outages; cancel it to give up."""
        if self.is_leader:
            return
        while True:
            try:
                if self._lease is None or not self._lease.alive:
                    self._lease = await self.kv.grant(self.ttl, on_lost=self._lease_lost)
                lease = self._lease
                if await self.kv.compare_and_swap(self.key, 0, self.candidate_id.encode(), lease=lease):
                    current = await self.kv.get(self.key)
                    if current is not None and current.value == self.candidate_id.encode() and lease.alive:
                        self._won(current.mod_revision)
                        return
                    continue
                current = await self.kv.get(self.key)
                if current is None:
                    continue
                _log.debug("%s: %r leads, waiting", self.candidate_id, current.value.decode(errors="replace"))
                await self._wait_until_vacant(current.mod_revision + 1, lease)
            except KVError as e:
                _log.warning("%s: campaign for %s interrupted: %s", self.candidate_id, self.key, e)
                await asyncio.sleep(self.retry_s)

    async def resign(self) -> None:
        """Give up leadership (or candidacy) and release the key at once, for a quick hand-over."""
        was_leader, self.is_leader = self.is_leader, False
        await self._stop_guard()
        lease, self._lease = self._lease, None
        try:
            if was_leader:
                await self.kv.compare_and_delete(self.key, self.leader_revision)
        finally:
            if lease is not None:
                with contextlib.suppress(KVError):
                    await lease.revoke()

    async def leader(self) -> str | None:
        """The current leader's id, or None while there is none."""
        current = await self.kv.get(self.key)
        return None if current is None else current.value.decode(errors="replace")

    async def observe(self) -> AsyncIterator[str | None]:
        """The leader now, then each change (None while vacant). For stand-bys and status pages."""
        result = await self.kv.range(self.key)
        now = next((item for item in result.items if item.key == self.key), None)
        last = None if now is None else now.value.decode(errors="replace")
        yield last
        async for event in self.kv.watch(self.key, result.revision + 1):
            if event.key != self.key:
                continue
            leader = event.value.decode(errors="replace") if event.type is EventType.PUT else None
            if leader != last:
                last = leader
                yield leader

    async def close(self) -> None:
        """Resign if leading, stop background work. The KV is the caller's to close."""
        with contextlib.suppress(KVError):
            await self.resign()
        for task in list(self._background):
            await cancel_and_wait(task)

    # -- internals ----------------------------------------------------------------------------

    def _won(self, revision: int) -> None:
        self.is_leader = True
        self.leader_revision = revision
        self.deposed = asyncio.Event()
        _log.info("%s: became leader of %s at revision %d", self.candidate_id, self.key, revision)
        self._guard = asyncio.get_running_loop().create_task(self._guard_key(revision), name="election-guard")

    async def _wait_until_vacant(self, from_revision: int, lease: Lease) -> None:
        """Until the key is deleted (then campaign again) or our lease is lost (then re-grant)."""

        async def deleted() -> None:
            async for event in self.kv.watch(self.key, from_revision):
                if event.key == self.key and event.type is EventType.DELETE:
                    return

        waiters = [asyncio.ensure_future(deleted()), asyncio.ensure_future(lease.lost.wait())]
        try:
            done, _ = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()  # re-raise a KVError (e.g. WatchCompacted) for the retry loop
        finally:
            for task in waiters:
                await cancel_and_wait(task)

    async def _guard_key(self, revision: int) -> None:
        """While leading: step down if the key is deleted or overwritten behind our back."""
        try:
            async for event in self.kv.watch(self.key, revision + 1):
                if event.key != self.key:
                    continue
                if event.type is EventType.DELETE:
                    self._step_down("the leader key was deleted", revision)
                else:
                    value = event.value.decode(errors="replace")
                    self._step_down(f"the leader key was overwritten by {value!r}", revision)
                return
        except KVError as e:
            self._step_down(f"cannot watch the leader key: {e}", revision)

    def _lease_lost(self, lease: Lease) -> None:
        if lease is self._lease:
            self._step_down(f"lease lost: {lease.lost_reason}")

    def _step_down(self, reason: str, revision: int | None = None) -> None:
        """Stop leading. ``revision`` names the term a guard watched; a late guard of an older
        term (its cancellation can be delayed) must not depose the current one."""
        if not self.is_leader or (revision is not None and revision != self.leader_revision):
            return
        self.is_leader = False
        _log.warning("%s: no longer leader of %s: %s", self.candidate_id, self.key, reason)
        self.deposed.set()
        guard, self._guard = self._guard, None
        if guard is not None and guard is not asyncio.current_task():
            self._spawn(cancel_and_wait(guard))
        lease, self._lease = self._lease, None
        if lease is not None and lease.alive:
            self._spawn(self._revoke_quietly(lease))
        if self._on_step_down is not None:
            self._on_step_down(reason)

    async def _revoke_quietly(self, lease: Lease) -> None:
        with contextlib.suppress(KVError):
            await lease.revoke()

    async def _stop_guard(self) -> None:
        guard, self._guard = self._guard, None
        if guard is not None:
            await cancel_and_wait(guard)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
