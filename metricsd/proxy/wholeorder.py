"""Which store a whole query goes to (metricsd/proxy/wholequery.py): the order of the stores, and
the expected work a query brings to one. Pure: no I/O, no clock; times are passed in.

The proxy keeps its queries on its first store while that store is not busy with its others, and
spreads them over every store otherwise. "Busy" was a count (``whole_spill``, ``--spill-in-flight``):
at 1 every concurrent query spreads, and three stores each pay the fixed costs one store amortises
over several queries a loop turn, so the cluster's CPU per rate() of one pod at concurrency 8 was
1.5-2.1x one store's; at 8 that fell to 1.25-1.44x but heavier queries then waited for each other
on the one store, their p50 41-68% higher (perf/RESULTS.md, session 40, s40-23).

So "busy" is also measured in work (``whole_spill_work_s``, ``--spill-queued-ms``): the expected
time of each of this proxy's queries under way at the first store, summed. A cheap query (expected
time at most ``whole_spill_cheap_s``, ``--spill-cheap-ms``) stays on the first store while that sum
and its own expected time stay within the bound: cheap queries stay together (one store's
amortisation); a heavy one goes there only when nothing of this proxy's is (as at 1), so heavy
ones spread and do not queue behind each other. Why a cheap-query threshold and not the bound
alone: the store's saving needs nearly every concurrent query on it (at 4 of 8 there was none,
session 40), so the bound must hold about 8 cheap ones, and a heavy query's answer time is only
some 3-5x a rate() of one pod's (the hop's fixed cost is in both): two heavy ones would fit too.

A query's expected time (``QueryCosts``) is the least of its recent costs, per shape (query
text, instant or range, number of steps: a dashboard sends the same text again with shifted
times). The cost is the store's own time for the query, which it sends in front of its answer
(metricsd/rpc/FORMAT.md, "6 Query", first byte 2: the CPU of its loop's steps for the query and its
waits on a worker thread), learnt from every answer. It was the answer's wall time, learnt only
from asks sent while none of this proxy's other whole queries was under way (an answer time under
queueing includes the queueing); but even a lone answer's time rises with the machine's load (a
rate() of one pod 0.36-0.75 ms under load against a 0.8 ms threshold), so on a slower run every
such query counted as heavy and spread (perf/RESULTS.md, session 42, lead: the cluster's CPU per
question at concurrency 8 1.35x one store's in two runs, 1.83x in the third). The store's own time
does not count the hop, the proxy, the queue ahead nor the wait for a core. From a store that
predates it, the lone answer times are learnt as before (loaded A/Bs, perf/RESULTS.md session 42:
with the rule "alone at that store" a rate() of one pod at concurrency 8 concentrated in about 1
round of 4; with this rule and a p25, 79% of them were taken as cheap; with the least, all but 3
of 1,761). A shape not yet measured counts as the whole bound: heavy until measured.
"""

from __future__ import annotations

import random
from collections import OrderedDict, deque
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

from metricsd.cluster.shardmap import ShardMap
from metricsd.proxy.latency import LatencyTracker
from metricsd.proxy.settings import ProxySettings

__all__ = ["SPILL_IN_FLIGHT", "QueryCosts", "QueryShape", "first_place", "hedge_delay", "query_shape", "whole_holders",
           "whole_order"]

QueryShape = tuple[str, bool, int]  # (query text, instant, steps)

# The first store with this many of the proxy's whole queries under way passes the next to the
# others (ProxySettings.whole_spill, ``metricsd proxy --spill-in-flight``). 1: queries in a row stay
# on one store (warm), concurrent ones spread at once. At 4 (two stores took concurrency 8, the
# third idled) and at 1 with ties to the first in order, c8's p50 was above the stores in turn in
# 10 of 10 interleaved rounds (perf/RESULTS.md, issue 23 session 36). At 8, heavier queries wait
# for each other on the one store (ProxySettings says by how much, session 40).
SPILL_IN_FLIGHT = ProxySettings.whole_spill


