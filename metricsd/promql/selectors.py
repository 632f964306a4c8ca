"""Vector and matrix selectors: from the AST's matchers, ``offset`` and ``@`` to per-step samples.

Prometheus 3 semantics: an instant selector at time t takes the newest sample in
(t - lookback, t], and is absent if that sample is a stale marker; a range selector ``[d]``
takes every non-stale sample in (t - d, t]. ``@`` pins the evaluation time of a selector,
``offset`` shifts it back.
"""

from __future__ import annotations

import datetime as dt
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import promql_parser as pp

from metricsd.columns import LabelColumns, SeriesColumns
from metricsd.columns import search_each as search_rows
from metricsd.model import METRIC_NAME, Labels
from metricsd.promql.source import SeriesSource, stale_mask
from metricsd.promql.values import PromQLError, VectorBlock
from metricsd.selector import InvalidSelector, Matcher, MatchOp

__all__ = ["EvalContext", "RangeArg", "eval_matrix_selector", "eval_vector_selector", "matrix_arg", "matrix_data",
           "td_ms"]

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
# The binding's enum is unhashable; map by its string form.
_OPS = {
    "MatchOp.Equal": MatchOp.EQ,
    "MatchOp.NotEqual": MatchOp.NEQ,
    "MatchOp.Re": MatchOp.RE,
    "MatchOp.NotRe": MatchOp.NRE,
}
TOO_MANY_SAMPLES = "query processing would load too many samples into memory in query execution"


class AtResolver(Protocol):
    def __call__(self, at: Any) -> int: ...


@dataclass
class EvalContext:
    """Per-query state: the steps, the data source, limits and the sample budget."""

    source: SeriesSource
    start_ms: int
    end_ms: int
    step_ms: int
    steps: np.ndarray  # int64 ms
    lookback_ms: int
    max_samples: int
    negative_at: dict[int, int]  # placeholder @ time (ms) -> the real negative time (ms)
    samples: int = 0
    deadline: float | None = None  # time.monotonic() after which evaluation stops with "timeout"

    @property
    def n(self) -> int:
        return int(self.steps.size)

    def charge(self, count: int) -> None:
        """Count samples loaded; raise once a query goes over its budget."""
        self.samples += count
        if self.samples > self.max_samples:
            raise PromQLError("execution", TOO_MANY_SAMPLES)
        self.check_deadline()

    def check_deadline(self) -> None:
        """Raises PromQLError("timeout") past the deadline: an engine thread whose request timed
        out stops at its next selector or node instead of computing for nobody."""
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise PromQLError("timeout", "query timed out in expression evaluation")

    def at_ms(self, at: Any) -> int:
        if at.type == pp.AtModifierType.Start:
            return self.start_ms
        if at.type == pp.AtModifierType.End:
            return self.end_ms
        ms = dt_ms(at.at)
        return self.negative_at.get(ms, ms)

    def selector_times(self, at: Any, offset: dt.timedelta | None) -> np.ndarray:
        """The time each step looks at: the step (or the ``@`` time) minus the offset."""
        times = self.steps if at is None else np.full(self.n, self.at_ms(at), dtype=np.int64)
        return times - (td_ms(offset) if offset is not None else 0)


def td_ms(td: dt.timedelta) -> int:
    return td.days * 86_400_000 + td.seconds * 1000 + td.microseconds // 1000


def dt_ms(t: dt.datetime) -> int:
    return td_ms(t - _EPOCH)


def re2_to_python(pattern: str) -> str:
    """Rewrite RE2's inline flags ``(?i)`` anywhere in a group into Python's scoped ``(?i:...)``.

    In RE2 (Go) a flag group applies to the rest of the enclosing group; Python 3.11 only accepts
    global flags at the very start of a pattern, and the matcher wraps every pattern in a group.
    """
    if "(?" not in pattern:
        return pattern
    out: list[str] = []
    opened: list[list[str]] = [[]]  # per group level: the flag groups opened in it, innermost last
    i, n, in_class = 0, len(pattern), False
    while i < n:
        c = pattern[i]
        if c == "\\":
            out.append(pattern[i : i + 2])
            i += 2
            continue
        if in_class:
            in_class = c != "]"
            out.append(c)
            i += 1
            continue
        if c == "[":
            in_class = True
            out.append(c)
            if pattern[i + 1 : i + 2] == "]":
                out.append("]")
                i += 1
            i += 1
            continue
        m = _FLAG_GROUP_RE.match(pattern, i)
        if m:
            flags = "".join(f for f in m.group(1) if f in "ims")
            out.append(f"(?{flags}:")
            opened[-1].append(flags)
            i = m.end()
            continue
        if c == "(":
            opened.append([])
        elif c == ")" and len(opened) > 1:
            out.append(")" * len(opened.pop()))
        elif c == "|" and opened[-1]:
            # The flags go on past the alternation in RE2: close, then reopen after the bar.
            out.append(")" * len(opened[-1]) + "|" + "".join(f"(?{f}:" for f in opened[-1]))
            i += 1
            continue
        out.append(c)
        i += 1
    out.append(")" * len(opened[0]))
    return "".join(out)


_FLAG_GROUP_RE = re.compile(r"\(\?([imsU]+)\)")


# A selector node's matchers, kept per node: the parsed-query cache (queries.py) hands the same AST
# to every repeat of a query text, whose selector is converted twice a query (plan, then eval), its
# regexes translated each time. Keyed by id(); the entry holds the node, so while it is kept no
# other object can have its id. Bounded; cleared whole when full.
_MATCHERS_KEPT = 4096
_matchers: dict[int, tuple[Any, tuple[Matcher, ...]]] = {}


