"""PromQL over a MetricsBackend: push the aggregation down when the shape allows, else prefetch
the selectors' data and run the engine over it.

Before anything, a query passes the limits of metricsd/promql/limits.py (length, depth, operators:
what bounds the parser, which holds the GIL) and waits for one of ``max_concurrency`` slots. The
parse and the engine run on worker threads so the event loop keeps serving (the engine's source is
immutable prefetched data, so that is safe), and the engine stops at its next node once the
query's deadline has passed. A small query (at most INLINE_SAMPLES samples and steps) is
evaluated on the loop instead: the thread hop would cost it more than the evaluation.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any, Literal

import numpy as np

from metricsd.promql import Engine, Matrix, MemorySource, PromQLError, Result, Scalar, narrow, pushdown
from metricsd.promql.engine import MAX_POINTS, parse, prettify
from metricsd.promql.limits import Admission, QueryLimitError, QueryLimits, prescan, refused_by_store
from metricsd.promql.prefetch import Fetch, PrefetchedSource, fetch_all, fetch_one, plan_fetches, selector_fetch
from metricsd.promql.selectors import TOO_MANY_SAMPLES, EvalContext
from metricsd.rpc.backend import BadRequest, LimitExceeded, MetricsBackend

__all__ = ["QueryRunner", "check_range"]

PARSED_CACHE = 1024  # query texts whose parse QueryRunner keeps
# A query whose prefetched data holds at most this many samples is evaluated on the event loop: the
# hop to a worker thread and back (submit, a wake-up through the loop's self-pipe, the GIL changing
# hands twice) cost more than the engine itself for a dashboard's small query (perf/RESULTS.md,
# issue 23: a fifth of one store's CPU on rate() of one pod over an hour), while a query over
# 20,000 samples holds the loop for about a millisecond.
INLINE_SAMPLES = 20_000

Path = Literal["pushdown", "engine"]
_UNTIMED = contextlib.nullcontext()  # an async context manager too


def check_range(start_ms: int, end_ms: int, step_ms: int) -> None:
    """Prometheus' checks of a range query's parameters, with its messages (HTTP 400)."""
    if end_ms < start_ms:
        raise PromQLError("bad_data", 'invalid parameter "end": end timestamp must not be before start time')
    if step_ms <= 0:
        raise PromQLError(
            "bad_data", 'invalid parameter "step": zero or negative query resolution step widths are not '
            "accepted. Try a positive integer"
        )
    if (end_ms - start_ms) // step_ms + 1 > MAX_POINTS:
        raise PromQLError(
            "bad_data", "exceeded maximum resolution of 11,000 points per timeseries. Try decreasing the query "
            "resolution (?step=XX)"
        )


class QueryRunner:
    """Stateless between queries; safe to share across concurrent requests."""

    def __init__(self, backend: MetricsBackend, *, lookback_ms: int = 300_000, max_samples: int = 50_000_000,
                 allow_pushdown: bool = True, limits: QueryLimits | None = None, timeout_s: float = 30.0) -> None:
        self.backend = backend
        self.lookback_ms = lookback_ms
        self.max_samples = max_samples
        self.allow_pushdown = allow_pushdown
        self.limits = limits or QueryLimits()
        self.timeout_s = timeout_s
        self.admission = Admission(self.limits)
        # Dashboards and autoscalers ask the same few query texts again and again: their parses
        # (immutable ASTs from the Rust parser) are kept, so a repeat skips the parser and the
        # thread hop it runs behind. Bounded; cleared whole when full.
        self._parsed: dict[str, tuple[Any, dict[int, int]]] = {}
        # ... and what the text's shape alone decides (Grafana sends the same text again with
        # shifted times): whether pushdown.plan can take it (its None depends on the AST and the
        # lookback alone), and the narrow path's call (narrow.range_call). Cleared with the parses.
        self._shapes: dict[str, tuple[bool, tuple[str, Any] | None]] = {}

    # timeout_s, in instant() and range(): the caller's own time limit, which the caller enforces
    # around the call (its own timer and error, as promapi.py and the QUERY frames' wholequery.py
    # do); the runner then times the query only when its own limit is shorter.

    async def instant(self, expr: str, time_ms: int, timeout_s: float | None = None) -> tuple[Result, Path]:
        return await self._admitted(expr, time_ms, time_ms, 1, instant=True, timeout_s=timeout_s)

    async def range(self, expr: str, start_ms: int, end_ms: int, step_ms: int,
                    timeout_s: float | None = None) -> tuple[Matrix, Path]:
        check_range(start_ms, end_ms, step_ms)
        res, path = await self._admitted(expr, start_ms, end_ms, step_ms, instant=False, timeout_s=timeout_s)
        assert isinstance(res, Matrix)
        return res, path

    async def prettify(self, expr: str) -> str:
        """``expr`` as Prometheus' formatter writes it; the query limits' pre-scan first, then the
        parser on a worker thread. Raises QueryLimitError or PromQLError (bad_data)."""
        prescan(expr, self.limits)
        return await asyncio.to_thread(prettify, expr)

    async def _admitted(self, expr: str, start_ms: int, end_ms: int, step_ms: int, *, instant: bool,
                        timeout_s: float | None) -> tuple[Result, Path]:
        """Limits first (cheap, on the loop), then a slot, then the query under its deadline; the
        request's own timeout (the HTTP middleware's) can only be shorter."""
        if expr not in self._parsed:  # a kept parse passed the same limits before
            prescan(expr, self.limits)
        timeout = min(self.timeout_s, timeout_s) if timeout_s else self.timeout_s
        deadline = time.monotonic() + timeout
        # the caller's timer (started first) fires first at the same limit: no second timer then
        timer = asyncio.timeout(timeout) if timeout != timeout_s else _UNTIMED
        try:
            async with timer, self.admission:
                return await self._run(expr, start_ms, end_ms, step_ms, instant=instant, deadline=deadline)
        except TimeoutError:
            raise QueryLimitError("timeout", f"query timed out after {timeout:g} s (--query.timeout)",
                                  "timeout") from None

    async def _run(self, expr: str, start_ms: int, end_ms: int, step_ms: int, *, instant: bool,
                   deadline: float) -> tuple[Result, Path]:
        parsed = self._parsed.get(expr)
        if parsed is None:
            parsed = await asyncio.to_thread(parse, expr)
            if len(self._parsed) >= PARSED_CACHE:
                self._parsed.clear()
                self._shapes.clear()
            self._parsed[expr] = parsed
        ast, negative_at = parsed
        if instant and type(ast).__name__ == "NumberLiteral":
            # `1`, which Grafana asks to test a data source: the engine's answer (a scalar at the
            # query's time) without its context, read plan and evaluator: ~10 us of `1`'s ~350 over HTTP
            return Scalar(start_ms, float(ast.val)), "engine"
        shape = self._shapes.get(expr)
        if shape is None:
            shape = self._shapes[expr] = (True, narrow.range_call(ast))
        pushable, one_call = shape
        max_series = self.limits.max_series
        if self.allow_pushdown and not negative_at and pushable:
            p = pushdown.plan(ast, start_ms, end_ms, step_ms, self.lookback_ms, instant=instant)
            if p is None:
                self._shapes[expr] = (False, one_call)
            else:
                p.request.max_series = max_series
                try:
                    resp = await self.backend.aggregate(p.request)
                except BadRequest:
                    pass  # a shape the stores refuse: the engine answers instead
                except LimitExceeded as e:  # each store checks its own series (cheap there)
                    raise refused_by_store(str(e)) from None
                else:
                    if len(resp.timestamps) == (end_ms - start_ms) // step_ms + 1 and pushdown.trustworthy(p, resp):
                        return pushdown.result_of(p, resp), "pushdown"
        steps = np.arange(start_ms, end_ms + 1, step_ms, dtype=np.int64)
        ctx = EvalContext(MemorySource(), start_ms, end_ms, step_ms, steps, self.lookback_ms, self.max_samples,
                          negative_at, deadline=deadline)
        call = None if instant else one_call
        if call is not None:  # one matrix selector: its read is the plan
            fetch = selector_fetch(call[1], ctx)
            assert fetch is not None
            return await self._narrow(call, fetch, ctx), "engine"
        fetches = plan_fetches(ast, ctx)
        try:
            source = await fetch_all(self.backend, fetches, max_series, self.max_samples) if fetches \
                else PrefetchedSource({})
        except LimitExceeded as e:
            raise refused_by_store(str(e)) from None
        self._check_fetched(source)
        engine = Engine(source, lookback_ms=self.lookback_ms, max_samples=self.max_samples, deadline=deadline)
        if source.samples <= INLINE_SAMPLES and steps.size <= INLINE_SAMPLES:
            if instant:
                return engine.instant(expr, start_ms, parsed), "engine"
            return engine.range(expr, start_ms, end_ms, step_ms, parsed), "engine"
        if instant:
            return await asyncio.to_thread(engine.instant, expr, start_ms, parsed), "engine"
        return await asyncio.to_thread(engine.range, expr, start_ms, end_ms, step_ms, parsed), "engine"

    async def _narrow(self, call: tuple[str, Any], fetch: Fetch, ctx: EvalContext) -> Matrix:
        """A range function of one selector (promql/narrow.py): one read, then the selector and
        the function without the evaluator; the limits and the thread hop as on the general path."""
        try:
            source = await fetch_one(self.backend, fetch, self.limits.max_series, self.max_samples)
        except LimitExceeded as e:
            raise refused_by_store(str(e)) from None
        self._check_fetched(source)
        ctx.source = source
        if source.samples <= INLINE_SAMPLES and ctx.steps.size <= INLINE_SAMPLES:
            return narrow.evaluate(*call, ctx)
        return await asyncio.to_thread(narrow.evaluate, *call, ctx)

    def _check_fetched(self, source: PrefetchedSource) -> None:
        """The sample and series limits over what was read (a cluster's stores each checked their own)."""
        max_series = self.limits.max_series
        samples = source.samples
        if samples > self.max_samples:
            raise QueryLimitError("execution", f"{TOO_MANY_SAMPLES} (--query.max-samples {self.max_samples:,})",
                                  "max_samples")
        widest = source.widest
        if widest > max_series:  # the stores of a cluster each held fewer
            raise QueryLimitError("execution", f"query.max-series: a selector of the query matches {widest:,} series, "
                                  f"more than the limit of {max_series:,} (--query.max-series)", "max_series")
