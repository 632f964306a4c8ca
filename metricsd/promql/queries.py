"""PromQL over a MetricsBackend: push the aggregation down when the shape allows, else prefetch
the selectors' data and run the engine over it.

The engine is synchronous and CPU-bound; it runs on a worker thread so the event loop keeps
serving (its source is immutable prefetched data, so that is safe).
"""

from __future__ import annotations

import asyncio
from typing import Literal

import numpy as np

from metricsd.promql import Engine, Matrix, MemorySource, PromQLError, Result, pushdown
from metricsd.promql.engine import MAX_POINTS, parse
from metricsd.promql.prefetch import fetch_all, plan_fetches
from metricsd.promql.selectors import TOO_MANY_SAMPLES, EvalContext
from metricsd.rpc.backend import BadRequest, MetricsBackend

__all__ = ["QueryRunner", "check_range"]

Path = Literal["pushdown", "engine"]


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
                 allow_pushdown: bool = True) -> None:
        self.backend = backend
        self.lookback_ms = lookback_ms
        self.max_samples = max_samples
        self.allow_pushdown = allow_pushdown

    async def instant(self, expr: str, time_ms: int) -> tuple[Result, Path]:
        return await self._run(expr, time_ms, time_ms, 1, instant=True)

    async def range(self, expr: str, start_ms: int, end_ms: int, step_ms: int) -> tuple[Matrix, Path]:
        check_range(start_ms, end_ms, step_ms)
        res, path = await self._run(expr, start_ms, end_ms, step_ms, instant=False)
        assert isinstance(res, Matrix)
        return res, path

    async def _run(self, expr: str, start_ms: int, end_ms: int, step_ms: int, *, instant: bool) -> tuple[Result,
                                                                                                        Path]:
        ast, negative_at = parse(expr)
        if self.allow_pushdown and not negative_at:
            p = pushdown.plan(ast, start_ms, end_ms, step_ms, self.lookback_ms, instant=instant)
            if p is not None:
                try:
                    resp = await self.backend.aggregate(p.request)
                except BadRequest:
                    pass  # a shape the stores refuse (a limit, say): the engine answers instead
                else:
                    if len(resp.timestamps) == (end_ms - start_ms) // step_ms + 1 and pushdown.trustworthy(p, resp):
                        return pushdown.result_of(p, resp), "pushdown"
        steps = np.arange(start_ms, end_ms + 1, step_ms, dtype=np.int64)
        ctx = EvalContext(MemorySource(), start_ms, end_ms, step_ms, steps, self.lookback_ms, self.max_samples,
                          negative_at)
        source = await fetch_all(self.backend, plan_fetches(ast, ctx))
        if source.samples > self.max_samples:
            raise PromQLError("execution", TOO_MANY_SAMPLES)
        engine = Engine(source, lookback_ms=self.lookback_ms, max_samples=self.max_samples)
        if instant:
            return await asyncio.to_thread(engine.instant, expr, start_ms), "engine"
        return await asyncio.to_thread(engine.range, expr, start_ms, end_ms, step_ms), "engine"
