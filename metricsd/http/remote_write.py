"""Prometheus remote write receiver, 1.0 and 2.0: ``POST /api/v1/write``.

The body is a snappy *block* (``cramjam.snappy.decompress_raw``; the framed format of plain
``compress``/``decompress`` is a different thing) holding a ``prometheus.WriteRequest``. It is
turned into metricsd's columnar WriteRequest and written through the backend, all or nothing: bad
snappy, bad protobuf, a body over the limits or a series the store refuses answer 4xx and store
nothing. Valid samples the store will not keep (too old for their series, too far ahead of its
clock) are left out and the rest stored, answered 400 naming them (remote_write_answer.py).

The Content-Type's ``proto`` parameter picks the message: ``prometheus.WriteRequest`` (1.0, also
when absent) or ``io.prometheus.write.v2.Request`` (2.0, remote_write_v2.py, answered with the
X-Prometheus-Remote-Write-*-Written headers); anything else is 415.

metricsd keys every series by ``namespace/pod``. The operator's relabel rules run first, then a
series without them gets a cluster-level key (remote_series.py: a default namespace, ``pod`` from
``instance`` or ``job``); one still without is refused with a 400 naming it and the rule.

Remote write 1.0 repeats every series' labels in every request, and a sender's live traffic is one
sample per series, so the labels are nearly all the work. The receiver therefore keeps a
:class:`SeriesCache` from a series' label bytes, exactly as they arrive, to its series id, for the
series the backend has stored: a series seen before costs one dict lookup, its labels are neither
parsed nor validated again, and it goes to the backend by id only, as an agent's gRPC writes do
(proto WriteRequest). Labels go with the series not in the cache; when the backend reports ids it
does not know (a store restarted empty, another proxy), the batch is resent once with their labels,
the handshake of metricsd/rpc/client.py. Samples are decoded and re-encoded with NumPy, a few calls per
request (remote_write_scan.py).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import islice
from typing import NoReturn

import cramjam
import numpy as np
from aiohttp import web
from google.protobuf.message import DecodeError

from metricsd.http import remote_write_v2
from metricsd.http.auth import IDENTITY_KEY
from metricsd.http.params import ApiError
from metricsd.http.remote_series import Verdict, resolve
from metricsd.http.remote_write_answer import SamplesRefused, refused_answer, refused_body
from metricsd.http.remote_write_layout import LayoutMemo
from metricsd.http.remote_write_scan import Scanned, TooLarge, bound_entries, scan, scan_messages
from metricsd.http.selfmetrics import SelfMetrics
from metricsd.http.settings import HttpSettings
from metricsd.model import Labels, series_id
from metricsd.proto import metricsd_pb2 as pb
from metricsd.proto import prometheus_remote_pb2 as prom
from metricsd.rpc.backend import BadRequest, LimitExceeded, MetricsBackend
from metricsd.rpc.columns import ColumnarBackend, WriteColumns
from metricsd.rpc.limits import Refusal, RequestLimits, check_counts
from metricsd.rpc.refusals import SenderRefusals

__all__ = ["DEFAULT_SERIES_CACHE", "PreparedWrite", "RemoteWriteReceiver", "SeriesCache", "decode_body",
           "prepare_write"]

_MAX_NAMED = 5  # series named in one error message
V1_PROTO = "prometheus.WriteRequest"
# Response headers of the 2.0 specification: what was stored, so a sender can tell a partial write.
SAMPLES_WRITTEN = "X-Prometheus-Remote-Write-Samples-Written"
HISTOGRAMS_WRITTEN = "X-Prometheus-Remote-Write-Histograms-Written"
EXEMPLARS_WRITTEN = "X-Prometheus-Remote-Write-Exemplars-Written"

# Series the receiver remembers. An entry is the series' label bytes (about 150-300 bytes for pod
# metrics) plus a dict slot and an int: roughly 400 bytes, so 400 MB at the limit, against about
# 7 KB a series in a store. Past the limit the oldest eighth is dropped; those series cost one
# label parse and one labelled write again.
DEFAULT_SERIES_CACHE = 1_000_000


def _declared_length(body: bytes) -> int:
    """The uncompressed length a snappy block declares up front (a little-endian base-128 varint)."""
    n = shift = 0
    for i, b in enumerate(body[:5]):
        n |= (b & 0x7F) << shift
        if not b & 0x80:
            return n
        shift += 7
        if i == 4:
            break
    raise ApiError("bad_data", "snappy: corrupt input (bad length header)")


def _decompress(body: bytes, max_decompressed_bytes: int) -> bytes:
    if not body:
        raise ApiError("bad_data", "empty body: expected a snappy-compressed prometheus.WriteRequest")
    size = _declared_length(body)
    if size > max_decompressed_bytes:
        raise ApiError("too_large", f"body decompresses to {size} bytes, more than the limit of "
                                    f"{max_decompressed_bytes}", 413)
    try:
        return bytes(cramjam.snappy.decompress_raw(body))
    except Exception as e:  # cramjam raises its own DecompressionError
        raise ApiError("bad_data", f"snappy: {e}") from None


def _protobuf_error(e: DecodeError) -> ApiError:
    return ApiError("bad_data", f"protobuf: cannot decode prometheus.WriteRequest: {e}")


def decode_body(body: bytes, max_decompressed_bytes: int, limits: RequestLimits | None = None,
                cache: SeriesCache | None = None) -> Scanned:
    """Snappy block, then protobuf, to the series entries of the request (labels still as bytes;
    with the receiver's ``cache``, a request of cached series is read without the label walk and
    comes with their ids, Scanned.found).
    Raises ApiError (400, or 413 when it would decompress too big), or TooLarge (past ``limits``
    or a series of too many labels, found before the body is decoded further)."""
    raw = _decompress(body, max_decompressed_bytes)
    if limits is not None:
        bound_entries(raw, 1, limits.max_series)
    warm = cache is not None and len(cache) > 0
    if warm:
        assert cache is not None
        repeated = cache.layouts.match(raw, limits)  # a sender's request repeated: one comparison
        if repeated is not None:
            return repeated
    try:
        found = scan(raw, limits, cache.lookup if warm and cache is not None else None,
                     functools.partial(cache.layouts.record, raw) if warm and cache is not None else None)
        return found if found is not None else scan_messages(prom.WriteRequest.FromString(raw), limits)
    except DecodeError as e:
        raise _protobuf_error(e) from None


def _raw_labels(key: bytes) -> Labels:
    """A series' labels as sent, from its label bytes (empty values left out, as in Prometheus)."""
    try:
        labels = prom.TimeSeries.FromString(key).labels
    except DecodeError as e:
        raise _protobuf_error(e) from None
    d: dict[str, str] = {}
    for lab in labels:
        if lab.name in d:
            shown = ",".join(f'{x.name}="{x.value}"' for x in labels)
            raise ApiError("bad_data", f"series {{{shown}}}: duplicate label name {lab.name!r}")
        if lab.value:  # an empty value is the same as no label, as in Prometheus
            d[lab.name] = lab.value
    return tuple(sorted(d.items()))


