"""A whole PromQL query sent to one store: the dashboard path (consistency one) when one healthy
store holds every slot the query can touch.

Through the proxy's own path a query costs the proxy HTTP, the parse and the engine, and each
selector a read frame to a store; here the proxy sends the query text and its parameters as one
QUERY frame (metricsd/rpc/wholequery.py) to such a store, which evaluates it with its own engine
over its own data and answers the finished JSON, which the proxy relays unparsed.

Which store: a member that is readable (healthy, not joining) and holds every slot in the proxy's
map. At RF 3 on 3 stores every store qualifies. The proxy's own first store (a place in
member-id order, at random per proxy unless configured: ``first_place``, so that the queries of
many proxies do not all land on one store), while it has none of this proxy's queries under way
(``SPILL_IN_FLIGHT``) or, with ``whole_spill_work_s``, while the expected work of those under way
and this one stays within that bound (proxy/wholeorder.py), or the next up from it; else the least
busy of them all, ties taken in turn. So one after another, queries go to the same store; concurrent
cheap ones too, up to the bound; concurrent heavy ones spread over every store, as before. Not
the stores in turn for every query, as before: a store asked every third query in turn spent
1.40-1.47 ms of CPU a (b) frame against 0.73-0.83 asked every time (its caches cold after two
others' turns, presumably; perf/RESULTS.md, issue 23 session 36), and answered sooner too. (A
query whose selectors pin pods to slots that one store holds, with RF below the member count,
still takes the proxy's path: finding those slots needs the query's selectors.)

Hedging as the one-replica reads do (hedge.py): when the store has not answered within its
latency tracker's delay, the next qualifying store gets the same frame; the first answer wins and
the other is cancelled. A store that fails is replaced at once, and so is one the proxy has no
read port to now (NoReadPort: its Health is still being asked, or the port failed a moment ago),
without counting it down. The delay is the store's for each of this proxy's queries already
there and this one (``hedge_delay``): a query queued behind others is not a slow store.

Fallback (the caller evaluates the query itself, as before): no store qualifies; the store does
not know the frame (an older store: remembered for ``UNSUPPORTED_RETRY_S``); a store refuses a slot
(its map differs: the proxy's map is refreshed in the background); every store asked failed.
A query's own errors (bad query, a limit, its timeout) are answers, relayed as they are.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Protocol

from metricsd.cluster.shardmap import ShardMap
from metricsd.proxy.fanout import readable
from metricsd.proxy.latency import LatencyTracker
from metricsd.proxy.members import SlotNotHeld
from metricsd.proxy.view import ClusterView
from metricsd.proxy.wholeorder import (
    SPILL_IN_FLIGHT,
    QueryCosts,
    QueryShape,
    first_place,
    hedge_delay,
    query_shape,
    whole_holders,
    whole_order,
)
from metricsd.rpc.backend import BadRequest, Unavailable
from metricsd.rpc.wholequery import (
    NoReadPort,
    NotSupported,
    QueryAnswer,
    QueryFrame,
    RunnerSettings,
    decode_answer,
    encode_request,
)

__all__ = ["GRACE_S", "SPILL_IN_FLIGHT", "UNSUPPORTED_RETRY_S", "WholeQueryPath", "first_place", "hedge_delay",
           "whole_holders", "whole_order"]

log = logging.getLogger("metricsd.proxy.wholequery")

UNSUPPORTED_RETRY_S = 60.0  # a store that did not know the frame is asked again after this (it may be upgraded)
GRACE_S = 1.0  # past the query's own timeout, for the store's timeout answer to arrive


class WholeQueryPath:
    """Not thread-safe (one event loop)."""

    def __init__(self, view: ClusterView, latency: LatencyTracker, counters: Counter[str], first: int = 0) -> None:
        self.view = view
        self.first = first  # the place among the full holders (in member-id order) asked first (whole_order)
        self.in_flight: Counter[str] = Counter()  # member -> this proxy's whole queries under way there
        self.queued: dict[str, float] = {}  # member -> their expected seconds, summed (whole_order's bound)
        self.under_way = 0  # this proxy's asks under way at every store together
        self.costs = QueryCosts()  # each query shape's expected seconds: the stores' own times for it
        self.latency = latency
        self.counters = counters
        self.enabled = view.settings.whole_queries
        self.spill = view.settings.whole_spill  # whole_order's: so many under way on the first store, then others
        self.bound_s = view.settings.whole_spill_work_s  # whole_order's: or so much expected work there,
        self.cheap_s = view.settings.whole_spill_cheap_s  # of queries expected to take at most this
        self._unsupported: dict[str, float] = {}  # member -> monotonic time it said it does not know the frame
        self._full: tuple[ShardMap | None, list[str]] = (None, [])  # (map, its members holding every slot)
        self._readable: tuple[ShardMap | None, frozenset[str]] = (None, frozenset())  # while none failed

    async def run(self, query: str, *, instant: bool, start_ms: int, end_ms: int, step_ms: int, timeout_s: float,
                  settings: RunnerSettings) -> QueryAnswer | None:
        """The store's answer (data or the query's error), or None: evaluate it on the proxy.
        Raises TimeoutError when no store answered within ``timeout_s`` and GRACE_S."""
        shape = query_shape(query, instant, start_ms, end_ms, step_ms)
        cost = self._cost(shape)
        planned = self._planned(cost)
        if planned is None:
            return None
        shard_map, holders = planned
        if not holders:
            self.counters["whole_query_skipped"] += 1
            return None
        frame = QueryFrame(query, instant, start_ms, end_ms, step_ms, timeout_s, shard_map.num_slots, None, settings,
                           cpu=True)
        loop = asyncio.get_running_loop()
        adopted = _Adopted(encode_request(frame), loop.time() + frame.timeout_s + GRACE_S, shape, cost)
        return await self._send(shard_map, holders, frame, adopted)

    def _cost(self, shape: QueryShape) -> float:
        """The work a query of ``shape`` is expected to bring to a store (whole_order's ``cost``):
        its learnt time (the stores' own, or a lone answer's from a store that predates it); a
        shape not yet learnt, the whole bound (heavy until measured: it joins no queue); 0 without
        a bound."""
        if self.bound_s <= 0:
            return 0.0
        cost = self.costs.cost(shape)
        if cost is None:
            return self.bound_s
        if cost <= self.cheap_s:
            self.counters["whole_query_cheap"] += 1
        return cost

    def _planned(self, cost: float) -> tuple[ShardMap, list[str]] | None:
        """(the map, the stores to ask in order for a query of ``cost``), or None: not whole."""
        if not self.enabled:
            return None
        try:
            shard_map = self.view.current_map()
        except Unavailable:
            return None
        return shard_map, self._holders(shard_map, cost)

    def start_now(self, query: str, *, instant: bool, start_ms: int, end_ms: int, step_ms: int, timeout_s: float,
                  settings: RunnerSettings, done: Callable[[QueryAnswer], None],
                  convert: Callable[[Callable[[], Awaitable[QueryAnswer | None]]], None]) -> _Cancellable | None:
        """:meth:`run` without a task while nothing but the first store's answer happens: the frame
        is sent now (over the store's read port when its connection is up) and ``done`` is called
        with a successful answer from the turn of the loop that reads it. A hedge's time, the
        deadline, a failed ask or a port not up hands the query to ``convert`` instead, at once, as
        a coroutine function that continues it as :meth:`run` would have from that point (call it
        in a task). Returns what cancels the query, or None when :meth:`run` is needed from the
        start (nothing was sent or counted)."""
        shape = query_shape(query, instant, start_ms, end_ms, step_ms)
        cost = self._cost(shape)
        planned = self._planned(cost)
        if planned is None or not planned[1]:
            return None
        shard_map, holders = planned
        frame = QueryFrame(query, instant, start_ms, end_ms, step_ms, timeout_s, shard_map.num_slots, None, settings,
                           cpu=True)
        return _NowQuery(self, shard_map, holders, frame, shape, cost, done, convert)

    def _holders(self, shard_map: ShardMap, cost: float) -> list[str]:
        if self._full[0] is not shard_map:  # once per map: O(slots x rf) per member
            self._full = (shard_map, whole_holders(shard_map, frozenset(shard_map.members), 0))
        full = self._full[1]
        if not full:
            return []
        if self.view.health.none_failed():  # every member healthy: readable() depends on the map alone
            if self._readable[0] is not shard_map:
                self._readable = (shard_map, readable(self.view, shard_map))
            ok = self._readable[1]
        else:
            ok = readable(self.view, shard_map)
        if self._unsupported:
            now = self.view.clock.monotonic()
            ok = frozenset(m for m in ok if now - self._unsupported.get(m, -UNSUPPORTED_RETRY_S) >= UNSUPPORTED_RETRY_S)
        order = whole_order(full, ok, self.in_flight, self.first, self.view.rotation(), self.spill,
                            queued=self.queued, cost=cost, bound_s=self.bound_s, cheap_s=self.cheap_s)
        if self.under_way and order:  # nothing under way: nothing to spread from (whole_order keeps the first)
            k = self.first % len(full)
            if order[0] != next((m for m in (*full[k:], *full[:k]) if m in ok), None):
                self.counters["whole_query_spread"] += 1  # not on the first store: compare.py shows how many
        return order

    async def _send(self, shard_map: ShardMap, holders: list[str], frame: QueryFrame,
                    adopted: _Adopted) -> QueryAnswer | None:
        """Asks ``holders`` in turn as the module says, under one deadline: the frame's timeout and
        GRACE_S for the store's own timeout answer to arrive. Past it the stores still asked are
        counted failed and TimeoutError is raised (the caller answers the API's timeout).

        One timer and one future a wait, no ``asyncio.wait`` and no timeout per store: a query had
        three timers (the caller's, each store's, the hedge's wait), the store's never the first
        to fire. Each ask hands its outcome over and wakes this wait itself as it ends, rather than
        through its task's done callbacks: those run a turn of the event loop later, and that turn
        was one of the eight the proxy spent on each whole query.

        ``adopted``: the query's frame as bytes, deadline and expected work (:meth:`run`), or a query
        :meth:`start_now` began without a task (with the asks under way and what they handed over),
        continued here from where it stood: ``holders`` are then the stores not yet asked."""
        loop = asyncio.get_running_loop()
        deadline, tasks, landing = adopted.deadline, adopted.tasks, adopted.landing
        landed = landing.landed
        waiting = list(holders)
        delay = 0.0
        try:
            while waiting or tasks:
                if waiting and not landed:  # the first store, a hedge past the last one's delay, or a replacement
                    member = waiting.pop(0)
                    if tasks:
                        self.counters["whole_query_hedges"] += 1
                    delay = hedge_delay(self.latency, member, self.in_flight[member])
                    tasks[member] = self._start(shard_map, member, adopted, landing.land)
                if not landed:
                    now = loop.time()
                    if now >= deadline:
                        for member in tasks:
                            self.view.health.failure(member, f"{member}: no answer to a whole query within "
                                                             f"{frame.timeout_s + GRACE_S:g} s")
                        raise TimeoutError
                    woken: asyncio.Future[None] = loop.create_future()
                    landing.waiter = woken
                    timer = loop.call_at(min(deadline, now + delay) if waiting else deadline, _wake, woken)
                    try:
                        await woken
                    finally:
                        timer.cancel()
                        landing.waiter = None
                    continue
                member, outcome = landed.pop(0)
                del tasks[member]
                if not isinstance(outcome, Exception):
                    self.counters["whole_queries"] += 1
                    return outcome
                if not self._worth_another(member, outcome):
                    return None
            self.counters["whole_query_failed"] += 1
            return None
        finally:
            for task in tasks.values():
                task.cancel()

    def _worth_another(self, member: str, outcome: Exception) -> bool:
        """Whether, ``member`` having failed with ``outcome``, the next store is asked (False: the
        caller evaluates the query itself)."""
        if isinstance(outcome, NotSupported):
            self._unsupported[member] = self.view.clock.monotonic()
            self.counters["whole_query_unsupported"] += 1
            return False
        if isinstance(outcome, SlotNotHeld):  # the maps differ: the proxy's path retries with a fresh one
            self.counters["whole_query_stale_map"] += 1
            self.view.refresh_soon()
            return False
        if isinstance(outcome, BadRequest):  # a frame the store finds out of format: not the query's fault
            log.warning("%s refused a whole query frame: %s", member, outcome)
            return False
        if isinstance(outcome, NoReadPort):  # the next store, at once; this one again next query
            self.counters["whole_query_no_port"] += 1
        log.debug("whole query: %s failed: %s", member, outcome)
        return True

    def _start(self, shard_map: ShardMap, member: str, query: _Adopted,
               land: Callable[[str, QueryAnswer | Exception], None]) -> _Cancellable:
        """Sends ``query``'s frame to ``member``, its outcome handed to ``land`` as it ends.
        Counted in ``in_flight`` and ``queued`` from now, not from when a task first runs: queries
        parsed in the same turn of the loop would all see the same counts and pick the same store.
        At once over the store's read port when its connection is up (:meth:`_start_now`), else in
        a task of its own, which opens the connection or finds out there is none (its answer time,
        connecting included, is not learnt as the query's cost; the store's own time is)."""
        now = self._start_now(shard_map, member, query, land)
        if now is not None:
            return now
        body, shape = query.body, query.shape

        async def ask() -> None:
            land(member, await self._ask(shard_map, member, body, shape))

        task = asyncio.get_running_loop().create_task(ask())
        # Given back by a done callback, which runs however the task ends (cancelled before its
        # first step too, when its coroutine's own code never runs)
        self._enter(member, query.cost)
        task.add_done_callback(functools.partial(self._task_left, member, query.cost))
        return task

    def _start_now(self, shard_map: ShardMap, member: str, query: _Adopted,
                   land: Callable[[str, QueryAnswer | Exception], None]) -> _NowAsk | None:
        """``query``'s frame sent to ``member`` now when its read port's connection is up
        (MemberClient.query_now: no task, no turn of the loop to start it or to wake it,
        perf/RESULTS.md session 40), counted in ``in_flight`` and ``queued``; else None, nothing
        sent. The store's own time for it is learnt as the query's cost (a store that predates it:
        the answer time, when this was the proxy's only whole query under way; wholeorder.py)."""
        try:
            query_now = getattr(self.view.pool.get(shard_map, member), "query_now", None)
        except Unavailable:
            return None  # the task's _ask meets it again, and hands it over
        if query_now is None:
            return None
        now = _NowAsk(self, member, land, query.cost, query.shape, alone=not self.under_way)
        forget = query_now(query.body, now.deliver)
        if forget is None:
            return None
        now.forget = forget
        self._enter(member, query.cost)
        return now

    def _enter(self, member: str, cost: float) -> None:
        self.under_way += 1
        self.in_flight[member] += 1
        self.queued[member] = self.queued.get(member, 0.0) + cost

    def _leave(self, member: str, cost: float) -> None:
        self.under_way -= 1
        left = self.in_flight[member] - 1
        self.in_flight[member] = left
        # none left: exactly 0, not the sum's rounding residue
        self.queued[member] = self.queued.get(member, 0.0) - cost if left > 0 else 0.0

    def _task_left(self, member: str, cost: float, _: object) -> None:
        self._leave(member, cost)

    async def _ask(self, shard_map: ShardMap, member: str, body: bytes,
                   shape: QueryShape | None = None) -> QueryAnswer | Exception:
        """One store's answer to the frame ``body`` or why there is none (``_outcome``; its wall time,
        which may include connecting, is never learnt as the cost of ``shape``: the store's own is)."""
        clock = self.view.clock
        t0 = clock.monotonic()
        try:
            query = getattr(self.view.pool.get(shard_map, member), "query", None)
        except Unavailable as e:  # not in the map: not the store's failure
            return e
        if query is None:
            return NotSupported(f"{member}: its connection cannot send a whole query")
        try:
            result: bytes | Exception = await query(body)
        except asyncio.CancelledError:
            self.latency.record(member, clock.monotonic() - t0)  # a hedge won: at least this long
            raise
        except Exception as e:  # looked at by _send
            result = e
        return self._outcome(member, t0, result, shape, alone=False)

    def _outcome(self, member: str, t0: float, result: bytes | Exception, shape: QueryShape | None = None,
                 alone: bool = False) -> QueryAnswer | Exception:
        """The answer ``result`` decoded, its latency recorded and the store's health told; or the
        error, a store that is unavailable told failed. ``shape``'s cost learnt: the store's own
        time for the query when the answer carries it (a store that predates it: the answer time,
        when ``alone``, the proxy's only whole query under way: wholeorder.py)."""
        try:
            if isinstance(result, Exception):
                raise result
            answer = decode_answer(result)
        except (NotSupported, NoReadPort, SlotNotHeld, BadRequest) as e:
            return e
        except Unavailable as e:
            self.view.health.failure(member, str(e))
            return e
        except Exception as e:
            return e
        took = self.view.clock.monotonic() - t0
        self.latency.record(member, took)
        if shape is not None:
            if answer.cpu_s is not None:
                self.costs.observe(shape, answer.cpu_s)
                self.counters["whole_query_timed"] += 1
                self.counters["whole_query_timed_us"] += round(answer.cpu_s * 1e6)  # compare.py: per question
            elif alone:
                self.costs.observe(shape, took)
        self.view.health.success(member)
        return answer


class _Cancellable(Protocol):
    def cancel(self) -> object: ...


class _Landing:
    """Where a query's asks hand their outcomes over (``land``) and the wait that sleeps on them:
    an object, not _send's locals, so that an ask begun without a task hands over to the task
    that continues it from the moment it is made, before that task first runs."""

    __slots__ = ("landed", "waiter")

    def __init__(self) -> None:
        self.landed: list[tuple[str, QueryAnswer | Exception]] = []  # asks that ended, in order, not yet looked at
        self.waiter: asyncio.Future[None] | None = None  # what _send sleeps on, while it does

    def land(self, member: str, outcome: QueryAnswer | Exception) -> None:
        self.landed.append((member, outcome))
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)


class _Adopted:
    """A query's state as _send keeps it: its frame's bytes, its deadline (the loop's time), its
    shape and expected cost (wholeorder.py), its asks under way (member -> ask) and their landing."""

    __slots__ = ("body", "cost", "deadline", "landing", "shape", "tasks")

    def __init__(self, body: bytes, deadline: float, shape: QueryShape, cost: float) -> None:
        self.body = body
        self.deadline = deadline
        self.shape = shape
        self.cost = cost
        self.tasks: dict[str, _Cancellable] = {}
        self.landing = _Landing()


class _NowQuery:
    """A whole query begun by WholeQueryPath.start_now: its first store asked at once, a timer for
    the first of the hedge's time and the deadline. The store's answer in time is handed to
    ``done`` in the turn that read it; anything else (the timer, a failed ask, the store's port not
    up) hands the query over to ``convert``, as _send continued with the asks under way."""

    __slots__ = ("ask", "convert", "done", "frame", "holders", "over", "path", "shard_map", "state", "timer")

    def __init__(self, path: WholeQueryPath, shard_map: ShardMap, holders: list[str], frame: QueryFrame,
                 shape: QueryShape, cost: float, done: Callable[[QueryAnswer], None],
                 convert: Callable[[Callable[[], Awaitable[QueryAnswer | None]]], None]) -> None:
        self.path, self.shard_map, self.frame, self.done, self.convert = path, shard_map, frame, done, convert
        loop = asyncio.get_running_loop()
        self.state = _Adopted(encode_request(frame), loop.time() + frame.timeout_s + GRACE_S, shape, cost)
        self.over = False
        self.timer: asyncio.TimerHandle | None = None
        member = holders[0]
        self.holders = holders[1:]
        delay = hedge_delay(path.latency, member, path.in_flight[member])
        self.ask = path._start_now(shard_map, member, self.state, self._land)
        if self.ask is None:  # no connection up: _send asks it (and opens it) in a task
            self.holders = holders
            self._hand_over()
            return
        self.state.tasks[member] = self.ask
        when = min(self.state.deadline, loop.time() + delay) if self.holders else self.state.deadline
        self.timer = loop.call_at(when, self._hand_over)

    def _land(self, member: str, outcome: QueryAnswer | Exception) -> None:
        if self.over:
            return
        if isinstance(outcome, Exception):  # _send looks at it: the next store, or the caller's own path
            self.state.landing.land(member, outcome)
            self._hand_over()
            return
        if not self._end():
            return
        self.path.counters["whole_queries"] += 1
        self.done(outcome)

    def _hand_over(self) -> None:
        if not self._end():
            return
        if self.ask is not None:
            self.ask.land = self.state.landing.land
        state, holders = self.state, self.holders
        self.convert(functools.partial(self.path._send, self.shard_map, holders, self.frame, state))

    def cancel(self) -> None:
        if self._end() and self.ask is not None:
            self.ask.cancel()

    def abandon(self) -> None:
        """After a hand-over, when the continuing task has ended: every ask it adopted let go (done
        by _send as it ends; this is for a task cancelled before _send ever ran)."""
        for ask in self.state.tasks.values():
            ask.cancel()

    def _end(self) -> bool:
        """Whether this is the query's end here (the first of an answer, a hand-over, a cancel)."""
        if self.over:
            return False
        self.over = True
        if self.timer is not None:
            self.timer.cancel()
        return True


class _NowAsk:
    """An ask sent at once (WholeQueryPath._start): its outcome handed over from the turn of the
    loop that read the answer; cancelled (a hedge won, the query ended), its late answer dropped."""

    __slots__ = ("alone", "cost", "forget", "land", "member", "over", "path", "shape", "t0")

    def __init__(self, path: WholeQueryPath, member: str, land: Callable[[str, QueryAnswer | Exception], None],
                 cost: float, shape: QueryShape, *, alone: bool) -> None:
        self.path, self.member, self.land, self.cost, self.shape, self.alone = path, member, land, cost, shape, alone
        self.t0 = path.view.clock.monotonic()
        self.forget: Callable[[], object] = _nothing
        self.over = False

    def deliver(self, result: bytes | Exception) -> None:
        if self.over:
            return
        self.over = True
        self.path._leave(self.member, self.cost)
        self.land(self.member, self.path._outcome(self.member, self.t0, result, self.shape, self.alone))

    def cancel(self) -> None:
        if self.over:
            return
        self.over = True
        self.forget()
        self.path._leave(self.member, self.cost)
        self.path.latency.record(self.member, self.path.view.clock.monotonic() - self.t0)  # at least this long


def _nothing() -> None:
    pass


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
