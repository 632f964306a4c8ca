"""PromQL for metricsd: an engine over any :class:`SeriesSource`, with Prometheus' semantics."""

from __future__ import annotations

from metricsd.promql.engine import Engine
from metricsd.promql.source import MemorySource, SeriesData, SeriesSource
from metricsd.promql.values import (
    Matrix,
    PromQLError,
    Result,
    Sample,
    Scalar,
    Series,
    String,
    Vector,
    to_prometheus_body,
    to_prometheus_data,
    to_prometheus_json,
)

__all__ = [
    "Engine",
    "Matrix",
    "MemorySource",
    "PromQLError",
    "Result",
    "Sample",
    "Scalar",
    "Series",
    "SeriesData",
    "SeriesSource",
    "String",
    "Vector",
    "to_prometheus_body",
    "to_prometheus_data",
    "to_prometheus_json",
]
