"""The HTTP API: the Prometheus-compatible query API, remote write, native JSON and /metrics."""

from __future__ import annotations

from metricsd.http.selfmetrics import SelfMetrics
from metricsd.http.server import build_app, serve_http, start_http, stop_http
from metricsd.http.settings import HttpSettings

__all__ = ["HttpSettings", "SelfMetrics", "build_app", "serve_http", "start_http", "stop_http"]
