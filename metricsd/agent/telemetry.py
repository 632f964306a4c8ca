"""The agent's own health and counters: /metrics (Prometheus text) and /healthz, over aiohttp.

The pusher, buffer and collector keep plain counters; ``AgentExporter`` turns them into metric
families when scraped, so none of them depends on prometheus-client and a test can read the
numbers directly. The registry is passed in (no global default registry).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector as PromCollector

from metricsd.agent.collect import Collector
from metricsd.agent.pusher import Pusher
from metricsd.clock import Clock
from metricsd.security.tls import ServerTLS

__all__ = ["AgentExporter", "LoopStats", "health", "start_http"]

# The text exposition format every Prometheus version scrapes.
_TEXT_FORMAT = "text/plain; version=0.0.4; charset=utf-8"


@dataclass(slots=True)
class LoopStats:
    """What the agent's collection loop did; filled by the loop, read at scrape time."""

    interval_ms: int
    started_ms: int
    passes: int = 0
    last_pass_ms: int = 0  # wall time the last pass finished
    last_pass_seconds: float = 0.0
    pass_seconds_total: float = 0.0
    missed_ticks: int = 0  # ticks skipped because a pass ran late
    pod_list_errors: int = 0
    state: str = "starting"
    message: str = ""
    extra: dict[str, str] = field(default_factory=dict)


class AgentExporter(PromCollector):
    """Reads the agent's counters at scrape time."""

    def __init__(self, pusher: Pusher, loop: LoopStats, collector: Collector | None = None) -> None:
        self.pusher = pusher
        self.loop = loop
        self.collector = collector

    def collect(self) -> Iterator[Metric]:
        p, b = self.pusher.stats, self.pusher.buffer
        bs = b.stats
        yield _counter("metricsd_agent_samples_collected", "Samples handed to the pusher.", p.collected_samples)
        yield _counter("metricsd_agent_samples_invalid", "Samples of series with labels the store would reject; "
                       "not sent.", p.invalid_samples)
        yield _counter("metricsd_agent_samples_sent", "Samples acknowledged by a target.", p.sent_samples)
        yield _counter("metricsd_agent_batches_sent", "Write batches acknowledged by a target.", p.sent_batches)
        yield _counter("metricsd_agent_samples_rejected", "Samples of batches a target refused as malformed.",
                       p.rejected_samples)
        rej = CounterMetricFamily("metricsd_agent_samples_not_stored",
                                  "Acknowledged samples the receiver did not store, by reason.", labels=["reason"])
        rej.add_metric(["too_old"], p.rejected_too_old)
        rej.add_metric(["duplicate"], p.rejected_duplicate)
        rej.add_metric(["too_far_ahead"], p.rejected_too_far_ahead)
        yield rej
        yield _counter("metricsd_agent_label_resends", "Batches resent with labels after unknown_ids.",
                       p.label_resends)
        fail = CounterMetricFamily("metricsd_agent_write_failures", "Failed write attempts by target.",
                                   labels=["target"])
        up = GaugeMetricFamily("metricsd_agent_target_up", "1 if the last write to the target succeeded.",
                               labels=["target"])
        for addr, ok in self.pusher.targets_up():
            fail.add_metric([addr], p.failures[addr])
            up.add_metric([addr], 1.0 if ok else 0.0)
        yield fail
        yield up
        yield _counter("metricsd_agent_buffer_dropped_batches", "Batches dropped, oldest first, because the "
                       "buffer was full.", bs.dropped_batches)
        yield _counter("metricsd_agent_buffer_dropped_samples", "Samples in batches dropped because the buffer "
                       "was full.", bs.dropped_samples)
        yield _counter("metricsd_agent_buffer_spilled_batches", "Batches written to the spool.", bs.spilled_batches)
        yield _counter("metricsd_agent_buffer_replayed_batches", "Batches found in the spool at start.",
                       bs.replayed_batches)
        spool = CounterMetricFamily("metricsd_agent_spool_problems", "Spool records or files that could not be "
                                    "used, by kind.", labels=["kind"])
        for kind, n in sorted(bs.spool_problems.items()):
            spool.add_metric([kind], n)
        yield spool
        size = GaugeMetricFamily("metricsd_agent_buffer_bytes", "Bytes buffered, by where.", labels=["where"])
        size.add_metric(["memory"], b.memory_bytes)
        size.add_metric(["disk"], b.disk_bytes)
        yield size
        yield GaugeMetricFamily("metricsd_agent_buffer_batches", "Batches buffered.", value=len(b))
        h = p.delay
        delay = HistogramMetricFamily("metricsd_agent_collection_delay_seconds",
                                      "Delay from reading a batch's samples to their acknowledgement, per batch.")
        delay.add_metric([], h.cumulative(), sum_value=h.sum)
        yield delay
        yield GaugeMetricFamily("metricsd_agent_last_ack_timestamp_seconds", "When a target last acknowledged "
                                "a batch.", value=p.last_ack_ms / 1000.0)
        loop = self.loop
        yield _counter("metricsd_agent_collect_passes", "Collection passes.", loop.passes)
        yield _counter("metricsd_agent_collect_seconds", "Wall time spent in collection passes.",
                       loop.pass_seconds_total)
        yield _counter("metricsd_agent_collect_missed_ticks", "Ticks skipped because a pass ran late.",
                       loop.missed_ticks)
        yield _counter("metricsd_agent_pod_list_errors", "Failed pod list reads.", loop.pod_list_errors)
        if self.collector is not None:
            skipped = CounterMetricFamily("metricsd_agent_collect_skipped", "Things a collection pass had to leave "
                                          "out, by reason (file:kind for cgroup and /proc files).", labels=["reason"])
            for reason, n in sorted(self.collector.skipped.items()):
                skipped.add_metric([reason], n)
            yield skipped
            st = self.collector.status
            if st is not None:
                g = GaugeMetricFamily("metricsd_agent_pods", "Pods in the cgroup tree and mapped to the pod list.",
                                      labels=["kind"])
                g.add_metric(["in_tree"], st.pods_in_tree)
                g.add_metric(["mapped"], st.pods_mapped)
                yield g
                yield GaugeMetricFamily("metricsd_agent_series", "Series in the last pass.", value=st.series)


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)


