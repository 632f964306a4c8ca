"""Write each sync's decisions back into metricsd as series (`recording.py` says which and why).

A consumer's job is the decision; publishing it is for the dashboards. So a publish that fails (no
write quorum, a token without the `write` role, a timeout) is logged, counted and dropped: the
decision has already been made and acted on, the next sync publishes afresh, and the loop never
waits longer than `timeout_s` for it. Series go through the backend's Write, the same RPC and
checks as an agent's batch (labels sent with every batch: a few hundred series a minute at most,
so the id handshake would save nothing worth its state).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter

from metricsd.consumers.loop import Syncable
from metricsd.consumers.recording import Sample, decision_series
from metricsd.model import series_id
from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc.backend import MetricsBackend

__all__ = ["DecisionPublisher", "Publishing", "write_request"]

log = logging.getLogger("metricsd.consumers.publish")


def write_request(batches: Sequence[tuple[int, Sequence[Sample]]]) -> pb.WriteRequest:
    """One WriteRequest of (timestamp ms, samples) batches, labels with every series. A series that
    appears twice at one time keeps its last value (a store would refuse the repeat as a duplicate);
    its samples are sent in time order, as the Write contract requires."""
    points: dict[tuple[tuple[str, str], ...], dict[int, float]] = {}
    for ts, samples in batches:
        for labels, value in samples:
            points.setdefault(labels, {})[ts] = value
    req = pb.WriteRequest()
    for labels, by_time in points.items():
        sid = series_id(labels)
        req.ids.append(sid)
        req.counts.append(len(by_time))
        for ts in sorted(by_time):
            req.timestamps.append(ts)
            req.values.append(by_time[ts])
        entry = req.series.add(id=sid)
        for label_name, label_value in labels:
            entry.labels.add(name=label_name, value=label_value)
    return req


@dataclass
class _Counts:
    samples: int = 0
    failures: int = 0
    last_error: str | None = None


@dataclass
class DecisionPublisher:
    """Publishes sync results of any consumer kind. Not safe to share across event loops."""

    backend: MetricsBackend
    registry: CollectorRegistry | None = None
    timeout_s: float = 10.0
    counts: dict[str, _Counts] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._samples: Counter | None = None
        self._failures: Counter | None = None
        if self.registry is not None:
            self._samples = Counter("metricsd_consumer_published_samples",
                                    "Decision samples the consumers wrote back as series, by consumer.",
                                    ["consumer"], registry=self.registry)
            self._failures = Counter("metricsd_consumer_publish_failures",
                                     "Syncs whose decisions could not be written back as series, by consumer "
                                     "(the decision itself stands).", ["consumer"], registry=self.registry)

    async def publish(self, kind: str, result: object) -> int:
        """Write what one sync of `kind` decided; returns the samples written, 0 on failure. Never raises
        (but cancellation)."""
        counts = self.counts.setdefault(kind, _Counts())
        batches = decision_series(kind, result)
        if not batches:
            return 0
        req = write_request(batches)
        try:
            async with asyncio.timeout(self.timeout_s):
                resp = await self.backend.write(req)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # whatever the backend raises, the decision must not suffer for it
            counts.failures += 1
            counts.last_error = f"{type(e).__name__}: {e}"
            if self._failures is not None:
                self._failures.labels(consumer=kind).inc()
            log.warning("%s: could not publish %d decision series: %s", kind, len(req.ids), counts.last_error)
            return 0
        written = int(resp.samples_written)
        counts.samples += written
        if self._samples is not None:
            self._samples.labels(consumer=kind).inc(written)
        return written

    def document(self, kind: str) -> dict[str, object]:
        """JSON-ready counters of one consumer, for its status document."""
        c = self.counts.get(kind, _Counts())
        return {"enabled": True, "samples": c.samples, "failures": c.failures, "lastError": c.last_error}


class Publishing:
    """A controller whose every sync is followed by a publish of its result (a `Syncable`, so the
    Periodic loop runs it unchanged)."""

    def __init__(self, controller: Syncable, publisher: DecisionPublisher) -> None:
        self.controller = controller
        self.publisher = publisher

    @property
    def name(self) -> str:
        return self.controller.name

    @property
    def interval_s(self) -> float:
        return self.controller.interval_s

    async def sync_once(self) -> object:
        result = await self.controller.sync_once()
        await self.publisher.publish(self.controller.name, result)
        return result
