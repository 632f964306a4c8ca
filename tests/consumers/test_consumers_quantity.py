"""Kubernetes quantities in specs and status."""

from __future__ import annotations

import pytest

from metricsd.consumers.quantity import QuantityError, format_cpu, format_memory, parse_quantity


@pytest.mark.parametrize(
    ("text", "value"),
    [
        pytest.param("250m", 0.25, id="millicores"),
        pytest.param("2", 2.0, id="whole cores"),
        pytest.param(3, 3.0, id="a YAML integer"),
        pytest.param("1Gi", 2.0**30, id="binary gibibytes"),
        pytest.param("1.5k", 1500.0, id="decimal kilo with a fraction"),
        pytest.param("5e3", 5000.0, id="a decimal exponent"),
    ],
)
def test_parse(text: object, value: float) -> None:
    assert parse_quantity(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["", "1.2.3", "12 Mi", "1Xi", True, None])
def test_rejects(text: object) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(text)


def test_format() -> None:
    assert (format_cpu(0.025), format_cpu(2.0), format_cpu(0.1234)) == ("25m", "2", "124m")
    assert (format_memory(250 * 2**20), format_memory(1000.0)) == ("250Mi", "1000")
