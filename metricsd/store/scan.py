"""Reading many series' samples at once: the one place the read paths over many series (PromQL
selections, pushed-down counts) touch the head and the sealed chunks.

A selection of 50,000 series read one series at a time (``Store.series_samples``) costs a few
NumPy calls per series before any chunk is decoded. Here the head, where a short window's samples
all are, is read for every row at once: a vectorised binary search finds each row's window
(``Head.rank``) and one gather takes the samples. Only rows whose window reaches past their head
read chunks, through ``ChunkList.read``, which decodes each chunk that overlaps the range once.

Counting samples (``count_over_time``, a pushed-down SERIES_COUNT) needs no values where a chunk
lies wholly inside the window: the chunk's header gives its samples, and tells whether any of them
can be a stale marker (codec.live_counts); only chunks at a window's edge, or whose values may hold
stale markers, are decoded. Counting every sample of a store decodes no chunk of regular data.

Not safe for concurrent use with writes (the store's contract); the arrays returned are new, so
they may be used after the store has changed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from metricsd.codec import decode_chunk, live_counts
from metricsd.columns import search_each
from metricsd.model import STALE_NAN_BITS
from metricsd.store.chunks import STRIDE
from metricsd.store.engine import Store
from metricsd.store.head import NO_TS

__all__ = ["SampleLimitReached", "Samples", "read_rows", "window_counts"]

_STALE = np.uint64(STALE_NAN_BITS)


class SampleLimitReached(Exception):
    """read_rows stopped: the rows hold more samples in the range than its ``max_samples``."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"more than {limit:,} samples")
        self.limit = limit


@dataclass(frozen=True)
class Samples:
    """Row i's samples are ``timestamps[offsets[i]:offsets[i + 1]]`` and the same slice of ``values``."""

    offsets: np.ndarray  # int64, len(rows) + 1
    timestamps: np.ndarray  # int64 ms, increasing within a row
    values: np.ndarray  # float64, stale markers included


def _head_ranges(store: Store, rows: np.ndarray, start_ms: int, end_ms: int) -> tuple[np.ndarray, np.ndarray,
                                                                                      np.ndarray]:
    """(covered, lo, hi): whether the head alone holds every sample of a row from ``start_ms`` on,
    and the head positions [lo, hi) to read: the samples in [start_ms, end_ms] for a covered row,
    only its unsealed ones for the others (their older samples are in chunks)."""
    head = store.head
    count = head.count[rows].astype(np.int64)
    chunk_max = head.chunk_max_ts[rows]
    covered = (chunk_max == NO_TS) | (chunk_max < start_ms)
    if len(rows):
        covered |= (count > 0) & (head.first_ts(rows) <= start_ms)
    lo = head.rank(rows, start_ms - 1) if start_ms > np.iinfo(np.int64).min else np.zeros(len(rows), np.int64)
    hi = head.rank(rows, end_ms)
    lo = np.where(covered, lo, np.maximum(lo, head.sealed[rows].astype(np.int64)))
    return covered, lo, np.maximum(hi, lo)