def to_matchers(vs: Any) -> list[Matcher]:
    """A vector selector node's label matchers (its name first), a new list each call. Raises PromQLError."""
    kept = _matchers.get(id(vs))
    if kept is not None:
        return list(kept[1])
    out = _to_matchers(vs)
    if len(_matchers) >= _MATCHERS_KEPT:
        _matchers.clear()
    _matchers[id(vs)] = (vs, tuple(out))
    return out


def _to_matchers(vs: Any) -> list[Matcher]:
    out: list[Matcher] = []
    if vs.name:
        out.append(Matcher(MatchOp.EQ, METRIC_NAME, vs.name))
    if vs.matchers.or_matchers:
        raise PromQLError("execution", "'or' inside label matchers is not supported")
    try:
        for m in vs.matchers.matchers:
            op = _OPS[str(m.op)]
            value = re2_to_python(m.value) if op in (MatchOp.RE, MatchOp.NRE) else m.value
            out.append(Matcher(op, m.name, value))
    except InvalidSelector as e:
        raise PromQLError("bad_data", str(e)) from e
    return out


def eval_vector_selector(ctx: EvalContext, vs: Any) -> VectorBlock:
    times = ctx.selector_times(vs.at, vs.offset)
    lo_t = int(times.min()) - ctx.lookback_ms + 1
    data = ctx.source.select_columns(to_matchers(vs), lo_t, int(times.max()))
    ts, vals, offsets = data.timestamps, data.values, data.offsets
    if ts.size == 0:
        return VectorBlock(LabelColumns.empty(), np.zeros((0, times.size)), np.zeros((0, times.size), dtype=bool))
    idx = search_rows(ts, offsets, times) - 1  # newest sample at or before each step
    ok = idx >= offsets[:-1, None]
    idx = np.where(ok, idx, 0)
    ok &= ts[idx] > times[None, :] - ctx.lookback_ms
    ok &= ~stale_mask(vals)[idx]
    ctx.charge(int(ok.sum()))
    keep = np.flatnonzero(ok.any(axis=1))
    ok = ok[keep]
    return VectorBlock(data.labels.take(keep), np.where(ok, vals[idx[keep]], np.nan), ok)


@dataclass
class RangeArg:
    """A range vector across steps: each series' non-stale samples (every series has some) and
    every step's window, step i's being (ends[i] - range_ms, ends[i]]."""

    data: SeriesColumns
    ends: np.ndarray
    range_ms: int
    _flat: FlatWindows | None = field(default=None, repr=False)

    @property
    def series(self) -> Iterator[tuple[Labels, np.ndarray, np.ndarray]]:
        """Each series' labels, timestamps and values (one tuple per series: the general path)."""
        return (self.data.series_at(i) for i in range(len(self.data)))

    def windows(self, ts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        lo = np.searchsorted(ts, self.ends - self.range_ms, side="right")
        hi = np.searchsorted(ts, self.ends, side="right")
        return lo, hi

    def flat(self) -> FlatWindows:
        """All series in one array, every (series, step) window found in one search (kept)."""
        if self._flat is None:
            d = self.data
            lo = search_rows(d.timestamps, d.offsets, self.ends - self.range_ms)
            hi = search_rows(d.timestamps, d.offsets, self.ends)
            self._flat = FlatWindows(d.timestamps, d.values, d.offsets, lo, hi)
        return self._flat


@dataclass
class FlatWindows:
    """Series concatenated; ``lo``/``hi`` (series x steps) index the flat arrays."""

    ts: np.ndarray
    vals: np.ndarray
    offsets: np.ndarray  # series i is ts[offsets[i]:offsets[i + 1]]
    lo: np.ndarray
    hi: np.ndarray


def eval_matrix_selector(ctx: EvalContext, ms: Any) -> RangeArg:
    return matrix_arg(ctx, *matrix_data(ctx, ms))


def matrix_data(ctx: EvalContext, ms: Any) -> tuple[SeriesColumns, np.ndarray, int]:
    """A matrix selector's series, each with its non-stale samples (series left without are
    dropped), the end of every step's window and the range: eval_matrix_selector's read, which
    the narrow path (narrow.py) asks alone to answer one series without a RangeArg."""
    vs = ms.vector_selector
    range_ms = td_ms(ms.range)
    ends = ctx.selector_times(vs.at, vs.offset)
    data = ctx.source.select_columns(to_matchers(vs), int(ends.min()) - range_ms + 1, int(ends.max()))
    fresh = ~stale_mask(data.values)
    if not bool(fresh.all()):
        kept = np.concatenate([np.zeros(1, dtype=np.int64), np.cumsum(fresh)])[data.offsets]  # offsets without stale
        data = SeriesColumns(data.labels, kept, data.timestamps[fresh], data.values[fresh], data.ids)
    if len(data) == 1:  # a panel of one pod: its emptiness without a diff
        if int(data.offsets[1]) == int(data.offsets[0]):
            data = data.take(np.zeros(0, dtype=np.int64))
    elif bool((np.diff(data.offsets) == 0).any()):
        data = data.take(np.flatnonzero(np.diff(data.offsets) > 0))
    return data, ends, range_ms


def matrix_arg(ctx: EvalContext, data: SeriesColumns, ends: np.ndarray, range_ms: int) -> RangeArg:
    """matrix_data's answer as the range functions' argument, its samples charged to the query."""
    arg = RangeArg(data, ends, range_ms)
    fw = arg.flat()
    ctx.charge(int((fw.hi - fw.lo).sum()))
    return arg