def query_shape(query: str, instant: bool, start_ms: int, end_ms: int, step_ms: int) -> QueryShape:
    """What a query's cost is remembered by: its text, instant or range, and its number of steps
    (not its times: a refreshed panel asks the same text over a shifted range)."""
    if instant or step_ms <= 0:
        return (query, True, 1)
    return (query, False, max(0, end_ms - start_ms) // step_ms + 1)


@dataclass
class QueryCosts:
    """Each query shape's expected time in seconds: the ``quantile`` of its last ``window``
    observed costs (the stores' own times, or lone answer times), by default the least of 32. The
    least, not a mean nor a p25: a lone ask still shares the machine's cores with the rest of the
    cluster, and under load its answer time swings with that contention, while the quickest
    answers stay near the query's own work; a p25 of 16 put a rate() of one pod near 1 ms on a
    loaded machine, where the heavy questions' quickest were 1.7 ms (perf/RESULTS.md session 42).
    A store's own time moves less, but a query that waited its turn past the query limits'
    concurrency counts the wait (http/wholequery.py): the least leaves those out too. At most
    ``limit`` shapes, the least recently measured forgotten first (a client sending ever new query
    texts costs a bounded dict). Not thread-safe."""

    window: int = 32
    quantile: float = 0.0
    limit: int = 4096

    def __post_init__(self) -> None:
        if self.window < 1 or not 0.0 <= self.quantile <= 1.0 or self.limit < 1:
            raise ValueError("QueryCosts needs window >= 1, 0 <= quantile <= 1 and limit >= 1, got "
                             f"{self.window}, {self.quantile}, {self.limit}")
        self._times: OrderedDict[QueryShape, deque[float]] = OrderedDict()
        self._cost: dict[QueryShape, float] = {}

    def cost(self, shape: QueryShape) -> float | None:
        """The shape's expected seconds, or None: never measured (or forgotten)."""
        return self._cost.get(shape)

    def observe(self, shape: QueryShape, seconds: float) -> None:
        """A cost of ``shape`` (a negative one, from a clock that stepped, is ignored).
        O(window) for the least (~1 us: a sort for any other quantile took ~10 us, 3% of the
        proxy's CPU per query at concurrency 1, where every answer is a lone one)."""
        if seconds < 0:
            return
        times = self._times.get(shape)
        if times is None:
            if len(self._times) >= self.limit:
                gone, _ = self._times.popitem(last=False)
                del self._cost[gone]
            times = self._times[shape] = deque(maxlen=self.window)
        else:
            self._times.move_to_end(shape)
        times.append(seconds)
        if self.quantile == 0.0:
            self._cost[shape] = min(times)
        else:
            ordered = sorted(times)
            self._cost[shape] = ordered[min(len(ordered) - 1, int(self.quantile * len(ordered)))]

    def __len__(self) -> int:
        return len(self._times)


def whole_holders(shard_map: ShardMap, healthy: frozenset[str] | set[str], offset: int) -> list[str]:
    """The healthy members that hold every slot of the map, rotated by ``offset``."""
    everything = shard_map.num_slots
    out = sorted(m for m in healthy if m in shard_map.members and len(set(shard_map.slots_of(m))) == everything)
    if out:
        k = offset % len(out)
        out = out[k:] + out[:k]
    return out


def whole_order(full: Sequence[str], ok: AbstractSet[str], in_flight: Mapping[str, int], first: int,
                turn: int = 0, spill: int = SPILL_IN_FLIGHT, *, queued: Mapping[str, float] | None = None,
                cost: float = 0.0, bound_s: float = 0.0, cheap_s: float = 0.0) -> list[str]:
    """The stores to ask for one query, in order: of ``full`` (every store holding every slot,
    sorted) those in ``ok``, starting from place ``first`` of ``full`` (fixed, so the same store
    is asked while it stays up). That store goes first while it has fewer than ``spill`` queries
    in flight, or (``bound_s`` > 0) while this query is cheap (``cost``, its expected seconds, at
    most ``cheap_s``) and the work ``queued`` there (expected seconds of this proxy's queries under
    way) and its ``cost`` together stay within ``bound_s``.
    Otherwise the least busy by count of them all goes first, ties broken in turn by ``turn`` (so
    that concurrent queries spread evenly over every store, as the stores in turn did). The rest
    follow in order, for hedges and replacements."""
    if not full:
        return []
    k = first % len(full)
    out = [m for m in [*full[k:], *full[:k]] if m in ok]
    if len(out) < 2:
        return out
    head = out[0]
    if in_flight.get(head, 0) < spill:
        return out
    if bound_s > 0 and cost <= cheap_s and queued is not None and queued.get(head, 0.0) + cost <= bound_s:
        return out
    j = turn % len(out)
    pick = min([*out[j:], *out[:j]], key=lambda m: in_flight.get(m, 0))  # the first of the least busy
    return [pick, *(m for m in out if m != pick)]


def first_place(configured: int | None, rng: random.Random | None = None) -> int:
    """The place ``whole_order`` starts from: the configured one, else one at random, so that each
    proxy of a cluster keeps its sequential queries on a store of its own rather than every proxy
    on the first store in member-id order."""
    if configured is not None:
        return configured
    return (rng or random.Random()).randrange(1 << 16)


def hedge_delay(latency: LatencyTracker, member: str, ahead: int) -> float:
    """How long a whole query sent to ``member`` waits before the next store is asked too: the
    store's delay (its recent p99, latency.py) for each query of this proxy's there before it and
    itself, since a store answers its queries one after another. The tracker's delay alone is
    learnt from answers at whatever concurrency came before: after a spell at concurrency 1 it is
    a lone query's p99, which every query queued behind two others passes, so at concurrency 8
    each such query was asked twice, a second store's CPU spent where there was none to spare.
    At most the tracker's ceiling (``max_s``) past one query's delay, so a stalled store is still
    passed by within a bounded time. Pure."""
    one = latency.delay(member)
    return min(one * (1 + ahead), one + latency.settings.max_s)