def health(loop: LoopStats, pusher: Pusher, clock: Clock) -> tuple[bool, dict[str, object]]:
    """Alive when a collection pass finished within three intervals (plus a minute of grace at
    start). An unreachable store does not make the agent unhealthy: restarting it would not help,
    and its buffer is what carries the data through the outage."""
    now = clock.now_ms()
    last = loop.last_pass_ms or loop.started_ms
    limit = 3 * loop.interval_ms + (60_000 if not loop.passes else 0)
    ok = now - last <= limit
    body: dict[str, object] = {
        "status": "ok" if ok else "stalled",
        "state": loop.state,
        "message": loop.message,
        "passes": loop.passes,
        "last_pass_age_s": round((now - last) / 1000.0, 3),
        "buffered_batches": len(pusher.buffer),
        "buffered_bytes": pusher.buffer.total_bytes,
        "targets": {addr: ("up" if up else "down") for addr, up in pusher.targets_up()},
        **loop.extra,
    }
    return ok, body


async def start_http(
    host: str, port: int, registry: CollectorRegistry, healthz: Callable[[], tuple[bool, dict[str, object]]],
    tls: ServerTLS | None = None,
) -> tuple[web.AppRunner, int]:
    """Serve /metrics and /healthz (over TLS with ``tls``); returns the runner (call ``cleanup``)
    and the bound port."""

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(registry), headers={"Content-Type": _TEXT_FORMAT})

    async def healthz_handler(_: web.Request) -> web.Response:
        ok, body = healthz()
        return web.Response(status=200 if ok else 503, text=json.dumps(body), content_type="application/json")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz_handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=tls.ssl_context() if tls is not None else None)
    await site.start()
    bound = port
    for addr in runner.addresses:  # the bound port, for port 0
        bound = int(addr[1])
    return runner, bound
