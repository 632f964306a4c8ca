"""QueryRunner keeps, per query text, what the text's shape alone decides (issue 23 session 38):
whether the aggregation push-down can take it and the narrow path's call. Grafana sends the same
text again with shifted times, and writes land between its requests: a kept shape must give the
answer a runner that never saw the text gives, at any times and after any write."""

from __future__ import annotations

import numpy as np
import pytest
from promql_script_http import _request as _write

from metricsd.model import Labels
from metricsd.promql import Matrix, pushdown
from metricsd.promql.queries import QueryRunner
from metricsd.store.api import LocalBackend, StoreAPI
from metricsd.store.engine import Store
from metricsd.store.settings import StoreSettings

SETTINGS = StoreSettings(chunk_samples=8, head_keep=3, require_pod_labels=False)
TEXTS = ['rate(m{pod="p0"}[1m])', "rate(m[2m])", "sum(rate(m[1m]))", 'delta(m{pod="p1"}[90s])', "m", "sum(m)"]


def _series(t0_s: int, n: int, scale: float) -> list[tuple[Labels, np.ndarray, np.ndarray]]:
    ts = (t0_s + np.arange(n, dtype=np.int64) * 10) * 1000
    return [((("__name__", "m"), ("pod", f"p{i}")), ts, np.cumsum(np.full(n, scale * (i + 1)))) for i in range(2)]


def _plain(res: object) -> object:
    if isinstance(res, Matrix):
        return [(s.labels, s.timestamps.tolist(), s.values.tolist()) for s in res.series]
    return repr(res)


async def _answers(runner: QueryRunner, text: str, start_ms: int) -> object:
    end = start_ms + 600_000
    got, path = await runner.range(text, start_ms, end, 30_000)
    return _plain(got), path


async def test_a_kept_shape_answers_as_a_fresh_runner_at_shifted_times_and_after_writes() -> None:
    api = StoreAPI(Store(SETTINGS))
    api.write(_write(_series(0, 60, 1.0)))
    kept = QueryRunner(LocalBackend(api))
    for round_ in range(3):
        for text in TEXTS + TEXTS[::-1]:  # the texts interleaved: each one's shape is its own
            for start in (0, 30_000, 45_500):
                fresh = QueryRunner(LocalBackend(api))
                assert await _answers(kept, text, start) == await _answers(fresh, text, start), (round_, text, start)
        # samples written after the shapes were kept (a counter reset too) are in the next answers
        api.write(_write(_series(600 + round_ * 300, 30, 0.5)))


async def test_a_text_the_push_down_refuses_is_not_planned_again(monkeypatch: pytest.MonkeyPatch) -> None:
    api = StoreAPI(Store(SETTINGS))
    api.write(_write(_series(0, 60, 1.0)))
    runner = QueryRunner(LocalBackend(api))
    plans: list[str] = []
    real = pushdown.plan

    def counted(ast: object, *args: object, **kwargs: object) -> object:
        plans.append(str(ast))
        return real(ast, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(pushdown, "plan", counted)
    for start in (0, 30_000, 60_000):
        await runner.range('rate(m{pod="p0"}[1m])', start, start + 300_000, 30_000)
        assert (await runner.range("sum(rate(m[1m]))", start, start + 300_000, 30_000))[1] == "pushdown"
    assert sum("sum" not in p for p in plans) == 1  # the one-series rate: planned once, refused
    assert sum("sum" in p for p in plans) == 3  # the aggregation: every time (its request has the times)


async def test_one_series_answers_carry_their_own_labels_while_kept() -> None:
    """narrow.py keeps a one-series answer's labels by the store's kept label columns: panels of
    different pods asked in turn, and a series added between (the store's selections are made
    again), each answer labelled with its own series."""
    api = StoreAPI(Store(SETTINGS))
    api.write(_write(_series(0, 60, 1.0)))
    runner = QueryRunner(LocalBackend(api))
    for round_ in range(3):
        pods = [f"p{i}" for i in range(2 + round_)]
        for pod in pods + pods[::-1]:
            got, _ = await runner.range(f'rate(m{{pod="{pod}"}}[1m])', 0, 600_000, 30_000)
            assert isinstance(got, Matrix) and [s.labels for s in got.series] == [(("pod", pod),)], (round_, pod)
        ts = np.arange(60, dtype=np.int64) * 10_000
        api.write(_write([((("__name__", "m"), ("pod", f"p{2 + round_}")), ts, np.arange(60.0))]))
