"""A number alone (Grafana's `1`, its data-source test) is answered by QueryRunner without the
engine (promql/queries.py): the same scalar at the query's time, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from metricsd.promql import Engine, MemorySource, Scalar, queries
from metricsd.promql.engine import parse
from metricsd.promql.queries import QueryRunner
from metricsd.store.api import LocalBackend, StoreAPI
from metricsd.store.engine import Store


@pytest.mark.parametrize("expr", ["1", "0", "1.5e3", "0x1f", "Inf", "NaN", "-0.25", "(2)"])
async def test_an_instant_number_is_answered_as_the_engine_answers_it(monkeypatch: pytest.MonkeyPatch,
                                                                      expr: str) -> None:
    want = Engine(MemorySource()).instant(expr, 1_234_567)
    runner = QueryRunner(LocalBackend(StoreAPI(Store())))
    if type(parse(expr)[0]).__name__ == "NumberLiteral":  # the engine is not needed: break it to prove it
        monkeypatch.setattr(queries, "Engine", None)
    got, path = await runner.instant(expr, 1_234_567)
    assert isinstance(got, Scalar) and isinstance(want, Scalar) and path == "engine"
    assert got.time_ms == want.time_ms == 1_234_567
    assert np.float64(got.value).tobytes() == np.float64(want.value).tobytes()


async def test_a_number_over_a_range_is_the_engines() -> None:
    runner = QueryRunner(LocalBackend(StoreAPI(Store())))
    got, _ = await runner.range("1", 0, 60_000, 15_000)
    want = Engine(MemorySource()).range("1", 0, 60_000, 15_000)
    assert [(s.labels, s.timestamps.tolist(), s.values.tolist()) for s in got.series] == \
        [(s.labels, s.timestamps.tolist(), s.values.tolist()) for s in want.series]
