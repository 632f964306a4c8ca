"""The pusher: collected samples in, columnar Write batches out, to one of several targets.

Each collection pass becomes one batch (or a few, past ``max_batch_samples``) in the
``PushBuffer``; one loop sends the oldest batch, waits for its answer, and only then sends the
next, so every series' samples reach the receiver in time order whatever failed in between.
Where to send and how long to wait after a failure is ``retry.Failover``'s decision; the loop
only carries it out. A batch carries the labels of the series its target has not acknowledged
yet (the first send, a new target, or ids a receiver reported unknown after a restart).

Time and randomness come in (``clock``, ``rand``, ``sleep``) so tests run the loop on a
ManualClock without waiting.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import math
import random
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field

import grpc

from metricsd.agent.buffer import Batch, PushBuffer
from metricsd.agent.retry import BackoffPolicy, Failover
from metricsd.clock import Clock
from metricsd.model import InvalidSeries, Labels, series_id, validate_labels
from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc.backend import BadRequest, MetricsBackend, Unavailable

__all__ = ["DELAY_BUCKETS_S", "DelayHistogram", "Pusher", "PusherSettings", "PusherStats", "Sample"]

Sample = tuple[Labels, float]

# Collection delay buckets, seconds: from a local store's few milliseconds to a long outage.
DELAY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 900.0)


@dataclass(frozen=True, slots=True)
class PusherSettings:
    max_batch_samples: int = 20_000
    backoff: BackoffPolicy = field(default_factory=BackoffPolicy)
    prune_every: int = 256  # pushes between forgetting series that nothing refers to any more

    def __post_init__(self) -> None:
        if self.max_batch_samples < 1 or self.prune_every < 1:
            raise ValueError("max_batch_samples and prune_every must be at least 1")


class DelayHistogram:
    """Delay from read to acknowledged, in seconds: cumulative buckets as Prometheus exports
    them, plus the most recent observations for an exact median."""

    def __init__(self, buckets: Sequence[float] = DELAY_BUCKETS_S, recent: int = 4096) -> None:
        self.buckets = tuple(buckets)
        self.counts = [0] * (len(self.buckets) + 1)  # the last one is +Inf
        self.sum = 0.0
        self.count = 0
        self.recent: deque[float] = deque(maxlen=recent)

    def observe(self, seconds: float, n: int = 1) -> None:
        self.counts[bisect.bisect_left(self.buckets, seconds)] += n
        self.sum += seconds * n
        self.count += n
        self.recent.append(seconds)

    def cumulative(self) -> list[tuple[str, int]]:
        out, acc = [], 0
        for bound, c in zip([*map(str, self.buckets), "+Inf"], self.counts, strict=True):
            acc += c
            out.append((bound, acc))
        return out

    def median(self) -> float | None:
        """The median of the recent observations (per batch), None before the first."""
        if not self.recent:
            return None
        values = sorted(self.recent)
        mid = len(values) // 2
        return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2

    def quantile(self, q: float) -> float | None:
        """The nearest-rank ``q``-quantile of the recent observations, None before the first."""
        if not self.recent:
            return None
        values = sorted(self.recent)
        return values[min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))]


@dataclass(slots=True)
class PusherStats:
    collected_samples: int = 0  # handed to the pusher
    invalid_samples: int = 0  # of series whose labels the store would reject; never buffered
    sent_batches: int = 0  # acknowledged
    sent_samples: int = 0
    rejected_batches: int = 0  # refused as malformed (INVALID_ARGUMENT): given up on
    rejected_samples: int = 0
    rejected_too_old: int = 0  # acknowledged but older than the receiver's out-of-order window
    rejected_duplicate: int = 0  # acknowledged, already held (a resend after a lost answer)
    rejected_too_far_ahead: int = 0  # not stored: stamped past the receiver's clock + --max-future
    label_resends: int = 0  # batches resent with labels after unknown_ids
    failures: Counter[str] = field(default_factory=Counter)  # failed attempts by target address
    last_ack_ms: int = 0
    delay: DelayHistogram = field(default_factory=DelayHistogram)


class Pusher:
    """Buffers batches and delivers them in order. ``push_*`` are synchronous and never block;
    ``run`` is the single sending loop (run exactly one per Pusher)."""

    def __init__(
        self,
        buffer: PushBuffer,
        targets: Sequence[tuple[str, MetricsBackend]],
        clock: Clock,
        settings: PusherSettings | None = None,
        *,
        rand: Callable[[], float] | None = None,
        sleep: Callable[[float], Awaitable[None]] | None = None,
        logger: logging.Logger | None = None,
    ) -> None:
        if not targets:
            raise ValueError("the pusher needs at least one target")
        self.settings = settings or PusherSettings()
        self.buffer = buffer
        self.targets = list(targets)
        self.clock = clock
        self.failover = Failover(len(self.targets), self.settings.backoff)
        self.stats = PusherStats()
        self._rand = rand or random.Random().random
        self._sleep = sleep or asyncio.sleep
        self._log = logger or logging.getLogger("metricsd.agent.pusher")
        self._known: list[set[int]] = [set() for _ in self.targets]  # ids each target acknowledged
        self._ids: dict[Labels, int] = {}  # series ids of labels seen, computed once per series
        self._invalid: set[Labels] = set()
        self._pushes = 0
        self._wake = asyncio.Event()
        self._progress = asyncio.Event()  # a batch left the buffer
        self._down_since: dict[int, float] = {}

    # --- the input side -----------------------------------------------------------------------

    def push_samples(self, timestamp_ms: int, samples: Sequence[Sample], collected_ms: int | None = None) -> int:
        """Queue one collection pass (every sample at ``timestamp_ms``, at most one per series);
        returns the number of samples queued. ``collected_ms`` defaults to the timestamp."""
        ids: list[int] = []
        values: list[float] = []
        labels: dict[int, Labels] = {}
        for lab, value in samples:
            sid = self._ids.get(lab)
            if sid is None:
                sid = self._first_sight(lab)
                if sid is None:
                    continue
            if sid in labels:
                continue
            labels[sid] = lab
            ids.append(sid)
            values.append(value)
        self.stats.collected_samples += len(ids)
        step = self.settings.max_batch_samples
        for a in range(0, len(ids), step):
            n = len(ids[a : a + step])
            req = pb.WriteRequest(ids=ids[a : a + n], counts=[1] * n, timestamps=[timestamp_ms] * n,
                                  values=values[a : a + n])
            chunk = {sid: labels[sid] for sid in ids[a : a + n]} if n < len(ids) else labels
            self._queue(req, chunk, timestamp_ms if collected_ms is None else collected_ms)
        return len(ids)

    def push_request(self, request: pb.WriteRequest, labels: Mapping[int, Labels], collected_ms: int = 0) -> None:
        """Queue a ready batch (a simulator block); ``labels`` must cover its ids. ``collected_ms``
        0 marks data that was not read just now (a backfill): no delay is measured for it."""
        self.stats.collected_samples += len(request.values)
        if request.series:
            request = _without_labels(request)
        self._queue(request, labels, collected_ms)

    def _first_sight(self, labels: Labels) -> int | None:
        if labels in self._invalid:
            self.stats.invalid_samples += 1
            return None
        try:
            validate_labels(labels)
        except InvalidSeries as e:
            self._invalid.add(labels)
            self.stats.invalid_samples += 1
            self._log.warning("not sending %s", e)
            return None
        sid = self._ids[labels] = series_id(labels)
        return sid

    def _queue(self, request: pb.WriteRequest, labels: Mapping[int, Labels], collected_ms: int) -> None:
        self.buffer.push(request, labels, collected_ms)
        self._wake.set()
        self._pushes += 1
        if self._pushes % self.settings.prune_every == 0:
            self._prune()

    def _prune(self) -> None:
        gone = set(self.buffer.labels.prune(self.buffer.oldest_seq))
        if not gone:
            return
        for known in self._known:
            known.difference_update(gone)
        self._ids = {lab: sid for lab, sid in self._ids.items() if sid not in gone}

    # --- the sending loop ---------------------------------------------------------------------

    async def run(self) -> None:
        """Send forever, oldest batch first, one at a time. Cancel to stop."""
        while True:
            batch = self.buffer.peek()
            if batch is None:
                self._wake.clear()
                await self._wake.wait()
                continue
            i, wait = self.failover.next(self.clock.monotonic())
            if wait > 0:
                await self._sleep(wait)
                continue
            await self._send(i, batch)

    async def wait_below(self, max_bytes: int) -> None:
        """Wait until the buffer holds at most ``max_bytes``: back-pressure for a backfill,
        which produces faster than any receiver takes."""
        while self.buffer.total_bytes > max_bytes:
            self._progress.clear()
            await self._progress.wait()

    async def flush(self) -> None:
        """Wait until every batch queued so far has left the buffer (delivered or given up on)."""
        while len(self.buffer):
            self._progress.clear()
            await self._progress.wait()

    def targets_up(self) -> list[tuple[str, bool]]:
        return [(addr, self.failover.up(i)) for i, (addr, _) in enumerate(self.targets)]

    async def _send(self, i: int, batch: Batch) -> None:
        addr, backend = self.targets[i]
        known = self._known[i]
        need = [sid for sid in dict.fromkeys(batch.request.ids) if sid not in known]
        try:
            resp = await backend.write(self._with_labels(batch.request, need))
            if resp.unknown_ids:
                # The receiver lost our series (a restart, another proxy): resend with their labels.
                unknown = list(resp.unknown_ids)
                known.difference_update(unknown)
                self.stats.label_resends += 1
                missing = [sid for sid in unknown if self.buffer.labels.get(sid) is None]
                if missing:
                    self._give_up(batch, f"{addr} does not know {len(missing)} series whose labels are lost")
                    return
                resp = await backend.write(self._with_labels(batch.request, sorted({*need, *unknown})))
                if resp.unknown_ids:
                    raise Unavailable(f"{len(resp.unknown_ids)} series still unknown after sending their labels")
        except BadRequest as e:
            self._give_up(batch, f"{addr} rejected it: {e}")
            self.failover.succeeded(i)
            return
        except (Unavailable, grpc.aio.AioRpcError, OSError, TimeoutError) as e:
            self._failed(i, addr, e)
            return
        except Exception as e:  # a bug must not lose the buffer: log it and retry like an outage
            self._log.exception("unexpected error writing to %s", addr)
            self._failed(i, addr, e)
            return
        known.update(batch.request.ids)
        self._recovered(i, addr)
        self.failover.succeeded(i)
        self.buffer.remove(batch.seq)
        self._progress.set()
        st = self.stats
        st.sent_batches += 1
        st.sent_samples += batch.samples
        st.rejected_too_old += resp.rejected_too_old
        st.rejected_duplicate += resp.rejected_duplicate
        st.rejected_too_far_ahead += resp.rejected_too_far_ahead
        if resp.refused:  # a clock running ahead, or samples too late: say so, not only count it
            self._log.warning("%s did not store every sample: %s", addr, resp.refused)
        st.last_ack_ms = self.clock.now_ms()
        if batch.collected_ms:
            st.delay.observe(max(0.0, (st.last_ack_ms - batch.collected_ms) / 1000.0))

    def _with_labels(self, request: pb.WriteRequest, ids: Sequence[int]) -> pb.WriteRequest:
        if not ids:
            return request
        out = pb.WriteRequest()
        out.CopyFrom(request)
        for sid in ids:
            labels = self.buffer.labels.get(sid)
            if labels is not None:
                out.series.add(id=sid, labels=[pb.Label(name=k, value=v) for k, v in labels])
        return out

    def _give_up(self, batch: Batch, why: str) -> None:
        self.stats.rejected_batches += 1
        self.stats.rejected_samples += batch.samples
        self._log.error("dropping batch %d (%d samples): %s", batch.seq, batch.samples, why)
        self.buffer.remove(batch.seq)
        self._progress.set()

    def _failed(self, i: int, addr: str, err: BaseException) -> None:
        now = self.clock.monotonic()
        delay = self.failover.failed(i, now, self._rand())
        self.stats.failures[addr] += 1
        if i not in self._down_since:
            self._down_since[i] = now
            self._log.warning("target %s failed (%s); %d batches (%d samples) buffered, retrying in %.2f s%s",
                              addr, _short(err), len(self.buffer), self.buffer.samples, delay,
                              "" if len(self.targets) == 1 else ", trying the other targets meanwhile")
        else:
            self._log.debug("target %s failed again (%s); retry in %.2f s", addr, _short(err), delay)

    def _recovered(self, i: int, addr: str) -> None:
        since = self._down_since.pop(i, None)
        if since is not None:
            self._log.info("target %s is back after %.1f s; %d batches buffered", addr,
                           self.clock.monotonic() - since, len(self.buffer))


def _without_labels(request: pb.WriteRequest) -> pb.WriteRequest:
    out = pb.WriteRequest()
    out.CopyFrom(request)
    del out.series[:]
    return out


def _short(err: BaseException) -> str:
    text = str(err).splitlines()[0] if str(err) else type(err).__name__
    return text[:200]
