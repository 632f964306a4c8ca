"""A store's end of the read port's QUERY frame (served by metricsd/cmd/store.py; here beside the HTTP
API because it answers as that API does) (metricsd/rpc/wholequery.py): evaluate a whole
PromQL query over this store's data and answer the finished result.

The query runs through the same QueryRunner the HTTP API uses (metricsd/promql/queries.py), with
the proxy's settings from the frame, over this store's backend: in a cluster that backend checks
slot ownership (metricsd/replica/ownership.py), so a store whose map says it does not hold a slot
the proxy named refuses (FAILED_PRECONDITION), and the proxy falls back to its own path. When the
frame names some slots only, every read the engine makes is restricted to them, so series of
slots the proxy reads elsewhere are not counted twice.

Errors are answered as the HTTP API answers them (errorType, message, status), the same text the
proxy's own evaluation would give; NotOwner and Unavailable go back as frame errors.

Asked (the frame's ``cpu``), the answer carries the store's own time for the query (``_Timed``):
the CPU of the loop's steps that ran it, plus the wall time it waited on a worker thread (the
engine's heavy evaluations, promql/queries.py, whose CPU the loop's thread clock does not see).
A proxy learns each query's cost from it (proxy/wholeorder.py), a cost that the machine's load
and the queries queued beside it barely move, where an answer's wall time moves with both.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import time
from collections.abc import Callable, Coroutine, Generator, Sequence
from typing import Any

from metricsd.columns import SeriesColumns
from metricsd.http.params import STATUS_OF
from metricsd.promql import PromQLError, to_prometheus_data
from metricsd.promql.limits import QueryLimitError, QueryLimits
from metricsd.promql.queries import QueryRunner
from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc.backend import BadRequest, LimitExceeded, MetricsBackend, NotOwner, Unavailable
from metricsd.rpc.columnar import list_columns, read_columns
from metricsd.rpc.wholequery import ANSWER_DATA, QueryFrame, RunnerSettings, decode_request, error_answer, timed_answer
from metricsd.rpc.wire import matchers_to_pb, slot_filter_from_pb
from metricsd.selector import Matcher

__all__ = ["QueryService", "SlotScoped"]

log = logging.getLogger("metricsd.http.wholequery")

TIMED_OUT = "query timed out in expression evaluation"  # the HTTP API's words (metricsd/http/promapi.py)
MAX_RUNNERS = 8  # distinct proxy settings kept (one per proxy configuration; bounded against a flood)

_DATA = bytes([ANSWER_DATA])
_SLOTS: contextvars.ContextVar[pb.SlotFilter | None] = contextvars.ContextVar("metricsd_query_slots", default=None)


class SlotScoped:
    """``inner`` with every read restricted to the slot filter of the query being answered (a
    context variable: each query's task sees its own); without one, reads pass unchanged."""

    def __init__(self, inner: MetricsBackend) -> None:
        self.inner = inner

    def _scoped(self, request: Any) -> Any:
        f = _SLOTS.get()
        if f is None:
            return request
        sub = type(request)()
        sub.CopyFrom(request)
        sub.slots.CopyFrom(f)
        return sub

    async def read(self, request: pb.ReadRequest) -> pb.ReadResponse:
        return await self.inner.read(self._scoped(request))

    async def aggregate(self, request: pb.AggregateRequest) -> pb.AggregateResponse:
        return await self.inner.aggregate(self._scoped(request))

    async def read_columns(self, request: pb.ReadRequest) -> SeriesColumns:  # the engine's reads: no protobuf
        return await read_columns(self.inner, self._scoped(request))

    async def read_selection(self, matchers: Sequence[Matcher], start_ms: int, end_ms: int, max_series: int = 0,
                             max_samples: int = 0) -> SeriesColumns:
        """The PromQL prefetch's read of a store in this process (LocalBackend.read_selection), no
        ReadRequest either way, scoped to the frame's slots like every other read here."""
        direct = getattr(self.inner, "read_selection", None)
        if direct is None:  # a backend without it: the ReadRequest it would have been
            request = pb.ReadRequest(matchers=matchers_to_pb(matchers), start_ms=start_ms, end_ms=end_ms,
                                     max_series=max_series, max_samples=max_samples)
            return await self.read_columns(request)
        f = _SLOTS.get()
        got: SeriesColumns = await direct(matchers, start_ms, end_ms, max_series, max_samples,
                                          None if f is None else slot_filter_from_pb(f))
        return got

    async def list_columns(self, request: pb.ListSeriesRequest) -> SeriesColumns:
        return await list_columns(self.inner, self._scoped(request))

    async def rollups(self, request: pb.ReadRequest) -> pb.RollupsResponse:
        return await self.inner.rollups(self._scoped(request))

    async def list_series(self, request: pb.ListSeriesRequest) -> pb.ListSeriesResponse:
        return await self.inner.list_series(self._scoped(request))

    async def label_values(self, request: pb.LabelValuesRequest) -> pb.LabelValuesResponse:
        return await self.inner.label_values(self._scoped(request))

    def __getattr__(self, name: str) -> Any:  # write, health, stats: not scoped
        return getattr(self.inner, name)


class QueryService:
    """Answers QUERY frames over ``backend``; ``check_slots(filter)`` (the ownership check, when
    the store is a cluster member) refuses a query naming every slot when some is not held."""

    def __init__(self, backend: MetricsBackend) -> None:
        self.backend = SlotScoped(backend)
        check: Callable[[pb.SlotFilter, str], None] | None = getattr(backend, "check_filter", None)
        self.check_slots = check
        self._runners: dict[RunnerSettings, QueryRunner] = {}
        self._every: dict[int, pb.SlotFilter] = {}  # num_slots -> the filter naming all of them (read only)
        self.answered = 0

    def _runner(self, s: RunnerSettings) -> QueryRunner:
        runner = self._runners.get(s)
        if runner is None:
            if len(self._runners) >= MAX_RUNNERS:
                self._runners.clear()
            try:
                limits = QueryLimits(**dict(s.limits))
            except ValueError as e:
                raise BadRequest(f"query frame: limits: {e}") from None
            runner = self._runners[s] = QueryRunner(self.backend, lookback_ms=s.lookback_ms,
                                                    max_samples=s.max_samples, allow_pushdown=s.pushdown,
                                                    limits=limits, timeout_s=s.timeout_s)
        return runner

    async def answer(self, body: bytes) -> bytes:
        """The answer's body (rpc/FORMAT.md); raises BadRequest for a frame out of format, NotOwner
        when a slot named is not held, Unavailable as a read would."""
        began = time.thread_time_ns()
        try:
            frame = decode_request(body)
        except ValueError as e:
            raise BadRequest(str(e)) from None
        if frame.slots is None:
            if self.check_slots is not None:
                every = self._every.get(frame.num_slots)
                if every is None:  # built once per slot count, not once a query
                    if len(self._every) >= MAX_RUNNERS:
                        self._every.clear()
                    every = self._every[frame.num_slots] = pb.SlotFilter(slot_count=frame.num_slots,
                                                                        slots=range(frame.num_slots))
                self.check_slots(every, "query")
            token = None
        else:
            token = _SLOTS.set(pb.SlotFilter(slot_count=frame.num_slots, slots=frame.slots))
        try:
            if not frame.cpu:
                return await self._evaluate(frame)
            timed = _Timed(self._evaluate(frame))
            timed.ns = time.thread_time_ns() - began  # the frame's decoding and the slot check
            answer = await timed
            return timed_answer(timed.ns, answer)
        finally:
            if token is not None:
                _SLOTS.reset(token)

    async def _evaluate(self, frame: QueryFrame) -> bytes:
        """The query under one deadline: the frame's own when it is the shorter (or equal), else the
        runner's (the proxy's --query.timeout). Two timers cost ~2% of a store's (b) frame
        (perf/RESULTS.md, issue 23 session 37); a frame's timeout is answered as the HTTP API words it."""
        runner = self._runner(frame.settings)
        # QueryRunner times a query only when its own limit is the shorter; at the frame's limit or
        # below, the caller's timer is the one (promql/queries.py _admitted), and here that is this
        own: contextlib.AbstractAsyncContextManager[Any] = (
            asyncio.timeout(frame.timeout_s) if frame.timeout_s and frame.timeout_s <= runner.timeout_s
            else contextlib.nullcontext())
        try:
            async with own:
                if frame.instant:
                    result, _ = await runner.instant(frame.query, frame.start_ms, timeout_s=frame.timeout_s)
                else:
                    result, _ = await runner.range(frame.query, frame.start_ms, frame.end_ms, frame.step_ms,
                                                   timeout_s=frame.timeout_s)
        except TimeoutError:  # as the HTTP API words it (metricsd/http/promapi.py)
            return error_answer("timeout", TIMED_OUT, STATUS_OF["timeout"])
        except QueryLimitError as e:
            if e.limit == "timeout" and frame.timeout_s <= frame.settings.timeout_s:
                # the request's own deadline (the runner's was the frame's): as the HTTP API's own
                # asyncio.timeout words it, with no limit counted (promapi.py _evaluate)
                return error_answer("timeout", TIMED_OUT, STATUS_OF["timeout"])
            return error_answer(e.kind, e.message, STATUS_OF.get(e.kind, 500), e.limit)
        except PromQLError as e:
            return error_answer(e.kind, e.message, STATUS_OF.get(e.kind, 500))
        except (NotOwner, Unavailable):
            raise  # the proxy asks another replica, or falls back
        except BadRequest as e:
            return error_answer("bad_data", str(e), STATUS_OF["bad_data"])
        except LimitExceeded as e:
            return error_answer("resource_exhausted", str(e), 429)
        except Exception as e:  # never leave the proxy waiting on a frame that is not answered
            log.exception("query %r failed", frame.query)
            return error_answer("internal", f"internal error: {type(e).__name__}", 500)
        self.answered += 1
        return _DATA + to_prometheus_data(result)


class _Timed:
    """Awaits ``coro``, summing into ``ns`` the thread CPU time of each of its steps (the loop's
    other tasks, run between them, are not counted) and, for each future it waits on, the wall
    time until the loop runs that future's callbacks (a bare yield counts nothing). A query here
    waits on nothing but a worker thread (its reads of this store answer without suspending; the
    engine's heavy evaluations go to a thread, whose CPU this thread's clock does not see) or,
    past the query limits' concurrency, on its turn: that wait counts too, and the proxy takes the
    least of a shape's recent times (QueryCosts), which such a wait does not lower."""

    __slots__ = ("coro", "ns")

    def __init__(self, coro: Coroutine[Any, Any, bytes]) -> None:
        self.coro = coro
        self.ns = 0

    def __await__(self) -> Generator[Any, Any, bytes]:
        coro, clock = self.coro, time.thread_time_ns
        value: Any = None
        error: BaseException | None = None
        while True:
            t0 = clock()
            try:
                waits_on = coro.send(value) if error is None else coro.throw(error)
            except StopIteration as done:
                self.ns += clock() - t0
                answer: bytes = done.value
                return answer
            self.ns += clock() - t0
            wait = _Wait(waits_on)
            try:
                value, error = (yield waits_on), None
            except BaseException as e:  # a cancellation: handed to the query
                value, error = None, e
            self.ns += wait.ns()


class _Wait:
    """The wall time of a wait on ``fut`` (a bare yield, asyncio.sleep(0): none): from now until
    the loop runs the future's callbacks (this one first, the query's wake-up after it)."""

    __slots__ = ("end", "start")

    def __init__(self, fut: Any) -> None:
        self.start = self.end = 0
        add = getattr(fut, "add_done_callback", None)
        if add is not None:
            self.start = time.perf_counter_ns()
            add(self._done)

    def _done(self, _: object) -> None:
        self.end = time.perf_counter_ns()

    def ns(self) -> int:
        if not self.start:
            return 0
        return (self.end or time.perf_counter_ns()) - self.start
