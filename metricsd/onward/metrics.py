"""/metrics of sending onward: per target, samples sent, failed, dropped, pending and the lag."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

__all__ = ["OnwardMetrics"]


class OnwardMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.queued = Counter("metricsd_onward_samples_queued", "Samples put in the onward buffer.", registry=r)
        self.skipped = Counter(
            "metricsd_onward_samples_skipped",
            "Acknowledged samples not put in the onward buffer: a timestamp already queued for their series "
            "(duplicate, a retried batch) or older than their series' newest queued sample (out_of_order).",
            ["reason"], registry=r)
        self.sent = Counter("metricsd_onward_samples_sent", "Samples a remote-write target accepted.", ["target"],
                            registry=r)
        self.failed = Counter(
            "metricsd_onward_samples_failed",
            "Samples a target refused with a 4xx other than 429 (not retried: the request itself is wrong).",
            ["target"], registry=r)
        self.dropped = Counter(
            "metricsd_onward_samples_dropped",
            "Samples not sent to a target: the buffer's bound deleted them unsent (buffer_full), or a "
            "write_relabel_configs rule dropped their series (relabel).", ["target", "reason"], registry=r)
        self.retries = Counter("metricsd_onward_retries", "Requests retried after a 5xx, 429 or a connection error.",
                               ["target"], registry=r)
        self.requests = Counter("metricsd_onward_requests", "Remote-write requests sent, by HTTP status (or "
                                "'error' when no answer came).", ["target", "code"], registry=r)
        self.pending = Gauge("metricsd_onward_samples_pending", "Samples buffered that a target has not sent yet.",
                             ["target"], registry=r)
        self.lag = Gauge("metricsd_onward_lag_seconds",
                         "How long the oldest sample a target has not sent has waited in the buffer (0: none).",
                         ["target"], registry=r)
        self.protocol = Gauge("metricsd_onward_protocol_version",
                              "The remote-write version a target is sent (1 or 2; 0 before the first request).",
                              ["target"], registry=r)
        self.buffer_bytes = Gauge("metricsd_onward_buffer_bytes", "Bytes of the onward buffer on disk.", registry=r)
