"""The engine's pieces against hand-worked numbers and Prometheus' documented rules."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pytest

from metricsd.model import make_labels, stale_marker
from metricsd.promql import Engine, Matrix, MemorySource, PromQLError, Scalar, Vector
from metricsd.promql.selectors import re2_to_python


def _engine(*series: tuple[str, dict[str, str], list[int], Sequence[float]], **kw: int) -> Engine:
    src = MemorySource()
    for name, labels, ts, vs in series:
        src.add(make_labels(name, labels), ts, vs)
    return Engine(src, **kw)


def _one(result: object) -> float:
    assert isinstance(result, Vector)
    assert len(result.samples) == 1, result.samples
    return result.samples[0].value


S = 1000

# Counter samples at 15s, 30s, 45s, 60s; a 1m window at 60s is (0s, 60s]: sampled interval 45s,
# average spacing 15s, extrapolation threshold 16.5s.
TS = [15 * S, 30 * S, 45 * S, 60 * S]


@pytest.mark.parametrize(
    ("values", "fn", "expected"),
    [
        # 15s to the window start < 16.5s: extrapolate the full 15s; zero point 45*(10/30)=15s is not closer.
        ([10, 20, 30, 40], "increase", 30 * 60 / 45),
        ([10, 20, 30, 40], "rate", 30 * 60 / 45 / 60),
        # The counter would reach zero 1.5s before the first sample: extrapolate only that far.
        ([1, 11, 21, 31], "increase", 30 * (45 + 1.5) / 45),
        # A reset from 10 to 2 adds 10: 7 - 5 + 10 = 12; zero point 45*(5/12) = 18.75s is not closer.
        ([5, 10, 2, 7], "increase", 12 * 60 / 45),
        # delta is a gauge: no reset handling, no zero point.
        ([5, 10, 2, 7], "delta", 2 * 60 / 45),
        # irate: the last two samples; after a reset the last value itself over their 15s.
        ([10, 20, 30, 40], "irate", 10 / 15),
        ([10, 20, 30, 5], "irate", 5 / 15),
    ],
)
def test_rate_family_extrapolates_like_prometheus(values: list[float], fn: str, expected: float) -> None:
    eng = _engine(("x", {}, TS, values))
    assert _one(eng.instant(f"{fn}(x[1m])", 60 * S)) == pytest.approx(expected, rel=1e-12)


def test_rate_extrapolates_half_a_spacing_when_the_window_starts_long_before_the_samples() -> None:
    # Samples at 40s, 50s, 60s in (0, 60s]: 40s to the start is over 1.1 * 10s, so only 5s is added.
    eng = _engine(("g", {}, [40 * S, 50 * S, 60 * S], [3, 4, 5]))
    assert _one(eng.instant("delta(g[1m])", 60 * S)) == pytest.approx(2 * 25 / 20)


def test_rate_needs_two_samples_and_the_window_is_open_on_the_left() -> None:
    eng = _engine(("x", {}, [0, 30 * S, 60 * S], [1, 2, 3]))
    assert _one(eng.instant("count_over_time(x[1m])", 60 * S)) == 2  # the sample at 0 is outside (0, 60s]
    assert isinstance(r := eng.instant("rate(x[30s])", 60 * S), Vector) and r.samples == []


def test_lookback_is_left_open_and_a_stale_marker_hides_the_series_until_the_next_sample() -> None:
    eng = _engine(("x", {}, [0, 10 * S, 30 * S], [1.0, stale_marker(), 2.0]))
    assert _one(eng.instant("x", 5 * S)) == 1
    assert eng.instant("x", 20 * S) == Vector(20 * S, [])
    assert _one(eng.instant("x", 30 * S)) == 2
    assert _one(eng.instant("x", 30 * S + 299_999)) == 2
    assert eng.instant("x", 30 * S + 300_000) == Vector(330 * S, [])
    # Range selectors skip stale markers entirely.
    assert _one(eng.instant("count_over_time(x[1m])", 30 * S)) == 2


def test_range_query_steps_offset_and_at() -> None:
    eng = _engine(("x", {"a": "1"}, [0, 60 * S, 120 * S], [1, 2, 3]))
    m = eng.range("x offset 1m", 60 * S, 180 * S, 60 * S)
    assert isinstance(m, Matrix) and len(m.series) == 1
    assert m.series[0].timestamps.tolist() == [60 * S, 120 * S, 180 * S]
    assert m.series[0].values.tolist() == [1, 2, 3]
    pinned = eng.range("x @ 60", 0, 180 * S, 60 * S)
    assert pinned.series[0].values.tolist() == [2, 2, 2, 2]
    assert eng.range("x @ end()", 0, 60 * S, 60 * S).series[0].values.tolist() == [2, 2]


def test_negative_at_times_reach_data_before_the_epoch() -> None:
    eng = _engine(("x", {}, [-100 * S, 0], [7, 8]))
    assert _one(eng.instant("x @ -100", 500 * S)) == 7
    assert _one(eng.instant("x @ -1m40s", 500 * S)) == 7


def test_many_to_many_matching_is_an_error_naming_both_series() -> None:
    eng = _engine(("m", {"l": "beta"}, [0], [2]), ("m", {"l": "alpha"}, [0], [1]), ("s", {}, [0], [3]))
    with pytest.raises(PromQLError) as exc:
        eng.instant("s > on() m", 0)
    assert exc.value.kind == "execution"
    assert exc.value.message == (
        'found duplicate series for the match group {} on the right hand-side of the operation: '
        '[{__name__="m", l="alpha"}, {__name__="m", l="beta"}];many-to-many matching not allowed: '
        "matching labels must be unique on one side"
    )


def test_one_to_one_needs_explicit_group_left_even_when_comparisons_filter_everything() -> None:
    eng = _engine(("many", {"job": "a", "x": "1"}, [0], [0]), ("many", {"job": "a", "x": "2"}, [0], [1]),
                  ("one", {"job": "a"}, [0], [5]))
    with pytest.raises(PromQLError, match="many-to-one matching must be explicit"):
        eng.instant("many > on(job) one", 0)
    res = eng.instant('many + on(job) group_left(role) label_one', 0)
    assert res == Vector(0, [])
    got = eng.instant("many * on(job) group_left one", 0)
    assert isinstance(got, Vector)
    assert sorted((dict(s.labels)["x"], s.value) for s in got.samples) == [("1", 0.0), ("2", 5.0)]
    assert all("__name__" not in dict(s.labels) for s in got.samples)


def test_comparison_filters_and_keeps_the_name_bool_drops_it() -> None:
    eng = _engine(("x", {"a": "1"}, [0], [3]), ("x", {"a": "2"}, [0], [1]))
    res = eng.instant("x > 2", 0)
    assert isinstance(res, Vector) and [dict(s.labels) for s in res.samples] == [{"__name__": "x", "a": "1"}]
    res = eng.instant("2 < bool x", 0)
    assert isinstance(res, Vector) and sorted((s.labels, s.value) for s in res.samples) == [
        ((("a", "1"),), 1.0),
        ((("a", "2"),), 0.0),
    ]


def test_delayed_name_removal_fails_on_duplicates_only_at_the_end() -> None:
    eng = _engine(("a", {"env": "1"}, [0, 60 * S], [0, 60]), ("b", {"env": "1"}, [0, 60 * S], [0, 120]))
    assert _one(eng.instant("sum by (env) (rate({env='1'}[2m]))", 60 * S)) == pytest.approx(1.5)
    with pytest.raises(PromQLError, match="same labelset"):
        eng.instant("sum by (__name__) (rate({env='1'}[2m]))", 60 * S)
    with pytest.raises(PromQLError, match="same labelset"):
        eng.instant("-{env='1'}", 60 * S)


def test_aggregations_by_and_without() -> None:
    eng = _engine(*[("x", {"job": j, "i": str(i)}, [0], [float(i + (10 if j == "b" else 0))])
                    for j in "ab" for i in range(3)])
    res = eng.instant("sum by (job) (x)", 0)
    assert isinstance(res, Vector) and sorted((s.labels, s.value) for s in res.samples) == [
        ((("job", "a"),), 3.0), ((("job", "b"),), 33.0)]
    res = eng.instant("max without (i) (x)", 0)
    assert isinstance(res, Vector) and sorted(s.value for s in res.samples) == [2.0, 12.0]
    # Values 0 1 2 10 11 12: rank 0.5 * 5 = 2.5 lies halfway between 2 and 10.
    assert _one(eng.instant("quantile(0.5, x)", 0)) == pytest.approx(6.0)
    assert _one(eng.instant("stddev(x{job='a'})", 0)) == pytest.approx(math.sqrt(2 / 3))
    top = eng.instant("topk(2, x)", 0)
    assert isinstance(top, Vector) and [s.value for s in top.samples] == [12.0, 11.0]
    assert dict(top.samples[0].labels)["__name__"] == "x"
    with pytest.raises(PromQLError, match="Parameter value is NaN"):
        eng.instant("topk(NaN, x)", 0)


def test_histogram_quantile_interpolates_within_the_bucket() -> None:
    eng = _engine(*[("h_bucket", {"le": le}, [0], [c]) for le, c in [("0.1", 10), ("0.5", 30), ("+Inf", 40)]])
    # rank 20 falls in (0.1, 0.5] holding 20 observations, 10 of them below the rank.
    res = eng.instant("histogram_quantile(0.5, h_bucket)", 0)
    assert isinstance(res, Vector) and res.samples[0].labels == () and res.samples[0].value == pytest.approx(0.3)
    assert _one(eng.instant("histogram_quantile(0.99, h_bucket)", 0)) == 0.5  # in +Inf: the last finite bound


def test_scalars_time_vector_and_functions() -> None:
    eng = _engine(("x", {}, [0], [-2.5]))
    assert eng.instant("time() + 1", 90 * S) == Scalar(90 * S, 91.0)
    assert _one(eng.instant("vector(3) * 2", 0)) == 6
    assert eng.instant("scalar(x)", 0) == Scalar(0, -2.5)
    assert _one(eng.instant("abs(x)", 0)) == 2.5
    assert _one(eng.instant("round(x)", 0)) == -2.0  # half rounds up
    assert _one(eng.instant("clamp(x, -1, 1)", 0)) == -1
    assert eng.instant("clamp(x, 1, -1)", 0) == Vector(0, [])


def test_errors_have_prometheus_kinds() -> None:
    eng = _engine(("x", {}, [0, 1000], [1, 2]))
    with pytest.raises(PromQLError) as exc:
        eng.instant("sum(", 0)
    assert exc.value.kind == "bad_data"
    with pytest.raises(PromQLError) as exc:
        eng.range("x[1m]", 0, 1000, 1000)
    assert exc.value.kind == "bad_data" and "range vector" in exc.value.message
    with pytest.raises(PromQLError) as exc:
        _engine(("x", {}, list(range(0, 100_000, 1000)), [1.0] * 100), max_samples=10).instant("x[5m]", 100_000)
    assert exc.value.kind == "execution"


def test_instant_range_selector_returns_the_raw_window() -> None:
    eng = _engine(("x", {}, [0, 30 * S, 60 * S], [1, 2, 3]))
    m = eng.instant("x[1m]", 60 * S)
    assert isinstance(m, Matrix)
    assert m.series[0].timestamps.tolist() == [30 * S, 60 * S]


def test_memory_source_keeps_the_last_write_per_timestamp() -> None:
    src = MemorySource()
    lab = make_labels("x", {"a": "1"})
    src.add(lab, [0, 20], [1, 3])
    src.add(lab, [10, 20], [2, 4])
    (sd,) = src.select([], 0, 20)
    assert sd.timestamps.tolist() == [0, 10, 20] and sd.values.tolist() == [1, 2, 4]
    assert src.select([], 21, 30) == []
    assert np.array_equal(src.select([], 10, 10)[0].timestamps, [10])


@pytest.mark.parametrize(
    ("re2", "python"),
    [
        ("((?i)PRO).*", "((?i:PRO)).*"),
        ("(?i)foo", "(?i:foo)"),
        ("a(?i)b|c", "a(?i:b)|(?i:c)"),
        ("x[(?i)]", "x[(?i)]"),
        ("plain.*", "plain.*"),
    ],
)
def test_re2_inline_flags_become_python_scoped_flags(re2: str, python: str) -> None:
    assert re2_to_python(re2) == python
