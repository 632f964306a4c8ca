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
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import promql_parser as pp

from metricsd.columns import search_each as search_rows
from metricsd.model import METRIC_NAME, Labels
from metricsd.promql.source import SeriesSource, stale_mask
from metricsd.promql.values import PromQLError, StepSeries
from metricsd.selector import InvalidSelector, Matcher, MatchOp

__all__ = ["EvalContext", "RangeArg", "eval_matrix_selector", "eval_vector_selector", "td_ms"]

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


def to_matchers(vs: Any) -> list[Matcher]:
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


def eval_vector_selector(ctx: EvalContext, vs: Any) -> list[StepSeries]:
    times = ctx.selector_times(vs.at, vs.offset)
    lo_t = int(times.min()) - ctx.lookback_ms + 1
    data = sorted(ctx.source.select(to_matchers(vs), lo_t, int(times.max())), key=lambda s: s.labels)
    data = [sd for sd in data if sd.timestamps.size]
    ts, vals, offsets = _flatten([sd.timestamps for sd in data], [sd.values for sd in data])
    if ts.size == 0:
        return []
    idx = search_rows(ts, offsets, times) - 1  # newest sample at or before each step
    ok = idx >= offsets[:-1, None]
    idx = np.where(ok, idx, 0)
    ok &= ts[idx] > times[None, :] - ctx.lookback_ms
    ok &= ~stale_mask(vals)[idx]
    ctx.charge(int(ok.sum()))
    values = np.where(ok, vals[idx], np.nan)
    return [StepSeries(sd.labels, values[i], ok[i]) for i, sd in enumerate(data) if ok[i].any()]


@dataclass
class RangeArg:
    """A range vector across steps: each series' non-stale samples and every step's window.

    Step i's window is (ends[i] - range_ms, ends[i]], as ``lo[i]:hi[i]`` into the series' arrays.
    """

    series: list[tuple[Labels, np.ndarray, np.ndarray]]
    ends: np.ndarray
    range_ms: int

    def windows(self, ts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        lo = np.searchsorted(ts, self.ends - self.range_ms, side="right")
        hi = np.searchsorted(ts, self.ends, side="right")
        return lo, hi

    def flat(self) -> FlatWindows:
        """All series in one array, every (series, step) window found in one search."""
        ts, vals, offsets = _flatten([t for _, t, _ in self.series], [v for _, _, v in self.series])
        lo = search_rows(ts, offsets, self.ends - self.range_ms)
        hi = search_rows(ts, offsets, self.ends)
        return FlatWindows(ts, vals, offsets, lo, hi)


def _flatten(ts_list: list[np.ndarray], vals_list: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    sizes = np.array([t.size for t in ts_list], dtype=np.int64)
    offsets = np.concatenate([np.zeros(1, dtype=np.int64), np.cumsum(sizes)])
    if not ts_list:
        return np.zeros(0, dtype=np.int64), np.zeros(0), offsets
    return np.concatenate(ts_list), np.concatenate(vals_list), offsets


@dataclass
class FlatWindows:
    """Series concatenated; ``lo``/``hi`` (series x steps) index the flat arrays."""

    ts: np.ndarray
    vals: np.ndarray
    offsets: np.ndarray  # series i is ts[offsets[i]:offsets[i + 1]]
    lo: np.ndarray
    hi: np.ndarray


def eval_matrix_selector(ctx: EvalContext, ms: Any) -> RangeArg:
    vs = ms.vector_selector
    range_ms = td_ms(ms.range)
    ends = ctx.selector_times(vs.at, vs.offset)
    data = sorted(
        ctx.source.select(to_matchers(vs), int(ends.min()) - range_ms + 1, int(ends.max())), key=lambda s: s.labels
    )
    arg = RangeArg([], ends, range_ms)
    ts, vals, offsets = _flatten([sd.timestamps for sd in data], [sd.values for sd in data])
    fresh = ~stale_mask(vals)
    kept = np.concatenate([np.zeros(1, dtype=np.int64), np.cumsum(fresh)])[offsets]  # offsets without stale
    ts, vals = ts[fresh], vals[fresh]
    for i, sd in enumerate(data):
        if kept[i + 1] > kept[i]:
            arg.series.append((sd.labels, ts[kept[i] : kept[i + 1]], vals[kept[i] : kept[i + 1]]))
    fw = arg.flat()
    ctx.charge(int((fw.hi - fw.lo).sum()))
    return arg
