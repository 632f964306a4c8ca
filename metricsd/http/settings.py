"""HTTP API settings: every default in one documented place, passed into ``build_app``."""

from __future__ import annotations

from dataclasses import dataclass, field

from metricsd.http.relabel import Rule
from metricsd.promql.limits import QueryLimits
from metricsd.rpc.limits import RequestLimits

__all__ = ["CLUSTER_NAMESPACE", "HttpSettings"]

CLUSTER_NAMESPACE = "_cluster"  # remote-written series without a namespace, unless told otherwise


@dataclass(frozen=True)
class HttpSettings:
    """How the HTTP API serves.

    client_max_size: largest request body accepted, in bytes (413 past it). Remote-write senders
        keep batches to a few MiB; 32 MiB leaves room for backfills.
    max_decompressed_bytes: largest remote-write body after snappy decompression. The block format
        declares its length up front, so a "zip bomb" is refused before any work is done.
    request_timeout_s: a request still running after this is answered 503 ``timeout``; a query's
        own ``timeout`` parameter can only shorten it.
    shutdown_timeout_s: on shutdown, requests in flight get this long to finish.
    gzip_min_bytes: responses at least this large are gzip-compressed when the client accepts it.
        32 KiB: compressing a dashboard panel's few KiB cost a small query a tenth of its CPU
        (perf/RESULTS.md, issue 23) to save a few KiB of a LAN's bandwidth.
    lookback_ms: PromQL's lookback delta (5 minutes in Prometheus).
    max_samples: samples one PromQL query may load before it fails (Prometheus' --query.max-samples).
    pushdown: answer aggregations of the shapes in ``pushdown.py`` inside the stores.
    default_namespace: remote write: the ``namespace`` given to series that lack one after the
        relabel rules (``_cluster``: no Kubernetes namespace can be called that); None refuses them.
    pod_labels: remote write: labels whose value becomes ``pod`` when a series lacks one, the
        first present wins (``instance``, then ``job``: a scrape target); empty refuses them.
        See metricsd/http/remote_series.py.
    relabel_rules: remote write: Prometheus relabel_configs applied to every series before the
        two fallbacks above (``--remote-write-relabel``, metricsd/http/relabel.py).
    created_timestamp_zero: remote write 2.0: store a 0 sample at a counter's created timestamp
        before its first sample (Prometheus' created-timestamp zero ingestion). Off by default: a
        sender repeats the created timestamp in every request, and each repeat after the first is
        a duplicate the store drops and counts.
    hot_path: answer well-formed small ``/api/v1/query`` and ``/api/v1/query_range`` requests
        below aiohttp's web layer (metricsd/http/hotpath.py): the same answers, errors, tokens and
        limits, at about half the CPU of aiohttp's request machinery (perf/RESULTS.md, issue 23
        session 36). Every other request, and every connection once it sends one, is aiohttp's.
    hot_write: with ``hot_path``, answer plain ``POST /api/v1/write`` requests (a whole body of at
        most 1 MiB) on the hot path too (metricsd/http/hotwrite.py): the same answers, errors,
        tokens and limits without aiohttp's per-request machinery (perf/RESULTS.md, issue 24
        session 38).
    access_log: log one line per request to the ``metricsd.http.access`` logger.
    request_limits: remote write: series entries and samples per request (400 past them), checked
        before any label is parsed; the same defaults as a store's gRPC Write.
    query_limits: PromQL: length, nesting depth and operators of a query (400 past them, before
        it is parsed), queries at once and waiting (503 past them); metricsd/promql/limits.py.
    """

    client_max_size: int = 32 * 1024 * 1024
    max_decompressed_bytes: int = 128 * 1024 * 1024
    request_timeout_s: float = 30.0
    shutdown_timeout_s: float = 5.0
    gzip_min_bytes: int = 32 * 1024
    lookback_ms: int = 300_000
    max_samples: int = 50_000_000
    pushdown: bool = True
    default_namespace: str | None = CLUSTER_NAMESPACE
    pod_labels: tuple[str, ...] = ("instance", "job")
    relabel_rules: tuple[Rule, ...] = ()
    created_timestamp_zero: bool = False
    access_log: bool = True
    hot_path: bool = True
    hot_write: bool = True
    request_limits: RequestLimits = field(default_factory=RequestLimits)
    query_limits: QueryLimits = field(default_factory=QueryLimits)

    def __post_init__(self) -> None:
        if self.client_max_size <= 0 or self.max_decompressed_bytes <= 0:
            raise ValueError("size limits must be positive")
        if self.request_timeout_s <= 0 or self.shutdown_timeout_s < 0:
            raise ValueError("timeouts must be positive")
        if self.lookback_ms <= 0:
            raise ValueError("lookback_ms must be positive")
