"""Limits that keep one PromQL query from taking a server down, checked before any work.

The parser (promql-parser, in Rust) holds the GIL for its whole run and its time grows faster
than linearly with the number of binary operators: a 10 KB chain of ``1+1+...`` kept a server's
event loop busy for over 40 minutes, and 2,000 ``x+`` terms take over a second. A thread does not
help while the GIL is held, so :func:`prescan` bounds the input first with one linear pass in
Python: the query's length, its nesting depth (parentheses, brackets, braces) and its number of
binary operators outside label matchers and strings. Within the defaults the parse takes a few
milliseconds (perf/RESULTS.md, "Query limits"). Everything here is pure.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from metricsd.promql.values import ErrorKind, PromQLError

__all__ = ["Admission", "QueryLimitError", "QueryLimits", "count_operators", "prescan", "refused_by_store"]

_OPEN, _CLOSE = "([{", ")]}"
_OPERATOR_CHARS = frozenset("+-*/%^<>=!")
_WORD_OPERATORS = frozenset({"and", "or", "unless", "atan2"})


class QueryLimitError(PromQLError):
    """A query refused by a limit before it ran; ``limit`` names it (for the metrics)."""

    def __init__(self, kind: ErrorKind, message: str, limit: str) -> None:
        super().__init__(kind, message)
        self.limit = limit


def refused_by_store(message: str) -> QueryLimitError:
    """A store's LimitExceeded on a query (its message starts with the limit: ``query.max-series:``
    or ``query.max-samples:``) as the 422 that names it."""
    name = message.split(":", 1)[0].removeprefix("query.").replace("-", "_")
    return QueryLimitError("execution", message, name if name in ("max_series", "max_samples") else "store")


@dataclass(frozen=True)
class QueryLimits:
    """max_length: characters (VictoriaMetrics' -search.maxQueryLen is 16 KiB too);
    max_depth: nested (), [] and {}; max_operators: binary operators (a chain of 256 ``x+`` terms
    parses in about 15 ms); max_concurrency: queries evaluated at once (Prometheus'
    --query.max-concurrency); max_queued: queries waiting for a slot, beyond which a query is
    refused at once (503) rather than piling up; max_series: series one selector may select, in a
    query (on every path: the engine's reads, aggregates pushed down, and the series and label-name
    lookups), refused with 422 naming --query.max-series before any sample is read (VictoriaMetrics'
    -search.maxUniqueTimeseries is 300,000; a store here answers a selection of 500,000 series in
    a few seconds)."""

    max_length: int = 16 * 1024
    max_depth: int = 128
    max_operators: int = 256
    max_concurrency: int = 20
    max_queued: int = 200
    max_series: int = 500_000

    def __post_init__(self) -> None:
        if min(self.max_length, self.max_depth, self.max_operators, self.max_concurrency,
               self.max_series) < 1 or self.max_queued < 0:
            raise ValueError("query limits must be positive (max_queued may be 0)")


def count_operators(text: str) -> tuple[int, int]:
    """(binary operators, maximum nesting depth) of a query, in one pass.

    Strings ('...', "...", `...`, with backslash escapes) and comments (# to the end of the line)
    are skipped; inside {...} (label matchers) operator characters are not counted. A run of
    operator characters counts once (``>=``, ``!=``, ``=~``), as do the words and, or, unless,
    atan2. An over-count on odd input (a unary minus, say) only makes the check stricter.
    """
    ops = depth = max_depth = braces = 0
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in "'\"`":
            i += 1
            while i < n and text[i] != c:
                i += 2 if text[i] == "\\" and c != "`" else 1
        elif c == "#":
            while i < n and text[i] != "\n":
                i += 1
        elif c in _OPEN:
            depth += 1
            braces += c == "{"
            max_depth = max(max_depth, depth)
        elif c in _CLOSE:
            depth -= 1
            braces -= c == "}"
        elif c in _OPERATOR_CHARS:
            if braces <= 0:
                ops += 1
            while i + 1 < n and text[i + 1] in _OPERATOR_CHARS:
                i += 1
        elif c.isalpha() or c == "_":
            j = i
            while j < n and (text[j].isalnum() or text[j] in "_:"):
                j += 1
            if braces <= 0 and text[i:j].lower() in _WORD_OPERATORS:
                ops += 1
            i = j - 1
        i += 1
    return ops, max_depth


def prescan(text: str, limits: QueryLimits) -> None:
    """Raises PromQLError("bad_data", ...) naming the limit a query goes past; else nothing."""
    if len(text) > limits.max_length:
        raise QueryLimitError("bad_data", f"the query is {len(text):,} characters long; the limit is "
                                          f"{limits.max_length:,} (--query.max-length)", "max_length")
    ops, depth = count_operators(text)
    if depth > limits.max_depth:
        raise QueryLimitError("bad_data", f"the query nests {depth} levels deep; the limit is {limits.max_depth} "
                                          "(--query.max-depth)", "max_depth")
    if ops > limits.max_operators:
        raise QueryLimitError("bad_data", f"the query has {ops} binary operators; the limit is "
                                          f"{limits.max_operators} (--query.max-operators)", "max_operators")


class Admission:
    """At most ``max_concurrency`` queries at once, ``max_queued`` waiting; beyond that a query is
    refused at once with 503 ("unavailable"). Use as ``async with admission:``."""

    def __init__(self, limits: QueryLimits) -> None:
        self.limits = limits
        self._slots = asyncio.Semaphore(limits.max_concurrency)
        self.running = 0
        self.waiting = 0
        self.refused = 0

    async def __aenter__(self) -> None:
        if self._slots.locked() and self.waiting >= self.limits.max_queued:
            self.refused += 1
            raise QueryLimitError("unavailable", f"too many queries: {self.running} running and {self.waiting} "
                                                 f"waiting (--query.max-concurrency {self.limits.max_concurrency})",
                                  "max_concurrency")
        self.waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self.waiting -= 1
        self.running += 1

    async def __aexit__(self, *exc: object) -> None:
        self.running -= 1
        self._slots.release()