def _labels_of(key: bytes, settings: HttpSettings) -> Labels:
    """The labels a series is stored under (it was stored: no rule drops or refuses it now)."""
    verdict = resolve(_raw_labels(key), settings)
    if verdict.labels is None:
        raise ApiError("internal", "a stored series no longer resolves to labels")
    return verdict.labels


class SeriesCache:
    """Label bytes of a series, as sent, to its series id, for series the backend has stored.

    Keys are the bytes of a TimeSeries' label fields, so one series sent with its labels in
    another order or encoding is two entries with one id. A key is always a whole run of label
    fields as the scan's walk or protobuf found it (prepare_write's ``learnt``): the scan's
    shortcut for cached series relies on it (remote_write_scan.py ``_known_layout``). An entry is
    made only after a write of the series succeeded, so it says "labels checked, backend has
    it"; a backend that forgot (``unknown_ids``) gets the labels again and the entry stays.
    Entries hold the labels *after* the receiver's defaults (HttpSettings), so a cache belongs to
    one receiver and its settings.
    Bounded: past ``max_entries`` the oldest-inserted eighth is dropped in one go (FIFO, not LRU:
    a hit must stay one dict lookup). Not safe for concurrent use from several threads; the event
    loop thread only.

    ``layouts``: requests a sender repeats, each recognised in one comparison
    (remote_write_layout.py); recorded only from requests whose every series is cached here, and
    forgotten whenever entries are dropped, so they never say more than the cache.
    """

    def __init__(self, max_entries: int = DEFAULT_SERIES_CACHE) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be at least 1, got {max_entries}")
        self.max_entries = max_entries
        self.evicted = 0
        self._ids: dict[bytes, int] = {}
        self.layouts = LayoutMemo()

    def __len__(self) -> int:
        return len(self._ids)

    def __contains__(self, key: object) -> bool:
        return key in self._ids

    def lookup(self, keys: Sequence[bytes]) -> list[int | None]:
        """The id of each key, None for keys not cached. O(len(keys))."""
        return list(map(self._ids.get, keys))

    def add(self, entries: Iterable[tuple[bytes, int]]) -> None:
        """Remember (key, id) pairs the backend has stored, evicting past the bound."""
        self._ids.update(entries)
        if len(self._ids) > self.max_entries:
            drop = len(self._ids) - self.max_entries + max(1, self.max_entries // 8)
            oldest = list(islice(self._ids, drop))
            for key in oldest:
                del self._ids[key]
            self.evicted += len(oldest)
            self.layouts.clear()


class SeriesRefused(ApiError):
    """A 400 for series that no rule or fallback gives namespace and pod (or that a rule broke);
    ``rules`` says which rule refused each, for /metrics."""

    def __init__(self, verdicts: list[Verdict]) -> None:
        shown = "; ".join(str(v.refusal) for v in verdicts[:_MAX_NAMED]) + (
            f"; and {len(verdicts) - _MAX_NAMED} more" if len(verdicts) > _MAX_NAMED else "")
        super().__init__("bad_data", f"{len(verdicts)} series refused: {shown}")
        self.rules = [v.rule for v in verdicts]


@dataclass
class PreparedWrite:
    """A remote-write body as a columnar batch, and what the handshake needs after it."""

    batch: WriteColumns | None  # None: nothing to write (no series, or every one dropped)
    learnt: list[tuple[bytes, int]]  # series resolved now: cache them once the write succeeds
    keys: Sequence[bytes]  # every written entry's label bytes and id, to find labels the backend asks for
    ids: list[int]
    dropped: dict[int, int] = field(default_factory=dict)  # relabel rule index -> samples it dropped

    def with_labels(self, unknown: Iterable[int], settings: HttpSettings) -> WriteColumns:
        """The batch again, with the labels of ``unknown`` ids added (the backend forgot them)."""
        assert self.batch is not None
        key_of = dict(zip(self.ids, self.keys, strict=True))
        labels = dict(self.batch.labels)
        for sid in dict.fromkeys(unknown):
            if sid in key_of and sid not in labels:
                labels[sid] = _labels_of(key_of[sid], settings)
        return self.batch.with_labels(labels)


def prepare_write(scanned: Scanned, cache: SeriesCache, settings: HttpSettings) -> PreparedWrite:
    """metricsd's columnar batch for a remote-write request: known series by id only, new ones
    with their labels (after the relabel rules and fallbacks of remote_series.py), series a rule
    drops left out. Samples of a series repeated across entries are merged and sorted, and a
    repeated timestamp keeps its first value. Raises SeriesRefused (400) naming the series no rule
    or fallback gives namespace/pod, or ApiError for a duplicate label name."""
    if not scanned.keys:
        return PreparedWrite(None, [], [], [])
    found = scanned.found if scanned.found is not None else cache.lookup(scanned.keys)
    learnt: list[tuple[bytes, int]] = []
    new_labels: dict[int, Labels] = {}
    if None in found:  # the slow path: series not seen before
        refused: list[Verdict] = []
        for i, key in enumerate(scanned.keys):
            if found[i] is None:
                verdict = resolve(_raw_labels(key), settings)
                if verdict.refusal is not None:
                    refused.append(verdict)
                    continue
                if verdict.dropped_by is not None:
                    sid = found[i] = -verdict.dropped_by.index
                else:
                    assert verdict.labels is not None
                    sid = found[i] = series_id(verdict.labels)
                    new_labels[sid] = verdict.labels
                learnt.append((key, sid))
        if refused:
            raise SeriesRefused(refused)
    ids: list[int] = found  # type: ignore[assignment]  # every None was filled in or raised
    if scanned.found_array is not None:  # a repeated request (remote_write_layout.py): ids distinct, none dropped
        uids, counts, stamps, values = _columns(scanned.found_array, True, scanned)
        stamp_bytes = scanned.stamp_varints if stamps is scanned.timestamps else None
        return PreparedWrite(WriteColumns(uids, counts, stamps, values, new_labels, stamp_bytes), learnt,
                             scanned.keys, ids)
    dropped: dict[int, int] = {}
    if min(ids) < 0:  # some series dropped by a rule: leave their entries and samples out
        keep = np.array([sid >= 0 for sid in ids], dtype=bool)
        for sid, n in zip(ids, scanned.counts.tolist(), strict=True):
            if sid < 0:
                dropped[-sid] = dropped.get(-sid, 0) + n
        per_sample = np.repeat(keep, scanned.counts)
        scanned = Scanned([k for k, ok in zip(scanned.keys, keep.tolist(), strict=True) if ok], scanned.counts[keep],
                          scanned.timestamps[per_sample], scanned.values[per_sample])
        ids = [sid for sid in ids if sid >= 0]
        if not ids:
            return PreparedWrite(None, learnt, [], [], dropped)
    as_array = np.fromiter(ids, dtype=np.uint64, count=len(ids))
    uids, counts, stamps, values = _columns(as_array, len(set(ids)) == len(ids), scanned)
    # The sender's timestamp varints serve when the samples pass unchanged, and its ids as ints
    # when each series came once.
    stamp_bytes = scanned.stamp_varints if stamps is scanned.timestamps else None
    batch = WriteColumns(uids, counts, stamps, values, new_labels, stamp_bytes,
                         id_list=ids if uids is as_array else None)
    return PreparedWrite(batch, learnt, scanned.keys, ids, dropped)


def _columns(ids: np.ndarray, each_once: bool, scanned: Scanned
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Series ids (each once, in order of first appearance), counts, timestamps and values, each
    series' samples in increasing time. The usual request (each series once, in time order) is
    checked and passed through; otherwise samples are merged per series, sorted, deduplicated."""
    counts, stamps, values = scanned.counts, scanned.timestamps, scanned.values
    if each_once:
        if len(stamps) < 2:
            return ids, counts, stamps, values
        first = np.zeros(len(stamps), dtype=bool)
        first[(np.cumsum(counts) - counts)[counts > 0]] = True
        if bool(((np.diff(stamps) > 0) | first[1:]).all()):
            return ids, counts, stamps, values
    uniq, first_at, inverse = np.unique(ids, return_index=True, return_inverse=True)
    rank = np.empty(len(uniq), dtype=np.int64)
    rank[np.argsort(first_at, kind="stable")] = np.arange(len(uniq))
    group = np.repeat(rank[inverse.reshape(-1)], counts)
    order = np.lexsort((stamps, group))  # stable: of equal timestamps the first sent comes first
    group, stamps, values = group[order], stamps[order], values[order]
    keep = np.ones(len(stamps), dtype=bool)
    keep[1:] = (group[1:] != group[:-1]) | (stamps[1:] != stamps[:-1])
    group, stamps, values = group[keep], stamps[keep], values[keep]
    out_ids = np.empty(len(uniq), dtype=np.uint64)
    out_ids[rank] = uniq
    return out_ids, np.bincount(group, minlength=len(uniq)).astype(np.int64), stamps, values


class RemoteWriteReceiver:
    """The handler of ``POST /api/v1/write``; owns its SeriesCache (``series_cache`` entries)."""

    def __init__(self, backend: MetricsBackend, settings: HttpSettings, metrics: SelfMetrics,
                 series_cache: int = DEFAULT_SERIES_CACHE) -> None:
        self.backend = backend
        self.settings = settings
        self.metrics = metrics
        self.cache = SeriesCache(series_cache)
        metrics.watch_layouts(self.cache)
        self.label_resends = 0  # writes resent with labels after the backend reported unknown ids
        self.senders = SenderRefusals("remote write")  # samples not stored, per sender
        self._columnar: tuple[MetricsBackend, bool] | None = None

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/api/v1/write", self.write)

    def version(self, encoding: str | None, content_type: str | None) -> int:
        """Content negotiation as the 2.0 specification says: the ``proto`` parameter of the
        Content-Type picks the message (1.0 when absent); another message is 415."""
        enc = (encoding or "snappy").strip().lower()
        if enc != "snappy":
            raise ApiError("bad_data", f"unsupported Content-Encoding {enc!r}: remote write bodies are snappy")
        # The media type itself is not checked: 1.0 senders that label the body otherwise (or not
        # at all) were served before 2.0 existed.
        _, *rest = (content_type or "application/x-protobuf").split(";")
        proto = _content_type_params(rest).get("proto", V1_PROTO)
        if proto == V1_PROTO:
            return 1
        if proto == remote_write_v2.PROTO:
            return 2
        raise ApiError("bad_data", f"unsupported remote write message {proto!r}: metricsd receives remote write 1.0 "
                                   f"({V1_PROTO}) and 2.0 ({remote_write_v2.PROTO})", 415)

    async def write(self, request: web.Request) -> web.Response:
        """The aiohttp route; the hot path (metricsd/http/hotwrite.py) calls :meth:`respond` itself."""
        # The headers first: aiohttp would inflate a gzip or deflate body as it reads it.
        version = self.version(request.headers.get("Content-Encoding"), request.headers.get("Content-Type"))
        status, body, headers = await self.respond(version, await request.read(),
                                                   lambda: request.get(IDENTITY_KEY) or request.remote or "unknown")
        if body is None:
            return web.Response(status=status, headers=headers)
        return web.Response(body=body, status=status, headers=headers, content_type="application/json",
                            charset="utf-8")

    async def respond(self, version: int, body: bytes, sender: Callable[[], str]
                      ) -> tuple[int, bytes | None, dict[str, str] | None]:
        """A write request's answer from its version (:meth:`version`) and body: (status, JSON body
        or None, extra headers); a refused request's ApiError (or BadRequest, LimitExceeded) is
        raised for the caller's error mapping. ``sender``: who sent it, asked only when samples are
        refused."""
        try:
            if version == 1:
                await self.ingest(body)
                return 204, None, None
            written = await self.ingest_v2(body)
        except SamplesRefused as e:  # the rest was stored: a 400 naming what was not (remote_write_answer.py)
            return (e.status, refused_body(e, self.senders, self.metrics, sender()),
                    _v2_headers(e.written) if version == 2 else None)
        return 204, None, _v2_headers(written)

    async def ingest(self, body: bytes) -> int:
        """Store a remote write 1.0 body (snappy block), all or nothing; returns the samples
        written. Raises ApiError or BadRequest (4xx, nothing stored) and whatever the backend
        raises (Unavailable)."""
        try:
            scanned = decode_body(body, self.settings.max_decompressed_bytes, self.settings.request_limits,
                                  self.cache)
        except TooLarge as e:
            self._refuse(e.refusal, 0)
        self._check_counts(len(scanned.keys), len(scanned.timestamps))
        return await self._store(scanned)

    async def ingest_v2(self, body: bytes) -> int:
        """ingest() for a remote write 2.0 body (io.prometheus.write.v2.Request)."""
        raw = _decompress(body, self.settings.max_decompressed_bytes)
        max_series = self.settings.request_limits.max_series
        try:
            bound_entries(raw, remote_write_v2.SERIES_FIELD, max_series)
            bound_entries(raw, remote_write_v2.SYMBOLS_FIELD, max_series * remote_write_v2.SYMBOLS_PER_SERIES,
                          f"symbols ({remote_write_v2.SYMBOLS_PER_SERIES} for each series a request may hold)",
                          "request_symbols", spare=1)
        except TooLarge as e:
            self._refuse(e.refusal, 0)
        try:
            req = remote_write_v2.parse(raw)
            self._check_counts(*remote_write_v2.counts(req))
            found = remote_write_v2.entries(req, self.settings.created_timestamp_zero)
        except DecodeError as e:
            raise ApiError("bad_data", f"protobuf: cannot decode {remote_write_v2.PROTO}: {e}") from None
        if found.histograms or found.exemplars:
            self.metrics.samples_rejected.labels(reason="unsupported_type").inc(found.histograms + found.exemplars)
        return await self._store(found.scanned)

    def _check_counts(self, series: int, samples: int) -> None:
        """Before a label is parsed: a request of a million series costs nothing to refuse."""
        refusal = check_counts(series, samples, self.settings.request_limits)
        if refusal is not None:
            self._refuse(refusal, samples)

    def _refuse(self, refusal: Refusal, samples: int) -> NoReturn:
        self.metrics.samples_rejected.labels(reason=refusal.reason).inc(samples)
        raise ApiError("bad_data", refusal.message)

    async def _write(self, batch: WriteColumns) -> pb.WriteResponse:
        """The batch to the backend: as columns when it takes them (a store in this process, a
        proxy), else as a message."""
        backend = self.backend
        columnar = self._columnar
        if columnar is None or columnar[0] is not backend:  # a runtime Protocol check is slow: once
            columnar = self._columnar = (backend, isinstance(backend, ColumnarBackend))
        if columnar[1]:
            return await backend.write_columns(batch)  # type: ignore[attr-defined]
        return await backend.write(batch.to_request())

    async def _store(self, scanned: Scanned) -> int:
        n = len(scanned.timestamps)
        try:
            prepared = prepare_write(scanned, self.cache, self.settings)
            for rule, k in prepared.dropped.items():
                self.metrics.relabel_dropped.labels(rule=str(rule)).inc(k)
            if prepared.batch is None:
                self.cache.add(prepared.learnt)
                return 0
            resp = await self._write(prepared.batch)
            if resp.unknown_ids:  # the backend forgot series we cached: send their labels once
                self.label_resends += 1
                resp = await self._write(prepared.with_labels(resp.unknown_ids, self.settings))
        except SeriesRefused as e:
            for refused_by in e.rules:
                self.metrics.series_refused.labels(rule=refused_by).inc()
            self.metrics.samples_rejected.labels(reason="invalid").inc(n)
            raise
        except (ApiError, BadRequest):
            self.metrics.samples_rejected.labels(reason="invalid").inc(n)
            raise
        except LimitExceeded:
            self.metrics.samples_rejected.labels(reason="series_limit").inc(n)
            raise
        if resp.unknown_ids:
            raise ApiError("internal", f"backend reported {len(resp.unknown_ids)} unknown series although their "
                                       "labels were sent")
        self.cache.add(prepared.learnt)
        self.metrics.samples_ingested.labels(path="remote_write").inc(resp.samples_written)
        if resp.rejected_too_old:
            self.metrics.samples_rejected.labels(reason="too_old").inc(resp.rejected_too_old)
        if resp.rejected_too_far_ahead:
            self.metrics.samples_rejected.labels(reason="too_far_ahead").inc(resp.rejected_too_far_ahead)
        if resp.rejected_duplicate:
            self.metrics.samples_rejected.labels(reason="duplicate").inc(resp.rejected_duplicate)
        refused = refused_answer(resp, n)  # samples not stored: never a 204
        if refused is not None:
            raise refused
        # A duplicate is a sample the store already holds (a retried batch): written, for the sender.
        return int(resp.samples_written + resp.rejected_duplicate)


def _v2_headers(written: int) -> dict[str, str]:
    return {SAMPLES_WRITTEN: str(written), HISTOGRAMS_WRITTEN: "0", EXEMPLARS_WRITTEN: "0"}


def _content_type_params(parts: Sequence[str]) -> dict[str, str]:
    out = {}
    for p in parts:
        k, _, v = p.strip().partition("=")
        out[k.strip().lower()] = v.strip().strip('"')
    return out
