"""Hinted hand-off: the writes a replica missed, kept by the proxy and delivered when it is back.

A write is acknowledged once W replicas have it; the sub-requests of the replicas that failed,
timed out or were skipped as unhealthy become hints here. Each member has a bounded queue (bytes
and age, :class:`HandoffSettings`) drained in order by one background task with exponential
backoff. Hints past the bounds are dropped, counted and logged: the replica then relies on read
repair and on the store's catch-up from its peers. Delivering a hint twice is harmless: a store
counts a repeated timestamp as a duplicate and keeps the first value.

Limitation: a store merges samples older than its series' newest one only within its
out-of-order window (1 h by default). While a replica is down nothing newer reaches it, but once
it is back, new writes can overtake the queued hints, which then arrive out of order; hints that
arrive more than the window late are rejected as too_old. ``max_age_s`` keeps hints well inside it.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from metricsd.clock import Clock
from metricsd.proto import metricsd_pb2 as pb
from metricsd.proxy.settings import HandoffSettings

__all__ = ["HintedHandoff", "MemberGone"]

log = logging.getLogger("metricsd.proxy.handoff")

Deliver = Callable[[str, pb.WriteRequest], Awaitable[None]]


class MemberGone(Exception):
    """The member left the shard map: its hints have nowhere to go."""


@dataclass
class _Hint:
    at: float
    request: pb.WriteRequest
    nbytes: int
    samples: int


@dataclass
class _Queue:
    hints: deque[_Hint] = field(default_factory=deque)
    nbytes: int = 0
    dropping: bool = False  # logged the start of a run of drops; log again once one fits
    wake: asyncio.Event = field(default_factory=asyncio.Event)  # the member is back: retry now


class HintedHandoff:
    """Per-member hint queues and their delivery tasks. Not thread-safe (one event loop).

    ``deliver(member, request)`` raises on failure (MemberGone drops the member's queue).
    Counters (in the Counter passed in): handoff_queued, handoff_delivered, handoff_dropped
    (hints) and handoff_dropped_samples.
    """

    def __init__(self, settings: HandoffSettings, clock: Clock, deliver: Deliver, counters: Counter[str]) -> None:
        self.settings = settings
        self._clock = clock
        self._deliver = deliver
        self._counters = counters
        self._queues: dict[str, _Queue] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._closed = False

    def add(self, member: str, request: pb.WriteRequest) -> bool:
        """Queue a hint; returns False when it was dropped for the byte bound. O(1) amortised."""
        if self._closed:
            return False
        q = self._queues.setdefault(member, _Queue())
        self._expire(member, q)
        nbytes = request.ByteSize()
        samples = len(request.timestamps)
        if q.nbytes + nbytes > self.settings.max_bytes:
            self._drop(member, q, 1, samples, f"queue full ({q.nbytes} bytes queued)")
            return False
        q.dropping = False
        q.hints.append(_Hint(self._clock.monotonic(), request, nbytes, samples))
        q.nbytes += nbytes
        self._counters["handoff_queued"] += 1
        running = self._tasks.get(member)
        if running is None or running.done():
            task = asyncio.get_running_loop().create_task(self._drain(member, q), name=f"handoff-{member}")
            self._tasks[member] = task
            task.add_done_callback(self._forget_task)
        return True

    def wake(self, member: str) -> None:
        """The member is reachable again: cut the delivery's back-off short."""
        q = self._queues.get(member)
        if q is not None and q.hints:
            q.wake.set()

    def _forget_task(self, task: asyncio.Task[None]) -> None:
        for m, t in list(self._tasks.items()):
            if t is task:
                del self._tasks[m]

    def pending(self) -> dict[str, tuple[int, int]]:
        """Member -> (hints, bytes) queued."""
        return {m: (len(q.hints), q.nbytes) for m, q in self._queues.items() if q.hints}

    def _drop(self, member: str, q: _Queue, hints: int, samples: int, why: str) -> None:
        self._counters["handoff_dropped"] += hints
        self._counters["handoff_dropped_samples"] += samples
        if not q.dropping:
            log.warning("hinted hand-off for %s: dropping hints (%s); the replica now relies on read repair "
                        "and catch-up", member, why)
            q.dropping = True

    def _expire(self, member: str, q: _Queue) -> None:
        limit = self._clock.monotonic() - self.settings.max_age_s
        while q.hints and q.hints[0].at < limit:
            h = q.hints.popleft()
            q.nbytes -= h.nbytes
            self._drop(member, q, 1, h.samples, f"older than {self.settings.max_age_s:g} s")

    def _drop_all(self, member: str, q: _Queue, why: str) -> None:
        self._drop(member, q, len(q.hints), sum(h.samples for h in q.hints), why)
        q.hints.clear()
        q.nbytes = 0

    async def _drain(self, member: str, q: _Queue) -> None:
        backoff = self.settings.retry_initial_s
        while q.hints:
            self._expire(member, q)
            if not q.hints:
                break
            hint = q.hints[0]
            try:
                await self._deliver(member, hint.request)
            except MemberGone:
                self._drop_all(member, q, "member left the shard map")
                break
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.debug("hand-off to %s failed, retrying in %.2f s: %s", member, backoff, e)
                try:
                    async with asyncio.timeout(backoff):
                        await q.wake.wait()
                    backoff = self.settings.retry_initial_s  # woken: the member is back
                except TimeoutError:
                    backoff = min(self.settings.retry_max_s, backoff * 2)
                q.wake.clear()
                continue
            if q.hints and q.hints[0] is hint:
                q.hints.popleft()
                q.nbytes -= hint.nbytes
            self._counters["handoff_delivered"] += 1
            backoff = self.settings.retry_initial_s

    async def close(self) -> None:
        """Stop delivering; queued hints are lost (the proxy is stateless by design)."""
        self._closed = True
        tasks = list(self._tasks.values())
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
