"""Where a test script's data goes and its queries run: a small interface with an in-process
implementation (MemorySource + Engine). An HTTP implementation (a real metricsd over
``/api/v1/query``) plugs in under another name in ``BACKENDS``.

Every query returns a Prometheus HTTP API response body: ``{"status": "success", "data": ...}``
or ``{"status": "error", "errorType": ..., "error": ...}``, so the expectation checks never
depend on the backend.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from metricsd.model import Labels
from metricsd.promql import Engine, MemorySource, PromQLError, to_prometheus_json

__all__ = ["BACKENDS", "Backend", "InProcessBackend", "LoadSeries"]

LoadSeries = tuple[Labels, np.ndarray, np.ndarray]  # labels, int64 ms timestamps, float64 values


class Backend(Protocol):
    def clear(self) -> None: ...

    def load(self, series: list[LoadSeries]) -> None:
        """Add samples; a series may already hold samples from an earlier load."""
        ...

    def instant(self, expr: str, time_ms: int) -> dict[str, Any]: ...

    def range(self, expr: str, start_ms: int, end_ms: int, step_ms: int) -> dict[str, Any]: ...

    def close(self) -> None: ...


def _error(e: PromQLError) -> dict[str, Any]:
    return {"status": "error", "errorType": e.kind, "error": e.message}


class InProcessBackend:
    def __init__(self) -> None:
        self.source = MemorySource()
        self.engine = Engine(self.source, lookback_ms=300_000)

    def clear(self) -> None:
        self.source.clear()

    def load(self, series: list[LoadSeries]) -> None:
        for labels, ts, vals in series:
            self.source.add(labels, ts, vals)

    def instant(self, expr: str, time_ms: int) -> dict[str, Any]:
        try:
            return {"status": "success", "data": to_prometheus_json(self.engine.instant(expr, time_ms))}
        except PromQLError as e:
            return _error(e)

    def range(self, expr: str, start_ms: int, end_ms: int, step_ms: int) -> dict[str, Any]:
        try:
            return {"status": "success", "data": to_prometheus_json(self.engine.range(expr, start_ms, end_ms, step_ms))}
        except PromQLError as e:
            return _error(e)

    def close(self) -> None:
        pass


def _http_backend() -> Backend:
    """A real store behind the HTTP API (promql_script_http.py); imported late, it imports this."""
    from promql_script_http import HttpBackend

    return HttpBackend()


def _grpc_backend() -> Backend:
    """The HTTP API reading from a real gRPC store (columnar batches on the wire)."""
    from promql_script_http import HttpBackend

    return HttpBackend(over_grpc=True)


BACKENDS: dict[str, Callable[[], Backend]] = {"inprocess": InProcessBackend, "http": _http_backend,
                                              "grpc": _grpc_backend}
