"""Where samples leave for the remote-write targets: at the write a client was acknowledged for.

:class:`OnwardBackend` wraps the backend a process serves (``metricsd up``: its store;
``metricsd proxy``: the quorum fan-out) and, after a write succeeds, puts its samples in the
onward buffer before the client gets the answer. The placement is what makes each sample go
onward once (README: Sending data onward, "The guarantee"):

- every client write passes through exactly one proxy (or the one ``metricsd up``), and is
  queued there once, after W replicas stored it. Replication below the proxy (the replicas'
  copies, hinted hand-off, read repair, catch-up, anti-entropy) never passes through here, so RF
  copies are never RF sends;
- a write that failed (no quorum) is not queued; the client's retry is the first to be;
- a client's retry of a write that was acknowledged (the answer lost) is queued again only for
  samples newer than what its series already queued: none (watermark.py). A late sample older
  than its series' newest queued one is left out too, and counted;
- the buffer is on disk and each target's cursor is saved, so a stopped receiver or a restarted
  process loses nothing; a restart resends at most the round a target was sending.

Clients that send series by id alone (agents, the remote-write receiver) are asked for their
labels (``unknown_ids``, the handshake of metricsd/rpc/client.py) when this process has not seen
them, before anything is written.

Bounded: the labels and the watermark of a series are kept while it is in use, and forgotten
when it has queued nothing for a whole segment of the buffer (64 MiB of batches by default, about
10 bytes a sample: some 13 minutes of 80,000 series at a 10 s interval), when the buffer starts a
new segment. A forgotten series that writes again is asked for its labels (the handshake above)
and starts a new watermark, as after a restart with the buffer sent: a client's retry of a write
acknowledged before that goes onward again (a receiver takes the same sample twice as a no-op).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from prometheus_client import CollectorRegistry

from metricsd.clock import Clock
from metricsd.onward import records
from metricsd.onward.buffer import BufferSettings, OnwardBuffer
from metricsd.onward.metrics import OnwardMetrics
from metricsd.onward.records import Columns
from metricsd.onward.sender import Sender, Sleep
from metricsd.onward.target import TargetConfig
from metricsd.onward.watermark import Rows, Watermark
from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc.admission import DEFAULT_MAX_FUTURE_MS, split_refused
from metricsd.rpc.backend import MetricsBackend

__all__ = ["Admission", "Onward", "OnwardBackend"]

log = logging.getLogger("metricsd.onward")


@dataclass(frozen=True, slots=True)
class Admission:
    unknown: list[int]  # ids to ask the client the labels of
    rows: Rows  # the request's ids looked up in the watermark
    ids: np.ndarray | None = None  # the request's ids as an array (queue need not convert them again)


class Onward:
    """The buffer, the watermark, the known series and one Sender per target. ``start()`` runs
    the senders; ``close()`` stops them (their cursors saved) and closes the buffer."""

    def __init__(self, directory: Path, targets: list[TargetConfig], registry: CollectorRegistry, clock: Clock, *,
                 settings: BufferSettings | None = None, sleep: Sleep = asyncio.sleep,
                 rand: Callable[[], float] | None = None) -> None:
        self.metrics = OnwardMetrics(registry)
        self.clock = clock
        self.buffer = OnwardBuffer(directory, settings, clock=clock, on_drop=self._dropped)
        self.labels: dict[int, bytes] = {}  # serialized SeriesLabels, as the client sent them
        self.watermark = Watermark()
        self._segment = 0  # the buffer's segment when the last batch went in
        self._restore()
        kw = {"sleep": sleep} | ({"rand": rand} if rand is not None else {})
        self.senders = [Sender(t, self.buffer, self.metrics, clock, **kw) for t in targets]  # type: ignore[arg-type]
        self._tasks: list[asyncio.Task[None]] = []
        self.metrics.buffer_bytes.set_function(self.buffer.disk_bytes)

    def _dropped(self, target: str, samples: int) -> None:
        self.metrics.dropped.labels(target, "buffer_full").inc(samples)

    def _restore(self) -> None:
        """Labels and watermarks of what the buffer holds, read back after a restart."""
        n = 0
        for rec, payload in self.buffer.payloads(list(self.buffer.records_from(0))):
            try:
                if isinstance(payload, Exception):
                    raise payload
                if rec.kind == records.SERIES:
                    series = records.decode_series_entries(payload)
                    self.labels.update(series)
                    self.watermark.add(np.array([i for i, _ in series], np.uint64))
                else:
                    cols = records.decode_samples(payload)
                    labelled = self.watermark.known(cols.ids)  # a series whose labels were lost stays unknown
                    if not labelled.all():
                        per_sample = np.repeat(labelled, cols.counts)
                        cols = Columns(cols.ids[labelled], cols.counts[labelled], cols.timestamps[per_sample],
                                       cols.values[per_sample])
                    self.watermark.restore(cols, rec.segment)
                    n += rec.samples
            except (OSError, ValueError) as e:
                log.warning("onward buffer: record %d unreadable: %s", rec.seq, e)
        self._segment = self.buffer.next_segment()
        if n:
            log.info("onward buffer: %d samples of %d series read back from %s", n, len(self.labels),
                     self.buffer.directory)

    def start(self) -> None:
        for s in self.senders:
            self._tasks.append(asyncio.get_running_loop().create_task(s.run(), name=f"onward-{s.target.name}"))

    async def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        self.buffer.close()

    def admit(self, request: pb.WriteRequest) -> Admission:
        """Before the write: the ids of the request this process has no labels for (and that
        carry none), which the client is asked for. The others are marked in use, so the bound
        does not forget them before ``queue``, which may reuse their lookup."""
        ids = np.array(request.ids, dtype=np.uint64)
        rows = self.watermark.rows(ids, self.buffer.next_segment())
        missing = ids[rows.rows < 0]
        if not len(missing):
            return Admission([], rows, ids)
        labelled = {s.id for s in request.series}
        return Admission([int(i) for i in dict.fromkeys(missing.tolist()) if i not in labelled], rows)

    def unknown(self, request: pb.WriteRequest) -> list[int]:
        return self.admit(request).unknown

    def queue(self, request: pb.WriteRequest, admitted: Admission | None = None) -> int:
        """Put the samples of an acknowledged write in the buffer (after the watermark); returns
        how many went in. ``admitted``: what ``admit`` said of it before the write."""
        if request.series:
            new = {s.id: s.SerializeToString() for s in request.series if s.id not in self.labels}
            if new:
                self.labels.update(new)
                self.watermark.add(np.fromiter(new, np.uint64, len(new)))
        ids = admitted.ids if admitted is not None and admitted.ids is not None else \
            np.array(request.ids, dtype=np.uint64)
        cols = Columns(ids, np.array(request.counts, dtype=np.int64),
                       np.array(request.timestamps, dtype=np.int64), np.array(request.values, dtype=np.float64))
        segment = self.buffer.next_segment()
        try:
            got = self.watermark.take(cols, segment, admitted.rows if admitted is not None else None)
        except KeyError:  # forgotten since unknown() (two new segments during one store write): drop them
            cols = self._known_only(cols)
            got = self.watermark.take(cols, segment)
        if got.duplicate:
            self.metrics.skipped.labels("duplicate").inc(got.duplicate)
        if got.out_of_order:
            self.metrics.skipped.labels("out_of_order").inc(got.out_of_order)
        if got.columns.samples:
            labels = self.labels
            self.buffer.append(got.columns, [labels[i] for i in got.fresh.tolist()])
            self.metrics.queued.inc(got.columns.samples)
        if segment != self._segment:  # the buffer started a new segment (this batch's series are in it)
            self._segment = segment
            self.forget_idle()
        return got.columns.samples

    def _known_only(self, cols: Columns) -> Columns:
        known = self.watermark.known(cols.ids)
        lost = int(cols.counts[~known].sum())
        log.warning("onward: %d samples of %d series forgotten during their write are not sent", lost,
                    int((~known).sum()))
        self.metrics.skipped.labels("forgotten").inc(lost)
        per_sample = np.repeat(known, cols.counts)
        return Columns(cols.ids[known], cols.counts[known], cols.timestamps[per_sample], cols.values[per_sample])

    def forget_idle(self) -> int:
        """The bound (see the module's docstring): forget the series that queued nothing in the
        previous segment or since; returns how many."""
        dropped = self.watermark.forget(self._segment - 1)
        for i in dropped.tolist():
            self.labels.pop(i, None)
        if len(dropped):
            log.info("onward: %d series idle for a segment forgotten (%d kept)", len(dropped), len(self.labels))
        return len(dropped)


class OnwardBackend:
    """A MetricsBackend that queues every acknowledged write onward; everything else is the
    inner backend's.

    Samples a store refused as too far ahead of its clock (``--max-future``: the answer counts
    them in ``rejected_too_far_ahead``) were not stored and do not go onward: queued, one would also
    move its series' watermark into the future and hold back every real-time sample after it. The
    answer counts them without saying which, so when it has any, the samples after this process's
    clock plus ``max_future_ms`` (the stores' setting: ``metricsd up`` passes its own, a proxy the
    default) are taken out before the queue (rpc/admission.py's split, as a store does); the live
    path, with none, costs nothing more."""

    def __init__(self, inner: MetricsBackend, onward: Onward, max_future_ms: int | None = DEFAULT_MAX_FUTURE_MS
                 ) -> None:
        self.inner = inner
        self.onward = onward
        self.max_future_ms = max_future_ms

    async def write(self, request: pb.WriteRequest) -> pb.WriteResponse:
        admitted = self.onward.admit(request)
        if admitted.unknown:
            return pb.WriteResponse(unknown_ids=admitted.unknown)
        resp = await self.inner.write(request)
        if resp.unknown_ids:
            return resp
        looked_up: Admission | None = admitted
        if resp.rejected_too_far_ahead:
            kept, refusal = split_refused(request, self.onward.clock.now_ms(), self.max_future_ms)
            if refusal is not None:
                self.onward.metrics.skipped.labels("too_far_ahead").inc(refusal.too_far_ahead)
                request, looked_up = kept, None  # admit()'s lookup was of the whole request
        self.onward.queue(request, looked_up)
        return resp

    async def read(self, request: pb.ReadRequest) -> pb.ReadResponse:
        return await self.inner.read(request)

    async def aggregate(self, request: pb.AggregateRequest) -> pb.AggregateResponse:
        return await self.inner.aggregate(request)

    async def rollups(self, request: pb.ReadRequest) -> pb.RollupsResponse:
        return await self.inner.rollups(request)

    async def list_series(self, request: pb.ListSeriesRequest) -> pb.ListSeriesResponse:
        return await self.inner.list_series(request)

    async def label_values(self, request: pb.LabelValuesRequest) -> pb.LabelValuesResponse:
        return await self.inner.label_values(request)

    async def health(self) -> pb.HealthResponse:
        return await self.inner.health()

    async def stats(self) -> pb.StatsResponse:
        return await self.inner.stats()
