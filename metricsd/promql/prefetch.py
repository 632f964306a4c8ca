"""Fetch a query's data before evaluating it, the way Prometheus' queriers do.

The PromQL engine asks a synchronous :class:`SeriesSource`; the backend is async and may be a
proxy fanning out over the network. So the parsed query is walked first: every selector, with the
time range it will read (its steps, ``@`` and ``offset`` moved, widened by its range or the
lookback), is fetched through ``backend.read()`` concurrently, and the engine then runs over a
:class:`PrefetchedSource` holding exactly that data. A selector the walk did not plan for is an
error, never a silently empty answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from metricsd.columns import SeriesColumns
from metricsd.promql.selectors import EvalContext, td_ms, to_matchers
from metricsd.promql.source import SeriesData
from metricsd.promql.values import PromQLError
from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc.backend import MetricsBackend
from metricsd.rpc.columnar import read_columns
from metricsd.rpc.wire import matchers_to_pb
from metricsd.selector import Matcher

__all__ = ["Fetch", "PrefetchedSource", "fetch_all", "fetch_one", "plan_fetches", "selector_fetch"]

_CHILDREN = ("expr", "lhs", "rhs", "param", "vector_selector")


@dataclass
class Fetch:
    """One read: the series matching ``matchers`` with samples in [start_ms, end_ms]."""

    matchers: tuple[Matcher, ...]
    start_ms: int
    end_ms: int


def _walk(node: Any) -> Iterator[Any]:
    yield node
    kind = type(node).__name__
    if kind == "MatrixSelector":
        return  # its vector selector is read with the matrix's range, not the lookback
    for attr in _CHILDREN:
        child = getattr(node, attr, None)
        if child is not None and not isinstance(child, str | int | float):
            yield from _walk(child)
    if kind == "Call":
        for arg in node.args:
            yield from _walk(arg)


def plan_fetches(ast: Any, ctx: EvalContext) -> list[Fetch]:
    """Every selector in ``ast`` with the range the engine will ask of it, merged per selector.

    ``ctx`` carries the query's steps, lookback and the negative-``@`` placeholders (its source
    is not used).
    """
    ranges: dict[tuple[Matcher, ...], Fetch] = {}
    for node in _walk(ast):
        got = selector_fetch(node, ctx)
        if got is None:
            continue
        cur = ranges.get(got.matchers)
        if cur is None:
            ranges[got.matchers] = got
        else:
            cur.start_ms, cur.end_ms = min(cur.start_ms, got.start_ms), max(cur.end_ms, got.end_ms)
    return list(ranges.values())


def selector_fetch(node: Any, ctx: EvalContext) -> Fetch | None:
    """The read of one selector node (a vector selector over the lookback, a matrix selector over
    its range) for ``ctx``'s steps; None for any other node. plan_fetches merges them per selector;
    the narrow path (one matrix selector) asks it alone."""
    kind = type(node).__name__
    if kind == "VectorSelector":
        vs, width = node, ctx.lookback_ms
    elif kind == "MatrixSelector":
        vs, width = node.vector_selector, td_ms(node.range)
    else:
        return None
    times = ctx.selector_times(vs.at, vs.offset)  # never decreasing: the steps, moved, or one time
    return Fetch(tuple(to_matchers(vs)), int(times[0]) - width + 1, int(times[-1]))


class PrefetchedSource:
    """The data of a query's planned fetches; answers only the selectors that were planned.

    Immutable after construction, so the engine may run on a worker thread.
    """

    def __init__(self, fetched: dict[tuple[Matcher, ...], tuple[Fetch, SeriesColumns]]) -> None:
        self._fetched = fetched

    def select_columns(self, matchers: Sequence[Matcher], start_ms: int, end_ms: int) -> SeriesColumns:
        got = self._fetched.get(tuple(matchers))
        if got is None or start_ms < got[0].start_ms or end_ms > got[0].end_ms:
            raise PromQLError("execution", f"internal error: selector {list(matchers)} was not prefetched")
        data = got[1]
        if len(data) == 1:  # one series (the narrow path asks the read's own range): nothing to cut?
            lo, hi = int(data.offsets[0]), int(data.offsets[1])
            if hi > lo and int(data.timestamps[lo]) >= start_ms and int(data.timestamps[hi - 1]) <= end_ms:
                return data
        return data.window(start_ms, end_ms)

    def select(self, matchers: Sequence[Matcher], start_ms: int, end_ms: int) -> list[SeriesData]:
        cols = self.select_columns(matchers, start_ms, end_ms)
        return [SeriesData(*cols.series_at(i)) for i in range(len(cols))]

    @property
    def samples(self) -> int:
        return sum(data.samples for _, data in self._fetched.values())

    @property
    def widest(self) -> int:
        """The most series one selector read."""
        return max((len(data) for _, data in self._fetched.values()), default=0)


def _request(f: Fetch, max_series: int, max_samples: int) -> pb.ReadRequest:
    return pb.ReadRequest(matchers=matchers_to_pb(f.matchers), start_ms=f.start_ms, end_ms=f.end_ms,
                          max_series=max_series, max_samples=max_samples)


async def fetch_one(backend: MetricsBackend, fetch: Fetch, max_series: int = 0, max_samples: int = 0
                    ) -> PrefetchedSource:
    """fetch_all of one selector: the read awaited as it is, without a task to gather; a store in
    this process (LocalBackend.read_selection) is handed the matchers without a ReadRequest."""
    # the class's own method, not one a wrapper forwards by __getattr__ unchanged (a store's QUERY
    # frames read through SlotScoped, whose own read_selection keeps to the frame's slots)
    direct = getattr(backend, "read_selection", None) if hasattr(type(backend), "read_selection") else None
    if callable(direct):
        cols = await direct(fetch.matchers, fetch.start_ms, fetch.end_ms, max_series, max_samples)
    else:
        cols = await read_columns(backend, _request(fetch, max_series, max_samples))
    return PrefetchedSource({fetch.matchers: (fetch, cols)})


async def fetch_all(backend: MetricsBackend, fetches: Sequence[Fetch], max_series: int = 0,
                    max_samples: int = 0) -> PrefetchedSource:
    """Read every planned selector concurrently, each within the limits (0: none; a store refuses
    past them before it reads, LimitExceeded). Raises what the backend raises."""
    if len(fetches) == 1:
        return await fetch_one(backend, fetches[0], max_series, max_samples)
    got = await asyncio.gather(*(read_columns(backend, _request(f, max_series, max_samples)) for f in fetches))
    return PrefetchedSource({f.matchers: (f, cols) for f, cols in zip(fetches, got, strict=True)})
