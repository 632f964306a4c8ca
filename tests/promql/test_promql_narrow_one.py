"""The narrow path's one-series rate, increase and delta (narrow._one_extrapolated, 1-D arrays,
no RangeArg or block) against the general evaluation of the same selection (the range function
over matrix_arg, then range_matrix): the same series, steps and values bit for bit and the same
samples charged, on random counters with resets, gaps, stale markers, NaN, huge and negative
values, windows ending on samples; then through a store whose chunks are a few samples long,
with windows ending on every chunk's first and last sample and the kept decodes in use."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from promql_script_http import _request as _write

from metricsd.model import STALE_NAN_BITS, Labels
from metricsd.promql import Matrix, MemorySource, PromQLError, narrow
from metricsd.promql.engine import parse, range_matrix
from metricsd.promql.queries import QueryRunner
from metricsd.promql.rangefuncs import EXTRAPOLATED, RANGE_FUNCTIONS
from metricsd.promql.selectors import EvalContext, matrix_arg, matrix_data
from metricsd.store.api import LocalBackend, StoreAPI
from metricsd.store.engine import Store
from metricsd.store.settings import StoreSettings

STALE = np.array([STALE_NAN_BITS], dtype=np.uint64).view(np.float64)[0]
LABELS: Labels = (("__name__", "m"), ("pod", "p"))


def _plain(m: Matrix) -> list[tuple[Labels, list[int], list[int]]]:
    return [(s.labels, s.timestamps.tolist(), np.asarray(s.values, np.float64).view(np.uint64).tolist())
            for s in m.series]


@st.composite
def series(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray]:
    n = draw(st.integers(1, 80))
    gaps = draw(st.lists(st.sampled_from([1, 3, 10, 10, 10, 15, 30, 61, 300]), min_size=n, max_size=n))
    ts = (np.cumsum(np.array(gaps, dtype=np.int64)) + draw(st.integers(0, 9))) * 1000
    kind = draw(st.sampled_from(["counter", "gauge", "huge", "odd"]))
    inc = np.array(draw(st.lists(st.integers(0, 50), min_size=n, max_size=n)), dtype=np.float64) / 8
    if kind == "gauge":
        vals = inc - 3.0
    elif kind == "huge":
        vals = np.cumsum(inc) * 1e17 + 2.0**60
    else:
        vals = np.cumsum(inc)
    for r in draw(st.lists(st.integers(0, n - 1), max_size=4)):  # resets, to zero or part way
        vals[r:] -= vals[r] * draw(st.sampled_from([1.0, 0.5]))
    if kind == "odd":
        for i in draw(st.lists(st.integers(0, n - 1), max_size=3)):
            vals[i] = draw(st.sampled_from([np.nan, -0.0, np.inf, -np.inf, 0.0]))
    for s in draw(st.lists(st.integers(0, n - 1), max_size=3)):
        vals[s] = STALE
    return ts, vals


def _both(fn: str, ts: np.ndarray, vals: np.ndarray, expr_range: str, mod: str, start: int, end: int,
          step: int) -> tuple[Any, Any]:
    """(one-series answer, general answer), each with the samples charged, or the error."""
    mem = MemorySource()
    mem.add(LABELS, ts, vals)
    ms = parse(f"{fn}(m[{expr_range}]{mod})")[0].args[0]
    steps = np.arange(start, end + 1, step, dtype=np.int64)
    out = []
    for one in (True, False):
        ctx = EvalContext(mem, start, end, step, steps, 300_000, 10**9, {})
        try:
            data, ends, range_ms = matrix_data(ctx, ms)
            if one:
                if len(data) != 1:
                    return None, None
                got = narrow._one_extrapolated(fn, data, ends, range_ms, ctx)
            else:
                got = range_matrix(RANGE_FUNCTIONS[fn](matrix_arg(ctx, data, ends, range_ms)), steps)
            out.append((_plain(got), ctx.samples))
        except PromQLError as e:
            out.append(("error", e.kind, e.message))
    return out[0], out[1]


@settings(max_examples=400, deadline=None)
@given(series(), st.sampled_from(sorted(EXTRAPOLATED)), st.sampled_from(["10s", "30s", "1m", "61s", "5m", "1h"]),
       st.sampled_from(["", " offset 1m", " @ 300"]), st.integers(0, 1_500), st.integers(0, 150),
       st.sampled_from([1, 3, 10, 30, 60]))
def test_one_series_answers_as_the_general_evaluation(s: tuple[np.ndarray, np.ndarray], fn: str, rng: str, mod: str,
                                                      start_s: int, n_steps: int, step_s: int) -> None:
    ts, vals = s
    one, general = _both(fn, ts, vals, rng, mod, start_s * 1000, (start_s + n_steps * step_s) * 1000, step_s * 1000)
    assert one == general


@pytest.mark.parametrize("fn", sorted(EXTRAPOLATED))
def test_windows_ending_on_samples(fn: str) -> None:
    """Steps on every sample's timestamp and a millisecond either side: the window edges."""
    ts = np.arange(1, 200, dtype=np.int64) * 10_000
    vals = np.cumsum(np.arange(199) % 7, dtype=np.float64)
    vals[50:] -= 30.0  # a reset part way
    vals[120] = STALE
    for shift in (-1, 0, 1):
        one, general = _both(fn, ts, vals, "1m", "", 10_000 + shift, 1_990_000 + shift, 10_000)
        assert one == general and one is not None and one[0]


