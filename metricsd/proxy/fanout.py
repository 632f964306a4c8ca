"""The third quorum layer for reads: the concurrent fan-out that executes what quorum.py decides.

Per slot, plan_read picks R replicas (healthy ones, rotated to spread load); slots are grouped by
member so each member gets ONE request restricted to its slots (SlotFilter); a member that fails
makes the tracker name a spare for its slots, which is asked at once. The fan-out ends when every
slot has R replies, or fails naming the slots that cannot.

Plans are the same for every read while the map and the members' health stay the same, but for
the rotation; :class:`ReadPlans` keeps them per rotation, and answers are counted by acks.py's
arrays until a member fails, so a read whose members all answer builds no per-slot objects.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from metricsd.cluster.shardmap import MemberState, ShardMap
from metricsd.proto import metricsd_pb2 as pb
from metricsd.proxy.acks import acks_for
from metricsd.proxy.members import SlotNotHeld
from metricsd.proxy.quorum import ReplicaPlan, plan_read
from metricsd.proxy.view import ClusterView
from metricsd.rpc.backend import BadRequest, LimitExceeded, MetricsBackend, Unavailable

__all__ = ["QuorumFailure", "ReadPlans", "Replies", "Reply", "consume", "plan_reads", "read_fanout", "readable",
           "slot_filter"]

T = TypeVar("T")

MemberCall = Callable[[MetricsBackend, list[int], str], Awaitable[T]]  # (backend, the member's slots, member)


class QuorumFailure(Unavailable):
    """Some slots lacked a read or write quorum. ``stale``: a store said it does not hold a slot
    it was asked for, so a newer map may succeed."""

    def __init__(self, message: str, slots: Sequence[int], stale: bool) -> None:
        super().__init__(message)
        self.slots = tuple(slots)
        self.stale = stale


@dataclass
class Reply(Generic[T]):
    member: str
    slots: list[int]
    response: T


@dataclass
class Replies(Generic[T]):
    replies: list[Reply[T]]
    # slot -> members whose reply covers it
    answered: dict[int, list[str]] = field(default_factory=dict)
    stale: bool = False


def consume(task: asyncio.Future[Any]) -> None:
    """Retrieve the outcome of a task nobody awaits any more (cancelled after the quorum was
    reached), so asyncio does not log it as never retrieved."""
    if not task.cancelled():
        task.exception()


def _bind(call: MemberCall[T], slots: list[int], member: str) -> Callable[[MetricsBackend], Awaitable[T]]:
    return lambda backend: call(backend, slots, member)


def slot_filter(num_slots: int, slots: Sequence[int]) -> pb.SlotFilter:
    return pb.SlotFilter(slot_count=num_slots, slots=slots)


def readable(view: ClusterView, shard_map: ShardMap) -> frozenset[str]:
    """The members a read may ask now: healthy, and not still catching up from their peers (a
    member in state joining takes writes but is not read from)."""
    return frozenset(m for m in view.health.healthy(shard_map.members)
                     if shard_map.members[m].state is not MemberState.JOINING)


def _plans(view: ClusterView, shard_map: ShardMap, slots: Sequence[int], healthy: frozenset[str],
           offset: int) -> list[ReplicaPlan]:
    q = view.quorum(shard_map)
    return [plan_read(slot, shard_map.replicas(slot), healthy, q, offset) for slot in slots]


def plan_reads(view: ClusterView, shard_map: ShardMap, slots: Sequence[int]) -> list[ReplicaPlan]:
    """R replicas per slot among the healthy, the others as spares (unhealthy ones last); a slot
    with too few healthy replicas asks unhealthy ones at once (a member marked down may be back,
    and failing for sure is no better)."""
    return _plans(view, shard_map, slots, readable(view, shard_map), view.rotation())


class ReadPlans:
    """plan_reads, kept: every slot's plans per rotation turn while the map (its identity and
    version) and the readable members stay the same. A plan depends on the rotation only through
    ``offset mod (usable replicas of its slot)``, so ``offset mod lcm(1..RF)`` names every distinct
    plan set; with more turns than MAX_TURNS the plans are made afresh each time.
    Not thread-safe (one event loop)."""

    MAX_TURNS = 12

    def __init__(self) -> None:
        self._key: tuple[int, int, frozenset[str]] | None = None
        self._turns: dict[int, list[ReplicaPlan]] = {}
        self._period = 1

    def plans(self, view: ClusterView, shard_map: ShardMap, slots: Sequence[int]) -> list[ReplicaPlan]:
        healthy = readable(view, shard_map)
        offset = view.rotation()
        key = (id(shard_map), shard_map.version, healthy)
        if key != self._key:
            self._key, self._turns = key, {}
            most = max((len(shard_map.replicas(s)) for s in range(shard_map.num_slots)), default=1)
            self._period = math.lcm(*range(1, most + 1))
        if self._period > self.MAX_TURNS:
            return _plans(view, shard_map, slots, healthy, offset)
        every = self._turns.get(offset % self._period)
        if every is None:
            every = self._turns[offset % self._period] = _plans(view, shard_map, range(shard_map.num_slots),
                                                                healthy, offset)
        return [every[s] for s in slots]


async def read_fanout(view: ClusterView, shard_map: ShardMap, plans: Sequence[ReplicaPlan], call: MemberCall[T]
                      ) -> Replies[T]:
    """Ask the replicas ``plans`` name (plan_reads, ReadPlans) through ``call(backend, member_slots,
    member)``. Raises QuorumFailure when some slot cannot get R replies, BadRequest (LimitExceeded) when a store
    rejects the request."""
    tracker = acks_for(plans)
    out: Replies[T] = Replies([])
    tasks: dict[asyncio.Task[T], tuple[str, list[int]]] = {}

    def launch(asks: dict[str, list[int]]) -> None:
        for member, member_slots in asks.items():
            task = asyncio.ensure_future(view.call(shard_map, member, _bind(call, member_slots, member)))
            task.add_done_callback(consume)
            tasks[task] = (member, member_slots)

    launch(tracker.asks())
    try:
        while tasks and not tracker.done and not tracker.failed:
            finished, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in finished:
                member, member_slots = tasks.pop(task)
                exc = task.exception()
                if exc is None:
                    tracker.record_success(member, member_slots)
                    out.replies.append(Reply(member, member_slots, task.result()))
                    for s in member_slots:
                        out.answered.setdefault(s, []).append(member)
                    continue
                if isinstance(exc, (BadRequest, LimitExceeded)):  # every replica would refuse it: say why
                    raise exc
                if isinstance(exc, SlotNotHeld):
                    out.stale = True
                    why = f"does not hold the slot (stale map v{shard_map.version})"
                else:
                    why = str(exc) if isinstance(exc, Unavailable) else f"{type(exc).__name__}: {exc}"
                launch(tracker.record_failure(member, why, member_slots))
    finally:
        for task in tasks:
            task.cancel()
    if not tracker.done:
        err = tracker.error()
        assert err is not None
        raise QuorumFailure(str(err), err.slots, out.stale)
    return out
