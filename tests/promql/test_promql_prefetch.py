"""The prefetch walk finds every selector with exactly the range the engine will read."""

from __future__ import annotations

import numpy as np
import pytest

from metricsd.columns import SeriesColumns
from metricsd.promql import MemorySource, PromQLError
from metricsd.promql.engine import parse
from metricsd.promql.prefetch import Fetch, PrefetchedSource, plan_fetches
from metricsd.promql.selectors import EvalContext
from metricsd.selector import Matcher, MatchOp

NAME = "__name__"


def _plan(expr: str, start: int, end: int, step: int = 60_000) -> dict[str, tuple[int, int]]:
    ast, neg = parse(expr)
    steps = np.arange(start, end + 1, step, dtype=np.int64)
    ctx = EvalContext(MemorySource(), start, end, step, steps, 300_000, 10**9, neg)
    out = {}
    for f in plan_fetches(ast, ctx):
        names = [m.value for m in f.matchers if m.name == NAME]
        out[names[0] if names else str(f.matchers)] = (f.start_ms, f.end_ms)
    return out


@pytest.mark.parametrize(("expr", "start", "end", "want"), [
    ("a", 1_000_000, 1_000_000, {"a": (700_001, 1_000_000)}),
    ("rate(a[2m])", 1_000_000, 1_060_000, {"a": (880_001, 1_060_000)}),
    ("a offset 10m", 1_000_000, 1_000_000, {"a": (100_001, 400_000)}),
    ("a @ 50", 1_000_000, 2_000_000, {"a": (-249_999, 50_000)}),
    ("a @ -50", 0, 0, {"a": (-349_999, -50_000)}),
    ("rate(a[1m] @ end() offset -1m)", 0, 600_000, {"a": (600_001, 660_000)}),
    ("sum(rate(a[5m])) / sum(a) + on() b", 600_000, 600_000, {"a": (300_001, 600_000), "b": (300_001, 600_000)}),
    ("histogram_quantile(0.9, sum by (le) (rate(h[1m])))", 120_000, 120_000, {"h": (60_001, 120_000)}),
    ("clamp(a, 0, scalar(b))", 600_000, 600_000, {"a": (300_001, 600_000), "b": (300_001, 600_000)}),
    ("vector(1) + time()", 0, 0, {}),
])
def test_planned_ranges(expr: str, start: int, end: int, want: dict[str, tuple[int, int]]) -> None:
    assert _plan(expr, start, end) == want


def test_a_selector_that_was_not_planned_is_an_error_not_empty() -> None:
    m = (Matcher(MatchOp.EQ, NAME, "a"),)
    src = PrefetchedSource({m: (Fetch(m, 0, 100), SeriesColumns.empty())})
    assert src.select(list(m), 10, 100) == []
    with pytest.raises(PromQLError, match="not prefetched"):
        src.select(list(m), -1, 100)
    with pytest.raises(PromQLError, match="not prefetched"):
        src.select([Matcher(MatchOp.EQ, NAME, "b")], 0, 100)
