"""metricsd's own metrics, served at /metrics in the Prometheus text format.

One :class:`SelfMetrics` per registry (prometheus-client refuses a name registered twice), made
by whoever starts the process and passed to the components that update it: the HTTP API counts
ingest, rejections and query latency; the remote-write receiver's layout memo is read at each
scrape (``watch_layouts``); the proxy sets the quorum-failure, hinted-hand-off and WAL
hooks. Store-wide gauges (series, samples, bytes per sample) are refreshed from
``backend.stats()`` at each scrape, so they describe the data wherever it lives.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from metricsd.proto import metricsd_pb2 as pb

__all__ = ["LATENCY_BUCKETS", "SelfMetrics"]

# From 1 ms (a pushed-down aggregate) to 30 s (the request timeout).
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class _Memo(Protocol):
    @property
    def hits(self) -> int: ...
    @property
    def misses(self) -> int: ...

    def __len__(self) -> int: ...
    @property
    def size_bytes(self) -> int: ...


class _HasLayouts(Protocol):
    @property
    def layouts(self) -> _Memo: ...


class _LayoutCollector(Collector):
    """The remote-write layout memos' counts (http/remote_write_layout.py), read at scrape time
    from the receivers' series caches: a counter a request would cost the hot path a Python call."""

    def __init__(self) -> None:
        self.caches: weakref.WeakSet[_HasLayouts] = weakref.WeakSet()

    def collect(self) -> Iterator[Metric]:
        memos = [c.layouts for c in list(self.caches)]
        hits = CounterMetricFamily(
            "metricsd_remote_write_layout_hits",
            "Remote-write requests recognised as a sender's repeated request (one comparison, no series lookup).")
        misses = CounterMetricFamily(
            "metricsd_remote_write_layout_misses",
            "Remote-write requests of known series not recognised as a repeated request (decoded series by series).")
        layouts = GaugeMetricFamily("metricsd_remote_write_layouts", "Repeated-request layouts kept.")
        size = GaugeMetricFamily("metricsd_remote_write_layout_bytes", "Bytes the kept layouts hold, about.")
        hits.add_metric([], sum(m.hits for m in memos))
        misses.add_metric([], sum(m.misses for m in memos))
        layouts.add_metric([], sum(len(m) for m in memos))
        size.add_metric([], sum(m.size_bytes for m in memos))
        yield from (hits, misses, layouts, size)


class SelfMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        r = registry
        self._layouts = _LayoutCollector()
        r.register(self._layouts)
        self.samples_ingested = Counter(
            "metricsd_samples_ingested", "Samples stored through the HTTP write paths.", ["path"], registry=r)
        self.samples_rejected = Counter(
            "metricsd_samples_rejected", "Samples refused, by reason.", ["reason"], registry=r)
        self.relabel_dropped = Counter(
            "metricsd_remote_write_relabel_dropped_samples",
            "Remote-write samples left out because a keep/drop relabel rule dropped their series, by rule (its "
            "1-based place in the --remote-write-relabel file).", ["rule"], registry=r)
        self.series_refused = Counter(
            "metricsd_remote_write_refused_series",
            "Remote-write series refused with a 400, by the rule that left them without namespace/pod or with an "
            "invalid label name (a rule's place in the file, or \"fallback\").", ["rule"], registry=r)
        self.refused_by_sender = Counter(
            "metricsd_remote_write_refused_samples",
            "Remote-write samples not stored (answered 400), by sender (its authenticated name or address; at most "
            "1000, then \"other\") and reason (too_old, too_far_ahead): whose clock is wrong.", ["sender", "reason"],
            registry=r)
        self.requests = Counter(
            "metricsd_http_requests", "HTTP requests by handler and status code.", ["handler", "code"], registry=r)
        self.request_duration = Histogram(
            "metricsd_http_request_duration_seconds", "HTTP request latency by handler.", ["handler"],
            buckets=LATENCY_BUCKETS, registry=r)
        self.query_duration = Histogram(
            "metricsd_query_duration_seconds", "PromQL and native query latency, by how it was answered.",
            ["path"], buckets=LATENCY_BUCKETS, registry=r)
        self.loop_lag = Gauge(
            "metricsd_event_loop_lag_seconds",
            "Largest event-loop lag (longest turn) of the last 10 s (metricsd/http/looplag.py).",
            registry=r)
        self.loop_stalls = Counter(
            "metricsd_event_loop_stalls", "Event-loop turns (wake-ups) longer (later) than 100 ms.", registry=r)
        self.queries_refused = Counter(
            "metricsd_queries_refused", "PromQL queries refused before running, by limit.", ["limit"], registry=r)
        self.series = Gauge("metricsd_series", "Series held.", registry=r)
        self.samples = Gauge("metricsd_samples", "Samples held, head and chunks.", registry=r)
        self.pods = Gauge("metricsd_pods", "Pods with at least one series.", registry=r)
        self.chunk_bytes = Gauge("metricsd_chunk_bytes", "Bytes of sealed, compressed chunks.", registry=r)
        self.bytes_per_sample = Gauge(
            "metricsd_chunk_bytes_per_sample", "Compressed bytes per sample in sealed chunks.", registry=r)
        self.store_rejected = Gauge(
            "metricsd_store_rejected_samples", "Samples the stores refused since start, by reason.", ["reason"],
            registry=r)
        # Hooks the proxy and the stores' replication set; zero until they do.
        self.quorum_failures = Counter(
            "metricsd_quorum_failures", "Requests that could not reach a quorum of replicas.", ["op"], registry=r)
        self.hinted_handoff_queue = Gauge(
            "metricsd_hinted_handoff_queue_samples", "Samples waiting to be handed to a replica that missed them.",
            registry=r)
        self.wal_lag = Gauge("metricsd_wal_lag_seconds", "Age of the oldest write not yet synced to the WAL.",
                             registry=r)

    def watch_layouts(self, cache: _HasLayouts) -> None:
        """Export ``cache.layouts``' hits, misses, layouts and bytes at each scrape (held weakly)."""
        self._layouts.caches.add(cache)

    def observe_stats(self, st: pb.StatsResponse) -> None:
        self.series.set(st.series)
        self.samples.set(st.samples)
        self.pods.set(st.pods)
        self.chunk_bytes.set(st.chunk_bytes)
        self.bytes_per_sample.set(st.bytes_per_sample)
        for reason, n in st.rejected.items():
            self.store_rejected.labels(reason=reason).set(n)
