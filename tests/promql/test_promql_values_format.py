"""Sample values in the HTTP API are formatted as Prometheus formats them (Go's FormatFloat 'f', -1)."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from metricsd.promql.values import format_float


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