def _gather_head(store: Store, rows: np.ndarray, lo: np.ndarray, n: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The head samples [lo[i], lo[i] + n[i]) of each row, rows one after another."""
    head = store.head
    total = int(n.sum())
    starts = np.cumsum(n) - n
    src_rows = np.repeat(rows, n)
    cols = np.repeat(lo - starts, n) + np.arange(total, dtype=np.int64)
    return head.ts[src_rows, cols].astype(np.int64) + head.base[src_rows], head.vals[src_rows, cols]


def read_rows(store: Store, rows: np.ndarray, start_ms: int, end_ms: int, max_samples: int = 0) -> Samples:
    """Every sample in [start_ms, end_ms] of each row (live rows, any order), stale markers included.

    ``max_samples`` (0: none): raises SampleLimitReached as soon as the samples found pass it,
    before the head's are gathered and before any further chunk is decoded."""
    rows = np.asarray(rows, dtype=np.int64)
    covered, lo, hi = _head_ranges(store, rows, start_ms, end_ms)
    head_n = hi - lo
    found = int(head_n.sum())
    if max_samples and found > max_samples:
        raise SampleLimitReached(max_samples)
    chunk_n = np.zeros(len(rows), dtype=np.int64)
    parts_t: list[np.ndarray] = []
    parts_v: list[np.ndarray] = []
    for i in np.flatnonzero(~covered).tolist():
        t, v = store.chunks[int(rows[i])].read(start_ms, end_ms)
        chunk_n[i] = len(t)
        parts_t.append(t)
        parts_v.append(v)
        found += len(t)
        if max_samples and found > max_samples:
            raise SampleLimitReached(max_samples)
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(chunk_n + head_n, out=offsets[1:])
    ts = np.empty(int(offsets[-1]), dtype=np.int64)
    vals = np.empty(int(offsets[-1]), dtype=np.float64)
    ht, hv = _gather_head(store, rows, lo, head_n)
    head_dst = np.repeat(offsets[:-1] + chunk_n - (np.cumsum(head_n) - head_n), head_n) + np.arange(len(ht))
    ts[head_dst], vals[head_dst] = ht, hv
    if parts_t:
        ct, cv = np.concatenate(parts_t), np.concatenate(parts_v)
        has = np.flatnonzero(chunk_n)
        n = chunk_n[has]
        chunk_dst = np.repeat(offsets[has] - (np.cumsum(n) - n), n) + np.arange(len(ct))
        ts[chunk_dst], vals[chunk_dst] = ct, cv
    return Samples(offsets, ts, vals)


def _live_in_windows(ts: np.ndarray, vals: np.ndarray, offsets: np.ndarray, times: np.ndarray,
                     window_ms: int) -> np.ndarray:
    """Per series of the flat arrays and time t, its non-stale samples in (t - window_ms, t]."""
    live = np.zeros(len(ts) + 1, dtype=np.int64)
    np.cumsum(vals.view(np.uint64) != _STALE, out=live[1:])
    hi = search_each(ts, offsets, times)
    lo = search_each(ts, offsets, times - window_ms)
    return live[hi] - live[lo]


def window_counts(store: Store, rows: np.ndarray, times: np.ndarray, window_ms: int) -> np.ndarray:
    """Per row and time t, its samples in (t - window_ms, t] that are not stale markers (rows x
    times, int64): count_over_time. Whole chunks are counted from their headers; a chunk is decoded
    only at a window's edge or when its values may hold stale markers."""
    rows = np.asarray(rows, dtype=np.int64)
    times = np.asarray(times, dtype=np.int64)
    out = np.zeros((len(rows), len(times)), dtype=np.int64)
    if len(rows) == 0 or len(times) == 0:
        return out
    start, end = int(times.min()) - window_ms + 1, int(times.max())
    covered, lo, hi = _head_ranges(store, rows, start, end)
    head_n = hi - lo
    ht, hv = _gather_head(store, rows, lo, head_n)
    offsets = np.concatenate([np.zeros(1, np.int64), np.cumsum(head_n)])
    out += _live_in_windows(ht, hv, offsets, times, window_ms)
    slow = np.flatnonzero(~covered)
    if len(slow):
        out[slow] += _chunk_counts(store, rows[slow], times, window_ms)
    return out


def _chunk_counts(store: Store, rows: np.ndarray, times: np.ndarray, window_ms: int) -> np.ndarray:
    """window_counts over the rows' sealed chunks only."""
    lists = [store.chunks[r] for r in rows.tolist()]
    out = np.zeros((len(rows), len(times)), dtype=np.int64)
    lens = np.fromiter((len(c) for c in lists), dtype=np.int64, count=len(lists))
    if int(lens.sum()) == 0:
        return out
    ix = np.frombuffer(b"".join(c.index for c in lists), dtype=np.int64).reshape(-1, STRIDE)
    owner = np.repeat(np.arange(len(lists), dtype=np.int64), lens)
    c_lo, c_hi = ix[:, 0], ix[:, 1]
    size = np.fromiter((len(c.data) for c in lists), dtype=np.int64, count=len(lists))
    data_base = np.cumsum(size) - size  # each list's data in the joined buffer
    ends = ix[:, 2] + data_base[owner]
    first = np.cumsum(lens) - lens
    local = np.arange(len(ix), dtype=np.int64) - first[owner]
    starts = np.where(local > 0, np.roll(ends, 1), data_base[owner])
    w_lo, w_hi = times - window_ms, times  # windows (w_lo, w_hi]
    whole = (c_lo[:, None] > w_lo[None, :]) & (c_hi[:, None] <= w_hi[None, :])
    overlap = (c_hi[:, None] > w_lo[None, :]) & (c_lo[:, None] <= w_hi[None, :])
    if not bool(overlap.any()):
        return out
    buf = np.frombuffer(b"".join(c.data for c in lists), dtype=np.uint8)
    known = live_counts(buf, starts, ends)
    by_header = whole & (known >= 0)[:, None]
    for j in range(len(times)):
        sel = np.flatnonzero(by_header[:, j])
        if len(sel):
            out[:, j] += np.bincount(owner[sel], weights=known[sel], minlength=len(rows)).astype(np.int64)
    decode = np.flatnonzero((overlap & ~by_header).any(axis=1))
    for k in decode.tolist():
        t, v = decode_chunk(buf[starts[k]:ends[k]].data)
        live = np.concatenate([np.zeros(1, np.int64), np.cumsum(v.view(np.uint64) != _STALE)])
        need = overlap[k] & ~by_header[k]
        hi = np.searchsorted(t, w_hi[need], side="right")
        lo = np.searchsorted(t, w_lo[need], side="right")
        out[owner[k], need] += live[hi] - live[lo]
    return out
