"""Reads of consistency one: one replica per slot, hedged to the next when it is slow.

The shell around quorum.plan_one and latency.LatencyTracker. The slots are covered by as few
members as can hold them (plan_one); each member's call is a unit. When a member has not answered
within its hedging delay (its recent p99, latency.py), the same slots are covered again by the other replicas
(excluding it), and whichever cover answers first wins; the other is cancelled. A member that
fails is replaced at once, the same way. So every slot's answer comes from exactly one reply,
which an aggregate needs (group partials of two replicas of a slot must not both be summed).

Raises QuorumFailure (an Unavailable) naming the slots when some slot has no replica left that
answers; BadRequest or LimitExceeded (a query's series or sample limit) as soon as a store
rejects the request (another replica would too).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from metricsd.cluster.shardmap import ShardMap
from metricsd.proxy.fanout import QuorumFailure, Replies, Reply, consume, readable
from metricsd.proxy.latency import LatencyTracker
from metricsd.proxy.members import SlotNotHeld
from metricsd.proxy.quorum import plan_one
from metricsd.proxy.view import ClusterView
from metricsd.rpc.backend import BadRequest, LimitExceeded, MetricsBackend, Unavailable

__all__ = ["one_fanout"]

T = TypeVar("T")

MemberCall = Callable[[MetricsBackend, list[int], str], Awaitable[T]]  # (backend, the member's slots, member)


class _Failed(Unavailable):
    """Slots that no remaining replica could answer, and why (member -> error)."""

    def __init__(self, slots: Sequence[int], why: dict[str, str], stale: bool) -> None:
        super().__init__("; ".join(f"{m}: {e}" for m, e in why.items()) or "no replicas in the shard map")
        self.slots = list(slots)
        self.why = why
        self.stale = stale


async def one_fanout(view: ClusterView, shard_map: ShardMap, slots: Sequence[int], call: MemberCall[T],
                     latency: LatencyTracker, counters: Counter[str]) -> Replies[T]:
    """Ask one replica per slot of ``slots`` through ``call``, hedging slow ones; the replies are
    disjoint in slots. Raises QuorumFailure or BadRequest (see the module)."""
    healthy = readable(view, shard_map)
    offset = view.rotation()
    clock = view.clock

    async def ask(member: str, member_slots: list[int]) -> T:
        t0 = clock.monotonic()
        try:
            result = await view.call(shard_map, member, lambda b: call(b, member_slots, member), retries=0)
        except asyncio.CancelledError:
            # a hedge won: at least this long, so that a member that stays slow raises its own
            # delay instead of having every read hedged
            latency.record(member, clock.monotonic() - t0)
            raise
        latency.record(member, clock.monotonic() - t0)
        return result

    async def cover(want: list[int], exclude: frozenset[str]) -> list[Reply[T]]:
        asks, none = plan_one(want, shard_map.replicas, healthy, exclude, offset)
        if none:
            raise _Failed(none, {}, False)
        units = [asyncio.ensure_future(hedged(m, s, exclude | {m})) for m, s in asks.items()]
        try:
            done = await asyncio.gather(*units)
        finally:
            for u in units:
                if not u.done():
                    u.cancel()
                    u.add_done_callback(consume)
        return [r for rs in done for r in rs]

    async def hedged(member: str, member_slots: list[int], exclude: frozenset[str]) -> list[Reply[T]]:
        first: asyncio.Future[Any] = asyncio.ensure_future(ask(member, member_slots))
        first.add_done_callback(consume)
        alt: asyncio.Future[Any] | None = None
        try:
            done, _ = await asyncio.wait({first}, timeout=latency.delay(member))
            if not done:
                counters["read_one_hedges"] += 1
                alt = asyncio.ensure_future(cover(member_slots, exclude))
                alt.add_done_callback(consume)
            pending: set[asyncio.Future[Any]] = {first} if alt is None else {first, alt}
            why: dict[str, str] = {}
            stale = False
            failed: list[int] = []
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    exc = task.exception()
                    if isinstance(exc, (BadRequest, LimitExceeded)):  # another replica would refuse it too
                        raise exc
                    if task is first:
                        if exc is None:
                            return [Reply(member, member_slots, first.result())]
                        stale = stale or isinstance(exc, SlotNotHeld)
                        why[member] = (f"does not hold the slot (stale map v{shard_map.version})"
                                       if isinstance(exc, SlotNotHeld) else str(exc))
                        if alt is None:  # failed before its delay: replace it at once
                            alt = asyncio.ensure_future(cover(member_slots, exclude))
                            alt.add_done_callback(consume)
                            pending.add(alt)
                    else:
                        if exc is None:
                            if not first.done():
                                counters["read_one_hedges_won"] += 1
                            return list(task.result())
                        if isinstance(exc, _Failed):
                            why.update(exc.why)
                            stale = stale or exc.stale
                            failed = exc.slots
                        elif exc is not None:
                            raise exc
            raise _Failed(failed or member_slots, why, stale)
        finally:
            for fut in (first, alt):
                if fut is not None and not fut.done():
                    fut.cancel()

    counters["reads_one"] += 1
    try:
        replies = await cover(list(slots), frozenset())
    except _Failed as e:
        shown = ", ".join(map(str, e.slots[:10])) + (f" and {len(e.slots) - 10} more" if len(e.slots) > 10 else "")
        raise QuorumFailure(f"read (consistency one) failed for {len(e.slots)} slots ({shown}): no replica "
                            f"answered ({e})", e.slots, e.stale) from None
    out: Replies[T] = Replies(replies)
    for r in replies:
        for s in r.slots:
            out.answered.setdefault(s, []).append(r.member)
    return out
