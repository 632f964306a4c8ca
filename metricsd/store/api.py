"""The store's side of the Metrics API: its calls in proto messages, and the backend over them.

``StoreAPI`` answers in proto messages without gRPC; ``LocalBackend`` wraps it as the
MetricsBackend that ``metricsd.rpc`` defines, so the gRPC servicer (metricsd/rpc/servicer.py) and
in-process callers share one implementation.

``metricsd up`` serves HTTP from the same process as its store; it calls this directly instead of
going through a loopback socket. Bad input raises BadRequest, which the gRPC shell turns into
INVALID_ARGUMENT and the HTTP shell into 400; nothing is stored when it is raised.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from metricsd import __version__
from metricsd.clock import Clock, SystemClock
from metricsd.columns import LabelColumns, SeriesColumns
from metricsd.maths.slots import SlotFilter
from metricsd.maths.spec import InvalidAggregate
from metricsd.memory import release_free_memory
from metricsd.model import InvalidSeries
from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc.backend import BadRequest, LimitExceeded, Unavailable
from metricsd.rpc.columns import WriteColumns
from metricsd.rpc.limits import check_counts, check_write_request
from metricsd.rpc.rollupbatch import rollups_batch_bytes
from metricsd.rpc.servicer import MetricsServicer
from metricsd.rpc.wire import (
    aggregate_result_to_pb,
    aggregate_spec_from_pb,
    batch_bytes,
    labels_to_pb,
    length_delimited,
    matchers_from_pb,
    slot_filter_from_pb,
)
from metricsd.selector import InvalidSelector, Matcher, selector_string
from metricsd.store.admission import admit_columns, admits_all, answer
from metricsd.store.engine import Store, WriteResult
from metricsd.store.limits import SeriesLimitExceeded
from metricsd.store.query import run_aggregate
from metricsd.store.readone import DecodedChunks, read_one
from metricsd.store.scan import SampleLimitReached, read_rows

__all__ = ["LocalBackend", "StoreAPI", "StoreServicer", "gc_loop", "series_limit_message"]


log = logging.getLogger("metricsd.store")

_BAD_INPUT = (InvalidSeries, InvalidSelector, InvalidAggregate)
LABELS_KEPT = 1024  # one-row selections whose label columns StoreAPI keeps


def series_limit_message(matchers: list[Matcher], found: int, limit: int) -> str:
    """The refusal of a selection past --query.max-series (LimitExceeded; HTTP 422 from a query)."""
    return (f"query.max-series: the selector {selector_string(matchers)} matches {found:,} series, more than the "
            f"limit of {limit:,} (--query.max-series)")


def samples_limit_message(matchers: list[Matcher], limit: int) -> str:
    return (f"query.max-samples: the selector {selector_string(matchers)} would load more than {limit:,} samples "
            f"(--query.max-samples)")


TOGETHER_MAX_SAMPLES = 16_384
"""At most this many samples in parts written together (StoreAPI.write_together): the fixed cost of a
write is worth saving on small parts (the agents' 2,000 x 1), not on a backfill's 60,000-sample
ones, whose arrays together would leave the CPU's caches (perf/RESULTS.md, issue 24 session 34)."""


class StoreAPI:
    """Not safe for concurrent use: call from one thread (the event loop's).

    ``clock`` times the new-series rate limit (its monotonic seconds)."""

    def __init__(self, store: Store, member: str = "store", clock: Clock | None = None) -> None:
        self.store = store
        self.member = member
        self.clock = clock or SystemClock()
        self.status = pb.HealthResponse.SERVING
        self.decoded = DecodedChunks()  # the one-row read's kept chunk decodes (store/readone.py)
        self._labels_kept: dict[int, tuple[np.ndarray, LabelColumns]] = {}  # id(rows) -> the one row's labels

    def write(self, request: pb.WriteRequest) -> pb.WriteResponse:
        """Raises BadRequest (malformed, or past a per-request or label limit) or LimitExceeded (past a
        series limit); either way nothing is stored and the batch's samples are counted in
        ``store.refused`` under the reason (Stats.rejected). Samples too far ahead of the store's
        clock or older than it keeps are taken out first (store/admission.py): the response counts
        them (rejected_too_far_ahead, rejected_too_old) and says why (refused)."""
        refusal = check_write_request(request, self.store.settings.request_limits)
        if refusal is not None:
            self.store.refused[refusal.reason] += len(request.timestamps)
            raise BadRequest(refusal.message)
        try:
            batch = WriteColumns.of_request(request)
        except InvalidSeries as e:
            self.store.refused[e.reason] += len(request.timestamps)
            raise BadRequest(str(e)) from e
        return self._write_checked(batch)

    def write_columns(self, batch: WriteColumns) -> pb.WriteResponse:
        """write() of a batch already in columns (remote write in this process): no message is
        built or read. Same answers, errors and counters."""
        refusal = check_counts(max(len(batch.ids), len(batch.counts), len(batch.labels)),
                               max(len(batch.timestamps), len(batch.values)), self.store.settings.request_limits)
        if refusal is not None:
            self.store.refused[refusal.reason] += len(batch.timestamps)
            raise BadRequest(refusal.message)
        return self._write_checked(batch)

    def _write_checked(self, batch: WriteColumns) -> pb.WriteResponse:
        kept, refused = admit_columns(self.store, batch, self.clock.now_ms())  # too far ahead, too old
        if refused is not None and not len(kept.ids):
            return answer(pb.WriteResponse(), refused, self.store)
        try:
            res = self._write(kept)
        except InvalidSeries as e:
            self.store.refused[e.reason] += len(batch.timestamps)
            raise BadRequest(str(e)) from e
        except SeriesLimitExceeded as e:  # counted by the store
            raise LimitExceeded(str(e)) from e
        return answer(pb.WriteResponse(
            samples_written=res.written, unknown_ids=res.unknown_ids, rejected_too_old=res.too_old,
            rejected_duplicate=res.duplicate,
        ), refused, self.store)

    def write_together(self, parts: Sequence[pb.WriteRequest]) -> list[pb.WriteResponse]:
        """Write the first of ``parts`` (a WriteParts message's) as ONE store write and answer each
        as write() would have; returns the answers of the parts written, the first ones (empty:
        none, write the first alone). A write's fixed cost (checks, the engine's NumPy calls, the
        seal's bookkeeping) is ~0.25 ms however many series it holds, and the proxy sends a store
        2-4 parts a message (perf/RESULTS.md, issue 24 session 34).

        Only what cannot change any part's answer goes together: consecutive parts without labels
        (their series known, so no series limit or label check applies), each within the request
        limits and all of them together too (and at most TOGETHER_MAX_SAMPLES samples), none holding
        a sample the store refuses outright.
        Anything else (a series in two parts, an unknown id, an invalid part, a WAL failure) stores
        nothing and counts nothing here: the caller then writes the parts one by one, which gives
        each its own answer or error, as before."""
        limits = self.store.settings.request_limits
        taken: list[pb.WriteRequest] = []
        n_series = n_samples = 0
        for part in parts:
            if len(part.series) or check_write_request(part, limits) is not None:
                break
            if len(part.ids) != len(part.counts) or len(part.timestamps) != len(part.values):
                break  # malformed: its own write says so (two such parts could balance out together)
            if check_counts(n_series + len(part.ids), n_samples + len(part.timestamps), limits) is not None:
                break
            if taken and n_samples + len(part.timestamps) > TOGETHER_MAX_SAMPLES:
                break
            taken.append(part)
            n_series += len(part.ids)
            n_samples += len(part.timestamps)
        if len(taken) < 2:
            return []
        cols = [WriteColumns.of_request(p) for p in taken]  # no labels, so it cannot raise
        if any(int(c.counts.sum()) != len(c.timestamps) for c in cols):
            return []
        batch = WriteColumns(np.concatenate([c.ids for c in cols]), np.concatenate([c.counts for c in cols]),
                             np.concatenate([c.timestamps for c in cols]), np.concatenate([c.values for c in cols]))
        if not admits_all(self.store, batch.timestamps, self.clock.now_ms()):
            return []
        try:
            res = self._write(batch, [len(p.ids) for p in taken])
        except (InvalidSeries, Unavailable):
            return []
        if res.unknown_ids:
            return []
        ends = np.cumsum([len(p.ids) for p in taken])
        lost = np.zeros((len(taken), 2), np.int64)  # too_old, duplicate per part
        for entry, too_old, duplicate in res.merged:
            lost[int(np.searchsorted(ends, entry, side="right"))] += (too_old, duplicate)
        out = []
        for part, (too_old, duplicate) in zip(taken, lost.tolist(), strict=True):
            resp = pb.WriteResponse(samples_written=len(part.timestamps) - too_old - duplicate,
                                    rejected_too_old=too_old, rejected_duplicate=duplicate)
            out.append(answer(resp, None, self.store))
        return out

    def _write(self, batch: WriteColumns, runs: Sequence[int] = ()) -> WriteResult:
        """Validate and apply a live write, one vectorized append (DurableStoreAPI logs it in between).
        ``runs``: Store.validate's."""
        return self.store.write(batch.ids, batch.counts, batch.timestamps, batch.values, batch.labels,
                                now_s=self.clock.monotonic(), runs=runs)

    def _selected(self, matchers_pb: Iterable[pb.Matcher], slots_pb: pb.SlotFilter, max_series: int
                  ) -> tuple[list[Matcher], np.ndarray]:
        try:
            matchers = matchers_from_pb(matchers_pb)
            rows = self.store.select(matchers, slot_filter_from_pb(slots_pb))
        except _BAD_INPUT as e:
            raise BadRequest(str(e)) from e
        if max_series and len(rows) > max_series:
            raise LimitExceeded(series_limit_message(matchers, len(rows), max_series))
        return matchers, rows

    def read_columns(self, request: pb.ReadRequest) -> SeriesColumns:
        """A Read's series (every one matching, with or without samples in the range) and samples
        as columns, no message made (LocalBackend hands them to the PromQL engine as they are).
        Raises BadRequest, or LimitExceeded past the request's max_series or max_samples, before
        reading any sample or as soon as the samples found pass the limit."""
        matchers, rows = self._selected(request.matchers, request.slots, request.max_series)
        return self._read_rows(matchers, rows, request.start_ms, request.end_ms, request.max_samples)

    def read_selection(self, matchers: Sequence[Matcher], start_ms: int, end_ms: int, max_series: int = 0,
                       max_samples: int = 0, slots: SlotFilter | None = None) -> SeriesColumns:
        """read_columns of matchers already made (the PromQL engine's, in this process): the same
        answer and errors without a ReadRequest built and its matchers parsed back. ``slots``: only
        those slots' series (a proxy's QUERY frame, metricsd/http/wholequery.py SlotScoped)."""
        try:
            rows = self.store.select(matchers, slots)
        except _BAD_INPUT as e:
            raise BadRequest(str(e)) from e
        if max_series and len(rows) > max_series:
            raise LimitExceeded(series_limit_message(list(matchers), len(rows), max_series))
        return self._read_rows(list(matchers), rows, start_ms, end_ms, max_samples)

    def _read_rows(self, matchers: list[Matcher], rows: np.ndarray, start_ms: int, end_ms: int, max_samples: int
                   ) -> SeriesColumns:
        try:
            if len(rows) == 1:  # one series (a panel of one pod): read_rows' batch machinery costs more
                got = read_one(self.store, int(rows[0]), start_ms, end_ms, max_samples, self.decoded)
            else:
                got = read_rows(self.store, rows, start_ms, end_ms, max_samples)
        except SampleLimitReached as e:
            raise LimitExceeded(samples_limit_message(matchers, e.limit)) from e
        index = self.store.index
        return SeriesColumns(self._label_columns(rows), got.offsets, got.timestamps, got.values, index.id_column[rows])

    def _label_columns(self, rows: np.ndarray) -> LabelColumns:
        """The index's label_columns of ``rows``; of one row, kept with the index's own selection
        array (read-only: the index keeps it until a series is added or removed, so the row's
        labels cannot change while it is kept). A panel of one pod asks it every refresh."""
        if len(rows) != 1 or rows.flags.writeable:
            return self.store.index.label_columns(rows)
        kept = self._labels_kept.get(id(rows))
        if kept is not None and kept[0] is rows:
            return kept[1]
        labels = self.store.index.label_columns(rows)
        if len(self._labels_kept) >= LABELS_KEPT:
            self._labels_kept.clear()
        self._labels_kept[id(rows)] = (rows, labels)  # the entry holds rows: no other array gets its id
        return labels

    def read(self, request: pb.ReadRequest) -> pb.ReadResponse:
        cols = self.read_columns(request)
        if request.columnar:  # one message: ReadResponse.batch (field 2)
            return pb.ReadResponse.FromString(length_delimited(2, batch_bytes(cols)))
        resp = pb.ReadResponse()
        ids = cols.ids if cols.ids is not None else np.zeros(len(cols), np.uint64)
        for i, labels in enumerate(cols.labels.to_list()):
            lo, hi = int(cols.offsets[i]), int(cols.offsets[i + 1])
            out = resp.series.add(id=int(ids[i]))
            out.labels.extend(labels_to_pb(labels))
            out.timestamps.extend(cols.timestamps[lo:hi].tolist())
            out.values.extend(cols.values[lo:hi].tolist())
        return resp

    def aggregate(self, request: pb.AggregateRequest) -> pb.AggregateResponse:
        """Raises BadRequest, or LimitExceeded when a side selects more than request.max_series."""
        try:
            spec = aggregate_spec_from_pb(request)
            if request.max_series:
                for side in (spec.query, spec.denominator):
                    if side is not None:  # the selection is kept by the index: run_aggregate finds it made
                        found = len(self.store.select(side.matchers, spec.slots))
                        if found > request.max_series:
                            raise LimitExceeded(series_limit_message(list(side.matchers), found, request.max_series))
            res = run_aggregate(self.store, spec)
        except _BAD_INPUT as e:
            raise BadRequest(str(e)) from e
        return aggregate_result_to_pb(res, spec)

    def rollups(self, request: pb.ReadRequest) -> pb.RollupsResponse:
        if request.columnar:  # RollupsResponse.batch: arrays, no message per series (rpc/rollupbatch.py)
            _, rows = self._selected(request.matchers, request.slots, 0)
            index = self.store.index
            return pb.RollupsResponse.FromString(rollups_batch_bytes(
                index.id_column[rows], index.label_columns(rows),
                self.store.rollups.points_many(rows, request.start_ms, request.end_ms)))
        try:
            found = self.store.rollup_points(matchers_from_pb(request.matchers), request.start_ms, request.end_ms,
                                             slot_filter_from_pb(request.slots))
        except _BAD_INPUT as e:
            raise BadRequest(str(e)) from e
        resp = pb.RollupsResponse()
        for sid, labels, p in found:
            out = resp.series.add(id=sid)
            out.labels.extend(labels_to_pb(labels))
            out.hours.extend(p.hour.tolist())
            out.min.extend(p.min.tolist())
            out.max.extend(p.max.tolist())
            out.sum.extend(p.sum.tolist())
            out.count.extend(p.count.tolist())
            out.last.extend(p.last.tolist())
        return resp

    def list_columns(self, request: pb.ListSeriesRequest) -> SeriesColumns:
        """The series a ListSeries names, as columns (ids and label codes, no samples). With a
        ``limit`` the answer is bounded, so max_series does not apply."""
        _, rows = self._selected(request.matchers, request.slots, 0 if request.limit else request.max_series)
        if request.limit:
            rows = rows[: request.limit]
        index = self.store.index
        return SeriesColumns(index.label_columns(rows), np.zeros(len(rows) + 1, np.int64), np.zeros(0, np.int64),
                             np.zeros(0), index.id_column[rows])

    def list_series(self, request: pb.ListSeriesRequest) -> pb.ListSeriesResponse:
        cols = self.list_columns(request)
        if request.columnar:  # ListSeriesResponse.batch (field 2)
            return pb.ListSeriesResponse.FromString(length_delimited(2, batch_bytes(cols, samples=False)))
        resp = pb.ListSeriesResponse()
        ids = cols.ids.tolist() if cols.ids is not None else [0] * len(cols)
        for sid, labels in zip(ids, cols.labels.to_list(), strict=True):
            resp.series.add(id=sid).labels.extend(labels_to_pb(labels))
        return resp

    def label_values(self, request: pb.LabelValuesRequest) -> pb.LabelValuesResponse:
        if not request.name:
            raise BadRequest("label name is empty")
        try:
            slots = slot_filter_from_pb(request.slots)
            rows = (self.store.select(matchers_from_pb(request.matchers), slots)
                    if request.matchers or slots is not None else None)
        except _BAD_INPUT as e:
            raise BadRequest(str(e)) from e
        return pb.LabelValuesResponse(values=self.store.index.label_values(request.name, rows))

    def health(self, request: pb.HealthRequest) -> pb.HealthResponse:
        return pb.HealthResponse(status=self.status, member=self.member, version=__version__)

    def stats(self, request: pb.StatsRequest) -> pb.StatsResponse:
        st = self.store.stats()
        return pb.StatsResponse(
            series=int(st["series"]), samples=int(st["samples"]), chunk_bytes=int(st["chunk_bytes"]),
            chunk_samples=int(st["chunk_samples"]), bytes_per_sample=float(st["bytes_per_sample"]),
            head_samples=int(st["head_samples"]), pods=int(st["pods"]),
            rejected=dict(self.store.rejected + self.store.refused),
            rollup_buckets=int(st["rollup_buckets"]),
        )


class LocalBackend:
    """A store in this process. Each call runs to completion on the event loop thread."""

    def __init__(self, api: StoreAPI) -> None:
        self.api = api

    async def write(self, request: pb.WriteRequest) -> pb.WriteResponse:
        return self.api.write(request)

    async def write_columns(self, batch: WriteColumns) -> pb.WriteResponse:
        return self.api.write_columns(batch)

    async def write_together(self, parts: Sequence[pb.WriteRequest]) -> list[pb.WriteResponse]:
        return self.api.write_together(parts)

    async def read(self, request: pb.ReadRequest) -> pb.ReadResponse:
        return self.api.read(request)

    async def read_columns(self, request: pb.ReadRequest) -> SeriesColumns:
        """read() without a message: what the PromQL prefetch asks of a store in its process."""
        return self.api.read_columns(request)

    async def read_selection(self, matchers: Sequence[Matcher], start_ms: int, end_ms: int, max_series: int = 0,
                             max_samples: int = 0, slots: SlotFilter | None = None) -> SeriesColumns:
        """read_columns of parsed matchers: the PromQL prefetch's one read, no message either way."""
        return self.api.read_selection(matchers, start_ms, end_ms, max_series, max_samples, slots)

    async def list_columns(self, request: pb.ListSeriesRequest) -> SeriesColumns:
        """list_series() without a message (the HTTP API's series, labels and values lookups)."""
        return self.api.list_columns(request)

    async def aggregate(self, request: pb.AggregateRequest) -> pb.AggregateResponse:
        return self.api.aggregate(request)

    async def rollups(self, request: pb.ReadRequest) -> pb.RollupsResponse:
        return self.api.rollups(request)

    async def list_series(self, request: pb.ListSeriesRequest) -> pb.ListSeriesResponse:
        return self.api.list_series(request)

    async def label_values(self, request: pb.LabelValuesRequest) -> pb.LabelValuesResponse:
        return self.api.label_values(request)

    async def health(self) -> pb.HealthResponse:
        return self.api.health(pb.HealthRequest())

    async def stats(self) -> pb.StatsResponse:
        return self.api.stats(pb.StatsRequest())


def StoreServicer(store: Store, member: str = "store") -> MetricsServicer:
    """The gRPC servicer of a store in this process."""
    return MetricsServicer(LocalBackend(StoreAPI(store, member)))


async def gc_loop(gc: Callable[[], int], every_s: float = 60.0,
                  skip: tuple[type[Exception], ...] = ()) -> None:
    """Retention in the background (``gc`` is Store.gc or Durability.gc), then the heap's free pages
    back to the kernel (metricsd/memory.py); logs what it dropped and how long each took. An error
    in ``skip`` skips one pass with a warning."""
    while True:
        await asyncio.sleep(every_s)
        t0 = time.perf_counter()
        try:
            removed = gc()
        except skip as e:
            log.warning("retention pass skipped: %s", e)
            continue
        took = time.perf_counter() - t0
        t1 = time.perf_counter()
        await asyncio.to_thread(release_free_memory)
        log.info("retention pass: %d series removed in %.1f ms; free heap returned to the kernel in %.1f ms",
                 removed, took * 1000, (time.perf_counter() - t1) * 1000)
