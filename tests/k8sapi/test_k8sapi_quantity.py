"""Quantities, durations and times as Kubernetes' Go types print them (values checked against
the strings metrics-server and prometheus-adapter are documented to send)."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from metricsd.k8sapi.quantity import (
    binary_quantity,
    decimal_quantity,
    go_duration,
    milli_quantity,
    nano_quantity,
    rfc3339,
)

_SUFFIX = {"n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000), "": Fraction(1),
           "k": Fraction(1000), "M": Fraction(10**6), "G": Fraction(10**9), "T": Fraction(10**12),
           "P": Fraction(10**15), "E": Fraction(10**18), "Ki": Fraction(1024), "Mi": Fraction(1024**2),
           "Gi": Fraction(1024**3), "Ti": Fraction(1024**4), "Pi": Fraction(1024**5), "Ei": Fraction(1024**6)}


def parse(q: str) -> Fraction:
    """An independent reading of a quantity string: digits, then a suffix."""
    digits = q.rstrip("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
    return int(digits) * _SUFFIX[q[len(digits):]]


@pytest.mark.parametrize(("mantissa", "exponent", "text"), [
    (0, -9, "0"), (1_000_000_000, -9, "1"), (250_000_000, -9, "250m"), (123_456_789, -9, "123456789n"),
    (1_500_000, -9, "1500u"), (2_588_313, -9, "2588313n"), (3000, 0, "3k"), (33, -3, "33m"), (8000, -3, "8"),
    (10, 0, "10"), (100, 0, "100"), (1200, -3, "1200m"),
])
def test_decimal_quantities_print_in_canonical_form(mantissa: int, exponent: int, text: str) -> None:
    assert decimal_quantity(mantissa, exponent) == text


@pytest.mark.parametrize(("value", "text"), [
    (0, "0"), (500, "500"), (1000, "1k"), (1024, "1Ki"), (1025, "1025"), (3 * 4096, "12Ki"),
    (1024**2, "1Mi"), (5 * 1024**3, "5Gi"), (2_332_004 * 1024, "2332004Ki"),
])
def test_memory_prints_as_binary_si(value: int, text: str) -> None:
    assert binary_quantity(value) == text


def test_cpu_and_adapter_values() -> None:
    assert nano_quantity(0.25) == "250m"
    assert milli_quantity(0.033) == "33m"
    assert milli_quantity(0.2) == "200m"
    assert milli_quantity(8.0) == "8"
    assert milli_quantity(0.0004) == "0"  # NewMilliQuantity truncates below a milli


@given(st.integers(min_value=0, max_value=2**62), st.sampled_from([-9, -6, -3, 0]))
def test_decimal_quantity_keeps_the_value(mantissa: int, exponent: int) -> None:
    assert parse(decimal_quantity(mantissa, exponent)) == mantissa * Fraction(10) ** exponent


@given(st.integers(min_value=0, max_value=2**62))
def test_binary_quantity_keeps_the_value(value: int) -> None:
    assert parse(binary_quantity(value)) == value


@pytest.mark.parametrize(("ms", "text"), [
    (0, "0s"), (500, "500ms"), (15_000, "15s"), (10_039, "10.039s"), (60_000, "1m0s"), (90_500, "1m30.5s"),
    (3_600_000, "1h0m0s"), (3_725_000, "1h2m5s"),
])
def test_durations_print_as_go_does(ms: int, text: str) -> None:
    assert go_duration(ms) == text


def test_times_are_rfc3339_utc_to_the_second() -> None:
    assert rfc3339(1_700_000_000_999) == "2023-11-14T22:13:20Z"
