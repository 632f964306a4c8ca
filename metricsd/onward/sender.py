"""One remote-write target's sender: reads the onward buffer after its cursor, sends, moves the cursor.

A round takes the next buffered batches (up to ``shards x max_samples_per_send`` samples), makes
requests of at most about ``max_samples_per_send`` samples with each series in one of them
(shards.py) and sends them over ``shards`` connections at once; when every request is answered,
the cursor moves past the round; its file is written when the sender has caught up, at most once
a second while it has not (SAVE_CURSOR_S), and when it stops. A request is retried with
exponential back-off (metricsd/agent/retry.py's BackoffPolicy, with jitter) on a connection error,
a 5xx or a 429, until it is accepted; a 4xx other than 429 is not retried: its samples are counted
as failed and the round goes on. So nothing is lost while the receiver is down or overloaded,
however long, as long as the buffer's bound holds the backlog; and a restart resends at most the
round that was under way, or after a kill the rounds of the last second (those samples arrive
twice, which receivers take as a no-op: each sample has the same timestamp and value).

Requests go through onward/post.py's small HTTP/1.1 client (keep-alive, TLS), not aiohttp's.

Time is passed in: ``clock`` for the lag and ``sleep`` for the back-off, so a test moves a manual
clock through a long outage of a really stopped receiver without waiting for it.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable

import numpy as np

from metricsd import __version__
from metricsd.agent.retry import BackoffPolicy
from metricsd.clock import Clock
from metricsd.http.relabel import RelabelError, relabel
from metricsd.model import Labels
from metricsd.onward import encode, records
from metricsd.onward.buffer import OnwardBuffer, Record
from metricsd.onward.metrics import OnwardMetrics
from metricsd.onward.post import Poster, PostError
from metricsd.onward.records import Columns
from metricsd.onward.series import SeriesTable
from metricsd.onward.shards import concat, requests
from metricsd.onward.target import TargetConfig

__all__ = ["SAMPLES_WRITTEN", "Sender"]

log = logging.getLogger("metricsd.onward.sender")

SAMPLES_WRITTEN = "X-Prometheus-Remote-Write-Samples-Written"
SAVE_CURSOR_S = 1.0  # the cursor's file is written at most this often, when caught up, and when the sender stops
Sleep = Callable[[float], Awaitable[None]]


class Sender:
    """Not thread-safe (one event loop). ``run()`` until cancelled."""

    def __init__(self, target: TargetConfig, buffer: OnwardBuffer, metrics: OnwardMetrics, clock: Clock, *,
                 sleep: Sleep = asyncio.sleep, rand: Callable[[], float] = random.random) -> None:
        self.target = target
        self.buffer = buffer
        self.metrics = metrics
        self.clock = clock
        self.sleep = sleep
        self.rand = rand
        self.backoff = BackoffPolicy(base_s=target.min_backoff_s, max_s=target.max_backoff_s, jitter=0.5)
        self.cursor = buffer.register(target.name)
        self.version = {"1.0": 1, "2.0": 2}.get(target.protocol, 0)
        self.series = SeriesTable(self._relabel)  # after write_relabel_configs, encoded once
        self._segment = 0  # the newest segment read from
        self._bounded_at = 0  # the segment self.series was last bounded for
        self._poster: Poster | None = None
        self._saved_at = float("-inf")  # clock time (s) the cursor's file was last written
        name = target.name
        metrics.pending.labels(name).set_function(lambda: buffer.pending(name))
        metrics.lag.labels(name).set_function(self.lag_s)
        metrics.protocol.labels(name).set(self.version)

    def lag_s(self) -> float:
        oldest = self.buffer.oldest_pending_ms(self.target.name)
        return 0.0 if oldest is None else max(0.0, (self.clock.now_ms() - oldest) / 1000)

    # --- the loop -----------------------------------------------------------------------------

    async def run(self) -> None:
        t = self.target
        self._poster = Poster(t.url, ssl_context=t.ssl_context(), server_name=t.server_name, timeout_s=t.timeout_s,
                              keep=t.shards + 1)
        try:
            head = True
            while True:
                if self.buffer.last_seq <= self.cursor:  # caught up: the cursor's file says so before we wait
                    self.buffer.save_cursor(t.name)
                await self.buffer.wait_beyond(self.cursor)
                cols, last = self._read_round(head)
                head = False
                if last is None:
                    continue
                if cols.samples:
                    if self.version == 0:
                        await self._negotiate()
                    await self._send_round(cols)
                self.cursor = max(self.cursor, last)
                now = self.clock.now_ms() / 1000
                save = now - self._saved_at >= SAVE_CURSOR_S
                self.buffer.commit(t.name, self.cursor, save=save)
                if save:
                    self._saved_at = now
        finally:
            self.buffer.save_cursor(t.name)
            await self._poster.close()

    def _read_round(self, head: bool) -> tuple[Columns, int | None]:
        """The samples of the next records (up to shards x max_samples_per_send, at least one
        record) with relabel drops removed, and the seq of the last record taken. In the columns
        returned, ``ids`` holds each series' slot in self.series (looked up once, as the record
        is read), which is what ``body`` takes."""
        t = self.target
        if self._segment > self._bounded_at:  # between rounds: no slot of a round in flight moves
            self.series.forget_before(self._segment - 1)
            self._bounded_at = self._segment
        limit = t.shards * t.max_samples_per_send
        self.cursor = max(self.cursor, self.buffer.cursor(t.name))  # the bound may have moved it
        chosen: list[Record] = []
        taken = 0
        last: int | None = None
        for rec in self.buffer.records_from(self.cursor + 1, head=head):
            if rec.kind == records.SAMPLES and rec.seq > self.cursor and taken and taken + rec.samples > limit:
                break
            chosen.append(rec)
            if rec.seq > self.cursor:
                last = rec.seq
                taken += rec.samples
        parts: list[Columns] = []
        unread: list[Record] = []  # records to read from disk, in order, before the next kept one
        for rec in chosen:
            cols = self.buffer.columns(rec.seq) if rec.kind == records.SAMPLES and rec.seq > self.cursor else None
            if cols is None:
                unread.append(rec)
                continue
            self._read(unread, parts)
            unread = []
            self._segment = max(self._segment, rec.segment)
            self._take_samples(cols, parts)
        self._read(unread, parts)
        return concat(parts), last

    def _read(self, chosen: list[Record], parts: list[Columns]) -> None:
        for rec, payload in self.buffer.payloads(chosen):  # consecutive records: one read
            try:
                if isinstance(payload, Exception):
                    raise payload
                self._take(rec, payload, parts)
            except (OSError, ValueError) as e:  # the bound deleted it under us, or damage
                log.warning("onward %s: cannot read buffered record %d: %s", self.target.name, rec.seq, e)

    def _take(self, rec: Record, payload: bytes, parts: list[Columns]) -> None:
        self._segment = max(self._segment, rec.segment)
        if rec.kind == records.SERIES:
            ids, labels_at = records.decode_series_ids(payload)
            self.series.learn(ids, labels_at, rec.segment)
            return
        if rec.seq <= self.cursor:
            return
        self._take_samples(records.decode_samples(payload), parts)

    def _take_samples(self, cols: Columns, parts: list[Columns]) -> None:
        slots, keep = self.series.slots_sendable(cols.ids)
        if not keep.all():
            per_sample = np.repeat(keep, cols.counts)
            self.metrics.dropped.labels(self.target.name, "relabel").inc(int((~per_sample).sum()))
            slots, cols = slots[keep], Columns(cols.ids[keep], cols.counts[keep], cols.timestamps[per_sample],
                                               cols.values[per_sample])
        parts.append(Columns(slots.astype(np.uint64), cols.counts, cols.timestamps, cols.values))

    def _relabel(self, labels: Labels) -> Labels | None:
        if not self.target.relabel:
            return labels
        try:
            return relabel(labels, self.target.relabel).labels
        except RelabelError as e:
            log.warning("onward %s: %s; the series is not sent", self.target.name, e)
            return None

    # --- requests -----------------------------------------------------------------------------

    def _headers(self, version: int) -> dict[str, str]:
        h = {"Content-Encoding": "snappy", "User-Agent": f"metricsd/{__version__}",
             "Content-Type": encode.V2_CONTENT_TYPE if version == 2 else encode.V1_CONTENT_TYPE,
             "X-Prometheus-Remote-Write-Version": "2.0.0" if version == 2 else "0.1.0"}
        auth = self.target.authorization()
        if auth:
            h["Authorization"] = auth
        return h

    def body(self, cols: Columns, version: int) -> bytes:
        """The snappy-compressed request for ``cols`` (by slot, as _read_round returns them; each
        series once): a few NumPy and Arrow calls and one snappy call."""
        slots = cols.ids.astype(np.int64)
        if version == 2:
            symbols, refs, ref_counts = self.series.v2(slots)
            raw = encode.encode_v2(symbols, refs, ref_counts, cols.counts, cols.timestamps, cols.values)
        elif len(slots) == cols.samples and len(slots) and bool((cols.counts == 1).all()) \
                and encode.ONE_SAMPLE_TS[0] <= int(cols.timestamps.min()) \
                and int(cols.timestamps.max()) <= encode.ONE_SAMPLE_TS[1]:  # one sample a series: the live shape
            raw = encode.encode_v1_one(self.series.v1_one(slots), cols.timestamps, cols.values)
        else:
            raw = encode.encode_v1(self.series.v1(slots), cols.counts, cols.timestamps, cols.values)
        return encode.snappy(raw)

    async def _negotiate(self) -> None:
        """protocol auto: an empty 2.0 request. A 2.0 receiver answers it with the
        X-Prometheus-Remote-Write-Samples-Written header; a 1.0 receiver reads it as an empty 1.0
        request (no header) or refuses it (415, 400). Nothing is stored either way."""
        failures = 0
        while True:
            status, headers = await self._post(encode.snappy(b""), 2)
            if status is not None and status < 500 and status != 429:
                self.version = 2 if 200 <= status < 300 and SAMPLES_WRITTEN.lower() in headers else 1
                log.info("onward %s: sending remote write %d.0", self.target.name, self.version)
                self.metrics.protocol.labels(self.target.name).set(self.version)
                return
            failures += 1
            await self.sleep(self.backoff.delay(failures, self.rand()))

    async def _post(self, body: bytes, version: int) -> tuple[int | None, dict[str, str]]:
        assert self._poster is not None
        name = self.target.name
        try:
            got = await self._poster.post(body, self._headers(version))
        except PostError as e:
            self.metrics.requests.labels(name, "error").inc()
            log.debug("onward %s: %s", name, e)
            return None, {}
        self.metrics.requests.labels(name, str(got.status)).inc()
        if got.status >= 300:
            log.log(logging.WARNING if got.status < 500 else logging.INFO, "onward %s: HTTP %d: %s", name, got.status,
                    got.body[:1024].decode(errors="replace").strip()[:300])
        return got.status, got.headers

    async def send(self, cols: Columns) -> bool:
        """Send one request's samples until it is accepted (True) or refused for good (False)."""
        body = self.body(cols, self.version)
        failures = 0
        name = self.target.name
        while True:
            status, _ = await self._post(body, self.version)
            if status is not None and 200 <= status < 300:
                self.metrics.sent.labels(name).inc(cols.samples)
                return True
            if status == 415 and self.version == 2 and self.target.protocol == "auto":
                self.version = 1  # the receiver changed under us: fall back, as the 2.0 specification says
                self.metrics.protocol.labels(name).set(1)
                body = self.body(cols, 1)
                continue
            if status is not None and 400 <= status < 500 and not (status == 429 and self.target.retry_on_429):
                self.metrics.failed.labels(name).inc(cols.samples)
                return False
            failures += 1
            self.metrics.retries.labels(name).inc()
            await self.sleep(self.backoff.delay(failures, self.rand()))

    async def _send_round(self, cols: Columns) -> None:
        """The round's requests over ``shards`` connections at once (each series is in one
        request of the round, so the order they are answered in does not matter: shards.py)."""
        pending = iter(requests(cols, self.target.max_samples_per_send))

        async def lane() -> None:
            for chunk in pending:  # the lanes share the iterator: each takes the next request
                await self.send(chunk)

        await asyncio.gather(*(lane() for _ in range(self.target.shards)))
