"""Sample values in the HTTP API are formatted as Prometheus formats them (Go's FormatFloat 'f', -1)."""

from __future__ import annotations

import json
import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from metricsd.http.jsonbody import dumps
from metricsd.promql.values import (
    Matrix,
    Result,
    Sample,
    Scalar,
    Series,
    String,
    Vector,
    format_float,
    format_floats,
    format_times,
    to_prometheus_body,
    to_prometheus_data,
    to_prometheus_json,
)


@given(st.floats(allow_nan=False, allow_infinity=False))
@settings(max_examples=2000, deadline=None)
def test_any_finite_float_is_its_shortest_digits_without_an_exponent(v: float) -> None:
    want = str(np.format_float_positional(v, trim="-"))  # Dragon4 shortest round-trip, positional
    got = format_float(v)
    assert got == want
    assert float(got) == v and math.copysign(1.0, float(got)) == math.copysign(1.0, v)


def test_the_special_values_and_the_edges_of_repr_exponents() -> None:
    assert [format_float(x) for x in (math.nan, math.inf, -math.inf, 0.0, -0.0, 1.0, 0.1, 1e15, 1e16, 1e-4, 1e-5)] \
        == ["NaN", "+Inf", "-Inf", "0", "-0", "1", "0.1", "1000000000000000", "10000000000000000", "0.0001",
            "0.00001"]


# format_floats: a whole series at once, as format_float gives each value (the body of a range query)
_EDGES = [math.nan, math.inf, -math.inf, 0.0, -0.0, 1.0, -1.0, 0.1, 1e15, 1e16, -1e16, 9999999999999998.0, 1e-4,
          -1e-4, 0.99999e-4, 1e-5, 5e-324, 1.7976931348623157e308, 10.0, 100.0, 20.5, 3.0e-3, 123456789.0]


@given(st.lists(st.floats(), max_size=50))
@settings(max_examples=2000, deadline=None)
def test_a_series_is_formatted_value_by_value_as_format_float_does(values: list[float]) -> None:
    assert format_floats(np.array(values, dtype=np.float64)) == [format_float(v) for v in values]


@given(st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=64))
@settings(max_examples=500, deadline=None)
def test_any_bit_pattern_is_formatted_as_format_float_does(bits: list[int]) -> None:
    values = np.array(bits, dtype=np.uint64).view(np.float64)
    assert format_floats(values) == [format_float(float(v)) for v in values]


def test_the_edges_in_one_series_and_many_random_magnitudes() -> None:
    rng = np.random.default_rng(7)
    values = np.concatenate([np.array(_EDGES), rng.random(20_000) * 10.0 ** rng.integers(-6, 18, 20_000),
                             np.round(rng.random(5_000) * 1e6), -rng.random(1_000)])
    assert format_floats(values) == [format_float(float(v)) for v in values]
    assert format_floats(np.zeros(0)) == []


def test_times_are_whole_seconds_as_ints_and_the_others_as_float_seconds() -> None:
    assert format_times(np.array([1_000, 2_000, 3_000_000], dtype=np.int64)) == [1, 2, 3_000]
    assert format_times(np.array([1_000, 1_500, -2_250], dtype=np.int64)) == [1, 1.5, -2.25]
    assert format_times(np.zeros(0, dtype=np.int64)) == []


@given(st.lists(st.one_of(st.floats(min_value=-1e17, max_value=1e17, allow_nan=False),
                          st.floats(min_value=-1e-3, max_value=1e-3), st.sampled_from([0.0, -0.0, 1e-4, 1e16])),
                max_size=30))
@settings(max_examples=1000, deadline=None)
def test_a_series_without_exponents_or_specials_is_formatted_as_format_float_does(values: list[float]) -> None:
    """Magnitudes about the edges of the positional range, zeros: the series that take the
    shortcut (orjson's text alone) and those just past it, against format_float value by value."""
    assert format_floats(np.array(values, dtype=np.float64)) == [format_float(v) for v in values]


# to_prometheus_body: the whole answer at once, the bytes jsonbody.dumps writes of to_prometheus_json's


def _dumps_of_json(result: Result) -> bytes:
    return dumps({"status": "success", "data": to_prometheus_json(result)})


@given(st.lists(st.tuples(st.integers(-(2**40), 2**40), st.floats(width=64)), max_size=40),
       st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=3), st.integers(0, 3))
@settings(max_examples=300, deadline=None)
def test_a_body_is_the_bytes_of_its_json_data_for_any_result(points: list[tuple[int, float]], labels: dict[str, str],
                                                             series: int) -> None:
    ts = np.array(sorted({t for t, _ in points}), dtype=np.int64)
    vals = np.array([v for _, v in points][: ts.size], dtype=np.float64)
    ts = ts[: vals.size]
    lab = tuple(sorted(labels.items()))
    matrix = Matrix([Series((*lab, ("s", str(i))), ts, vals) for i in range(series)])
    t0 = int(ts[0]) if ts.size else 0
    v0 = float(vals[0]) if vals.size else 0.0
    for result in (matrix, Vector(t0, [Sample(lab, v0)] * series), Scalar(t0, v0), String(t0, "x\u00e9\"")):
        assert to_prometheus_body(result) == _dumps_of_json(result)
        assert to_prometheus_data(result) == dumps(to_prometheus_json(result))  # a store's whole-query answer
        assert json.loads(to_prometheus_body(result)) == json.loads(json.dumps(
            {"status": "success", "data": to_prometheus_json(result)}))


def test_a_label_orjson_refuses_falls_back_to_the_standard_encoder() -> None:
    """A lone surrogate is not UTF-8: orjson refuses it, json escapes it (jsonbody.dumps' fallback)."""
    result = Matrix([Series((("pod", "a\ud800"),), np.array([1000], dtype=np.int64), np.array([1.5]))])
    assert to_prometheus_body(result) == _dumps_of_json(result)
    assert to_prometheus_data(result) == dumps(to_prometheus_json(result))
    assert json.loads(to_prometheus_body(result))["data"]["result"][0]["values"] == [[1, "1.5"]]
