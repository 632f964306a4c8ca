"""The narrow path (promql/narrow.py: a range function of one selector, read with one call and
evaluated without the evaluator) answers exactly what the general path answers: the same series,
timestamps and values bit for bit, or the same error. Random counters and gauges with resets,
stale markers and gaps, every range function, ranges and steps whose windows fall on samples
(the lookback edges), ``offset`` and ``@``, selectors of one series and of several (whose names
dropped may collide)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from promql_script_http import _request as _write

from metricsd.columns import LabelColumns
from metricsd.model import STALE_NAN_BITS, Labels
from metricsd.promql import Engine, Matrix, MemorySource, PromQLError, narrow
from metricsd.promql.engine import parse, range_matrix
from metricsd.promql.queries import QueryRunner
from metricsd.promql.rangefuncs import RANGE_FUNCTIONS
from metricsd.promql.values import VectorBlock
from metricsd.store.api import LocalBackend, StoreAPI
from metricsd.store.engine import Store
from metricsd.store.settings import StoreSettings

STALE = np.array([STALE_NAN_BITS], dtype=np.uint64).view(np.float64)[0]
SETTINGS = StoreSettings(chunk_samples=8, head_keep=3, require_pod_labels=False)
SELECTORS = ['m{pod="p0"}', "m", '{__name__=~"m|n"}', '{__name__=~"m|n",pod="p1"}', 'm{pod="none"}']
MODIFIERS = ["", " offset 1m", " offset -30s", " @ 600", " @ 1234.5"]
RANGES = ["10s", "30s", "1m", "90s", "2m", "5m", "10m"]


@st.composite
def dataset(draw: st.DrawFn) -> list[tuple[Labels, np.ndarray, np.ndarray]]:
    """One to three series: counters (with resets to zero) or gauges, 10 s apart mostly, with
    gaps of minutes, stale markers, and values that may repeat."""
    out = []
    for i in range(draw(st.integers(1, 3))):
        name = draw(st.sampled_from(["m", "n"])) if i else "m"
        n = draw(st.integers(1, 60))
        gaps = draw(st.lists(st.sampled_from([1, 5, 10, 10, 10, 15, 30, 61, 240, 600]), min_size=n, max_size=n))
        ts = (np.cumsum(np.array(gaps, dtype=np.int64)) + draw(st.integers(0, 9))) * 1000
        steps = np.array(draw(st.lists(st.integers(0, 40), min_size=n, max_size=n)), dtype=np.float64) / 8
        if draw(st.booleans()):  # a counter, with resets
            vals = np.cumsum(steps)
            for r in draw(st.lists(st.integers(0, n - 1), max_size=3)):
                vals[r:] -= vals[r]
        else:
            vals = steps - 2.5
        for s in draw(st.lists(st.integers(0, n - 1), max_size=3)):
            vals[s] = STALE
        labels = tuple(sorted({"__name__": name, "pod": f"p{i % 2}", "i": str(i)}.items()))
        out.append((labels, ts, vals))
    return out


def _plain(m: Matrix) -> list[tuple[Labels, list[int], list[int]]]:
    """A matrix with its values as bit patterns (NaN-exact comparison)."""
    return [(s.labels, s.timestamps.tolist(), np.asarray(s.values, np.float64).view(np.uint64).tolist())
            for s in m.series]


async def _answer(runner: QueryRunner, expr: str, start: int, end: int, step: int) -> Any:
    try:
        res, _ = await runner.range(expr, start, end, step)
    except PromQLError as e:
        return ("error", e.kind, e.message)
    assert isinstance(res, Matrix)
    return _plain(res)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(dataset(), st.sampled_from(sorted(RANGE_FUNCTIONS)), st.sampled_from(SELECTORS), st.sampled_from(RANGES),
       st.sampled_from(MODIFIERS), st.integers(0, 2_000), st.integers(0, 40), st.sampled_from([1, 5, 10, 15, 30, 60]))
async def test_the_narrow_path_answers_as_the_general_path(
        monkeypatch: pytest.MonkeyPatch, data: list[tuple[Labels, np.ndarray, np.ndarray]], fn: str, sel: str,
        rng: str, mod: str, start_s: int, n_steps: int, step_s: int) -> None:
    api = StoreAPI(Store(SETTINGS))
    api.write(_write(data))
    mem = MemorySource()
    for labels, ts, vals in data:
        mem.add(labels, ts, vals)
    expr = f"{fn}({sel}[{rng}]{mod})"
    start, step = start_s * 1000, step_s * 1000
    end = start + n_steps * step
    assert narrow.range_call(parse(expr)[0]) is not None
    runner = QueryRunner(LocalBackend(api), allow_pushdown=False)
    taken: list[str] = []
    evaluate = narrow.evaluate

    def spy(*a: Any) -> Matrix:
        taken.append(expr)
        return evaluate(*a)

    with monkeypatch.context() as patched:
        patched.setattr(narrow, "evaluate", spy)
        fast = await _answer(runner, expr, start, end, step)
        assert taken == [expr]  # the narrow path answered
        patched.setattr(narrow, "range_call", lambda ast: None)
        # a runner that has not seen the text (one that has keeps its narrow call, queries.py _shapes)
        general = await _answer(QueryRunner(LocalBackend(api), allow_pushdown=False), expr, start, end, step)
        assert taken == [expr]  # and not the second time
    assert fast == general, expr
    try:  # and both as the engine over the reference source
        want: Any = _plain(Engine(mem).range(expr, start, end, step))
    except PromQLError as e:
        want = ("error", e.kind, e.message)
    assert fast == want, expr


@pytest.mark.parametrize(("expr", "narrow_shape"), [
    ("rate(m[1m])", True),
    ("max_over_time(m{a='b'}[5m] offset 1m)", True),
    ("rate(m[1m]) * 2", False),
    ("sum(rate(m[1m]))", False),
    ("quantile_over_time(0.5, m[1m])", False),
    ("m", False),
    ("abs(m)", False),
    ("label_replace(m, 'a', 'b', 'c', 'd')", False),
])
def test_only_a_range_function_of_one_matrix_selector_is_narrow(expr: str, narrow_shape: bool) -> None:
    assert (narrow.range_call(parse(expr)[0]) is not None) == narrow_shape


async def test_the_limits_hold_on_the_narrow_path() -> None:
    data: list[tuple[Labels, np.ndarray, np.ndarray]] = [
        ((("__name__", "m"), ("i", str(i))), np.arange(1, 31, dtype=np.int64) * 10_000, np.arange(30.0))
        for i in range(3)]
    api = StoreAPI(Store(SETTINGS))
    api.write(_write(data))
    runner = QueryRunner(LocalBackend(api), max_samples=50)
    with pytest.raises(PromQLError) as e:
        await runner.range("rate(m[5m])", 0, 300_000, 10_000)
    assert (e.value.kind, "--query.max-samples" in e.value.message) == ("execution", True)
    assert len((await QueryRunner(LocalBackend(api)).range("rate(m[5m])", 0, 300_000, 10_000))[0].series) == 3


@given(st.lists(st.booleans(), min_size=1, max_size=20), st.booleans(),
       st.sampled_from([(("__name__", "m"), ("a", "b")), (("a", "b"),), (("__name__", "m"),)]))
def test_one_series_is_finished_as_the_general_finish_does(present: list[bool], drop_name: bool,
                                                          labels: Labels) -> None:
    """range_matrix's one-series branch against its general branch (the same block as a list)."""
    steps = np.arange(len(present), dtype=np.int64) * 1000
    ok = np.array([present])
    block = VectorBlock(LabelColumns.from_labels([labels]), np.where(ok, np.arange(len(present)) / 3, np.nan), ok,
                        drop_name=drop_name)
    assert _plain(range_matrix(block, steps)) == _plain(range_matrix(block.to_series(), steps))