@pytest.mark.parametrize("fn", sorted(EXTRAPOLATED))
async def test_through_a_store_at_chunk_edges_with_kept_decodes(fn: str) -> None:
    rng = np.random.default_rng(7)
    ts = np.cumsum(rng.choice([10, 10, 10, 15, 90], size=400)).astype(np.int64) * 1000
    vals = np.cumsum(rng.integers(0, 9, size=400)).astype(np.float64)
    vals[150:] -= vals[150]
    api = StoreAPI(Store(StoreSettings(chunk_samples=9, head_keep=4, require_pod_labels=False)))
    api.write(_write([(LABELS, ts, vals)]))
    mem = MemorySource()
    mem.add(LABELS, ts, vals)
    e = api.store.chunks.entries(0)
    edges = sorted({int(x) + d for x in np.concatenate([e[:, 0], e[:, 1]]).tolist() for d in (-1, 0, 1)})
    runner = QueryRunner(LocalBackend(api), allow_pushdown=False)
    for rounds in range(2):  # the second time from the kept decodes
        for end in edges[::3]:
            for rng_s, step in ((60, 10_000), (300, 30_000)):
                expr = f"{fn}(m[{rng_s}s])"
                got, _ = await runner.range(expr, end - 600_000, end, step)
                ctx_steps = np.arange(end - 600_000, end + 1, step, dtype=np.int64)
                ctx = EvalContext(mem, end - 600_000, end, step, ctx_steps, 300_000, 10**9, {})
                ms = parse(expr)[0].args[0]
                want = range_matrix(RANGE_FUNCTIONS[fn](matrix_arg(ctx, *matrix_data(ctx, ms))), ctx_steps)
                assert _plain(got) == _plain(want), (expr, end, rounds)
    assert api.decoded.hits > 0


@given(st.lists(st.integers(0, 100), min_size=0, max_size=12, unique=True), st.integers(-5, 105),
       st.integers(-5, 105), st.integers(-5, 105), st.integers(0, 30))
def test_a_prefetched_series_is_cut_as_window_cuts_it(times: list[int], f_lo: int, width: int, q_lo: int,
                                                      q_width: int) -> None:
    """PrefetchedSource hands one series back uncut only when its samples lie in the range asked
    (a backend may answer more than it was asked): otherwise SeriesColumns.window's answer."""
    from metricsd.columns import SeriesColumns
    from metricsd.promql.prefetch import Fetch, PrefetchedSource

    ts = np.array(sorted(times), dtype=np.int64) * 1000
    data = SeriesColumns.from_arrays([LABELS], [ts], [ts / 7.0])
    fetch = Fetch((), f_lo * 1000, (f_lo + abs(width)) * 1000)
    source = PrefetchedSource({(): (fetch, data)})
    lo = max(fetch.start_ms, q_lo * 1000)
    hi = min(fetch.end_ms, lo + q_width * 1000)
    if hi < lo:
        return
    got, want = source.select_columns([], lo, hi), data.window(lo, hi)
    assert got.labels.to_list() == want.labels.to_list()
    assert (got.offsets.tolist(), got.timestamps.tolist(), got.values.tolist()) == (
        want.offsets.tolist(), want.timestamps.tolist(), want.values.tolist())
