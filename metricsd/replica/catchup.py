"""Catch-up pages: a slot set's raw samples as WriteRequests of bounded size (rpc CatchUp).

A stream visits the series of the requested slots in ascending id order and each series' samples
in time order. A page holds at most ``max_samples`` samples (a long series is split across pages)
and labels for every series in it, so the receiver can apply it with its ordinary write path.

Resume token (``CatchUpPage.resume_token``), 17 bytes, little-endian::

    version <uint8> = 1 | series id <uint64> | timestamp <int64>

"everything up to and including sample ``timestamp`` of series ``id`` was sent; series with a
smaller id were sent whole". Ids, not positions, so a token stays valid while series are added to
or dropped from the store between calls. An empty token on a page means it is the last.

No I/O: pages are built from an in-memory :class:`~metricsd.store.engine.Store`; the gRPC shell
(metricsd/replica/servicer.py) streams them and the client (catchup_client.py) applies them.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

import numpy as np

from metricsd.maths.slots import SlotFilter
from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc.wire import labels_to_pb
from metricsd.store.engine import Store

__all__ = ["DEFAULT_PAGE_SAMPLES", "MAX_PAGE_SAMPLES", "build_page", "decode_token", "encode_token", "missing_only",
           "pages", "slot_series"]

_TOKEN = struct.Struct("<BQq")
_TOKEN_VERSION = 1
DEFAULT_PAGE_SAMPLES = 20_000
MAX_PAGE_SAMPLES = 1_000_000
MAX_PAGE_SERIES = 5_000


def encode_token(series_id: int, timestamp: int) -> bytes:
    return _TOKEN.pack(_TOKEN_VERSION, series_id, timestamp)


def decode_token(token: bytes) -> tuple[int, int] | None:
    """(series id, last timestamp sent), or None for the empty token. Raises ValueError when malformed."""
    if not token:
        return None
    if len(token) != _TOKEN.size:
        raise ValueError(f"resume token is {len(token)} bytes, want {_TOKEN.size}")
    version, sid, ts = _TOKEN.unpack(token)
    if version != _TOKEN_VERSION:
        raise ValueError(f"resume token version {version} is not {_TOKEN_VERSION}")
    return int(sid), int(ts)


def slot_series(store: Store, slots: pb.SlotFilter) -> np.ndarray:
    """Ids (uint64, ascending) of the store's live series in the slots; all series when slot_count is 0.
    Raises ValueError for a slot out of range."""
    if slots.slot_count and any(s >= slots.slot_count for s in slots.slots):
        raise ValueError(f"slot out of range 0..{slots.slot_count - 1}")
    f = SlotFilter(slots.slot_count, tuple(slots.slots)) if slots.slot_count else None
    rows = store.select([], f)
    ids = store.index.id_column[rows] if len(rows) else np.zeros(0, dtype=np.uint64)
    return np.sort(ids.astype(np.uint64))


def build_page(store: Store, ids: np.ndarray, start_ms: int, end_ms: int, token: tuple[int, int] | None,
               max_samples: int, max_series: int = MAX_PAGE_SERIES) -> tuple[pb.WriteRequest, bytes]:
    """The page after ``token`` over the series ``ids`` (ascending), and the token after it (empty:
    nothing is left). Series the store no longer holds are skipped. O(samples in the page) plus one
    chunk read per series visited."""
    if max_samples < 1:
        raise ValueError("max_samples must be at least 1")
    page = pb.WriteRequest()
    pos = 0
    lo = start_ms
    if token is not None:
        pos = int(np.searchsorted(ids, np.uint64(token[0])))
        if pos < len(ids) and int(ids[pos]) == token[0]:
            lo = max(start_ms, token[1] + 1)
    room = max_samples
    series = 0
    while pos < len(ids) and room > 0 and series < max_series:
        sid = int(ids[pos])
        row = store.index.row_of(sid)
        t, v = store.series_samples(row, lo, end_ms) if row is not None else (np.zeros(0, np.int64), None)
        if len(t) == 0 or v is None:
            pos, lo = pos + 1, start_ms
            continue
        take = min(len(t), room)
        labels = store.index.labels[row] if row is not None else None
        assert labels is not None
        page.ids.append(sid)
        page.counts.append(take)
        page.timestamps.extend(t[:take].tolist())
        page.values.extend(v[:take].tolist())
        page.series.add(id=sid).labels.extend(labels_to_pb(labels))
        room -= take
        series += 1
        if take < len(t):
            return page, encode_token(sid, int(t[take - 1]))
        pos, lo = pos + 1, start_ms
    if pos >= len(ids):
        return page, b""
    last = int(ids[pos - 1]) if pos > 0 else 0
    # Stopped on a series boundary: the next page starts at ids[pos]. A token naming the series before
    # it at the largest timestamp says exactly that.
    return page, encode_token(last, np.iinfo(np.int64).max - 1) if pos > 0 else encode_token(int(ids[0]), start_ms - 1)


def pages(store: Store, request: pb.CatchUpRequest) -> Iterator[pb.CatchUpPage]:
    """The pages of a CatchUpRequest, built one at a time as the caller asks for them (the store may
    take writes in between). The series set is fixed when the first page is built; a resumed call
    sees series added since. The last page carries an empty token (it may be empty itself).
    Raises ValueError for a malformed request (bad token, range, slot)."""
    if request.end_ms < request.start_ms:
        raise ValueError(f"end_ms {request.end_ms} is before start_ms {request.start_ms}")
    token = decode_token(request.resume_token)
    size = request.max_samples_per_page or DEFAULT_PAGE_SAMPLES
    size = min(size, MAX_PAGE_SAMPLES)
    ids = slot_series(store, request.slots)
    while True:
        batch, next_token = build_page(store, ids, request.start_ms, request.end_ms, token, size)
        yield pb.CatchUpPage(batch=batch, resume_token=next_token)
        if not next_token:
            return
        token = decode_token(next_token)


def missing_only(store: Store, batch: pb.WriteRequest) -> pb.WriteRequest:
    """The samples of ``batch`` that the store does not hold yet (by timestamp), with labels only for
    series new to it: what a catch-up page adds. Filtering first keeps the store's merge path
    (which rewrites a series from the first merged sample on) for real gaps only."""
    out = pb.WriteRequest()
    labels = {s.id: s for s in batch.series}
    ts_all = np.array(batch.timestamps, dtype=np.int64)
    vals_all = np.array(batch.values, dtype=np.float64)
    pos = 0
    keep_t: list[np.ndarray] = []
    keep_v: list[np.ndarray] = []
    for sid, count in zip(batch.ids, batch.counts, strict=True):
        t, v = ts_all[pos : pos + count], vals_all[pos : pos + count]
        pos += count
        if count == 0:
            continue
        row = store.index.row_of(sid)
        if row is not None:
            have, _ = store.series_samples(row, int(t[0]), int(t[-1]))
            if len(have):
                new = ~np.isin(t, have, assume_unique=True)
                t, v = t[new], v[new]
            if len(t) == 0:
                continue
        elif sid in labels:
            out.series.append(labels[sid])
        out.ids.append(sid)
        out.counts.append(len(t))
        keep_t.append(t)
        keep_v.append(v)
    if keep_t:
        out.timestamps.extend(np.concatenate(keep_t).tolist())
        out.values.extend(np.concatenate(keep_v).tolist())
    return out
