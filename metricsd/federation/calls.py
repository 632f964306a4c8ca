"""One call to one cluster's proxy: under the cluster's deadline, retried while the deadline
allows, counted in the federation's metrics, the cluster's health learned from the outcome.

The deadline is per cluster and per request: whatever the retries, a cluster that has not
answered when it passes is reported missing, so one slow cluster delays an answer by at most the
deadline and never hides behind the others. Only Unavailable is retried (a dead or restarting
proxy, a timeout); BadRequest and LimitExceeded are the request's fault and every cluster would
say the same.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from metricsd.rpc.backend import BadRequest, LimitExceeded, MetricsBackend, Unavailable

__all__ = ["ClusterCall", "ClusterFailed", "FederationMetrics", "FederationSettings"]

T = TypeVar("T")

# From 1 ms (a pushed-down aggregate on loopback) to 30 s.
_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


@dataclass(frozen=True)
class FederationSettings:
    """``timeout_s``: how long a cluster may take to answer one request, retries included;
    ``retries``: further attempts after an Unavailable, ``backoff_s * 2**n`` apart."""

    timeout_s: float = 5.0
    retries: int = 1
    backoff_s: float = 0.05

    def __post_init__(self) -> None:
        if not self.timeout_s > 0:
            raise ValueError("--cluster-timeout must be positive")
        if not 0 <= self.retries <= 10:
            raise ValueError("--cluster-retries must be 0..10")
        if self.backoff_s < 0:
            raise ValueError("--cluster-backoff must not be negative")


class FederationMetrics:
    """Per-cluster counters of the federating proxy, on the registry /metrics serves."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.requests = Counter("metricsd_federation_requests", "Requests sent to a cluster (first attempts).",
                                ["cluster", "method"], registry=r)
        self.failures = Counter("metricsd_federation_failures",
                                "Requests a cluster did not answer in time or at all (it was reported missing).",
                                ["cluster", "method"], registry=r)
        self.timeouts = Counter("metricsd_federation_timeouts", "Requests that ran out of the cluster's deadline.",
                                ["cluster"], registry=r)
        self.retries = Counter("metricsd_federation_retries", "Attempts after a failed one.", ["cluster"],
                               registry=r)
        self.latency = Histogram("metricsd_federation_request_duration_seconds",
                                 "Time a cluster took to answer (successful requests, retries included).",
                                 ["cluster"], buckets=_BUCKETS, registry=r)
        self.up = Gauge("metricsd_federation_cluster_up",
                        "1 when the cluster answered its last request, 0 when it did not.", ["cluster"], registry=r)


class ClusterFailed(Exception):
    """A cluster did not answer; ``reason`` completes "cluster NAME ..."."""

    def __init__(self, cluster: str, reason: str) -> None:
        super().__init__(f"cluster {cluster} {reason}")
        self.cluster = cluster
        self.reason = reason


class ClusterCall:
    """Calls to one cluster's proxy. Not thread-safe (one event loop)."""

    def __init__(self, name: str, backend: MetricsBackend, settings: FederationSettings,
                 metrics: FederationMetrics | None = None,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self.backend = backend
        self.settings = settings
        self.metrics = metrics
        self.monotonic = monotonic
        self.healthy: bool | None = None  # unknown until the first call
        self.last_error = ""
        if metrics is not None:
            metrics.up.labels(cluster=name).set(0)

    def _outcome(self, ok: bool, error: str = "") -> None:
        self.healthy = ok
        self.last_error = error
        if self.metrics is not None:
            self.metrics.up.labels(cluster=self.name).set(1 if ok else 0)

    async def __call__(self, method: str, call: Callable[[MetricsBackend], Awaitable[T]]) -> T:
        """The answer, or ClusterFailed; BadRequest and LimitExceeded pass through."""
        s = self.settings
        m = self.metrics
        if m is not None:
            m.requests.labels(cluster=self.name, method=method).inc()
        started = self.monotonic()
        deadline = started + s.timeout_s
        attempt = 0
        while True:
            remaining = deadline - self.monotonic()
            try:
                if remaining <= 0:
                    raise TimeoutError
                async with asyncio.timeout(remaining):
                    result = await call(self.backend)
            except TimeoutError:
                err = "timed out"
                if m is not None:
                    m.timeouts.labels(cluster=self.name).inc()
                break
            except (BadRequest, LimitExceeded):
                self._outcome(True)  # it answered, and refused the request
                raise
            except Unavailable as e:
                err = str(e) or type(e).__name__
                wait = s.backoff_s * 2**attempt
                if attempt >= s.retries or self.monotonic() + wait >= deadline:
                    break
                await asyncio.sleep(wait)
                attempt += 1
                if m is not None:
                    m.retries.labels(cluster=self.name).inc()
                continue
            if m is not None:
                m.latency.labels(cluster=self.name).observe(self.monotonic() - started)
            self._outcome(True)
            return result
        tries = f" ({attempt + 1} attempts)" if attempt else ""
        if m is not None:
            m.failures.labels(cluster=self.name, method=method).inc()
        self._outcome(False, err)
        raise ClusterFailed(self.name, f"did not answer within {s.timeout_s:g} s{tries}: {err}")
