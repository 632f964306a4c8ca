"""Reading many series' samples at once: the read paths over many series (PromQL selections,
pushed-down counts) go through here.

``read_rows`` is Store.series_samples_many (store/readmany.py: the rings of every row in one pass,
the chunks of all rows that need them decoded together) in the flat layout the RPC answers use,
with a limit on the samples it may return, checked batch by batch before more is decoded.

Counting samples (``count_over_time``, a pushed-down SERIES_COUNT) needs no values where a chunk
lies wholly inside the window: the store's chunk index gives each chunk's time range and samples,
and a decimal chunk (its family byte, codec/FORMAT.md "Block chunks") cannot hold a stale marker,
whose value is a NaN. Only chunks at a window's edge, or XOR chunks, whose values may be stale
markers, are decoded. Counting every sample of a store of regular data decodes no chunk.

Not safe for concurrent use with writes (the store's contract); the arrays returned are new, so
they may be used after the store has changed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from metricsd.codec.blocks import MAX_SCALE
from metricsd.columns import search_each
from metricsd.model import STALE_NAN_BITS
from metricsd.store.chunks import STRIDE
from metricsd.store.engine import Store
from metricsd.store.readmany import BATCH_SERIES, decode_joined, ring_part

__all__ = ["SampleLimitReached", "Samples", "read_rows", "window_counts"]

_STALE = np.uint64(STALE_NAN_BITS)
_ENTRY = 8 * STRIDE  # bytes of one closed chunk's index entry


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


def read_rows(store: Store, rows: np.ndarray, start_ms: int, end_ms: int, max_samples: int = 0) -> Samples:
    """Every sample in [start_ms, end_ms] of each row (live rows, any order), stale markers included.

    ``max_samples`` (0: none): raises SampleLimitReached as soon as the samples read pass it, after
    at most one batch of BATCH_SERIES rows more than the limit allows."""
    rows = np.asarray(rows, dtype=np.int64)
    counts, parts_t, parts_v = [], [], []
    found = 0
    for i in range(0, max(len(rows), 1), BATCH_SERIES):
        c, t, v = store.series_samples_many(rows[i : i + BATCH_SERIES], start_ms, end_ms)
        found += len(t)
        if max_samples and found > max_samples:
            raise SampleLimitReached(max_samples)
        counts.append(c)
        parts_t.append(t)
        parts_v.append(v)
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(np.concatenate(counts), out=offsets[1:])
    return Samples(offsets, np.concatenate(parts_t), np.concatenate(parts_v))


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
    times, int64): count_over_time. Whole decimal chunks are counted from the chunk index; a chunk
    is decoded only at a window's edge or when its values may hold stale markers."""
    rows = np.asarray(rows, dtype=np.int64)
    times = np.asarray(times, dtype=np.int64)
    out = np.zeros((len(rows), len(times)), dtype=np.int64)
    if len(rows) == 0 or len(times) == 0:
        return out
    start, end = int(times.min()) - window_ms + 1, int(times.max())
    for i in range(0, len(rows), BATCH_SERIES):
        part = rows[i : i + BATCH_SERIES]
        covered, n, ring_t, ring_v = ring_part(store, part, start, end)
        offsets = np.concatenate([np.zeros(1, np.int64), np.cumsum(n)])
        got = _live_in_windows(ring_t, ring_v, offsets, times, window_ms)
        slow = np.flatnonzero(~covered)
        if len(slow):
            got[slow] += _chunk_counts(store, part[slow], times, window_ms)
        out[i : i + len(part)] = got
    return out


@dataclass(frozen=True)
class _ChunkTable:
    """Every chunk (closed and open) of some rows, their bytes joined: chunk j is
    ``buf[starts[j]:ends[j]]``, holds ``counts[j]`` samples from ``min_ts[j]`` to ``max_ts[j]``
    and belongs to row ``owner[j]`` (a position in the rows given)."""

    buf: bytes
    starts: np.ndarray
    ends: np.ndarray
    counts: np.ndarray
    min_ts: np.ndarray
    max_ts: np.ndarray
    owner: np.ndarray


def _chunk_table(store: Store, rows: np.ndarray) -> _ChunkTable:
    """The chunks of ``rows`` with a few NumPy calls over all of them: each row's closed chunks
    and their index are one bytes object (store/chunks.py), its open chunk another, with its
    range and count in the store's columns."""
    ch = store.chunks
    closed = ch.data.take(rows)  # copies, joined next: cheaper than a view a row (store/arena.py)
    opened = ch.open.take(rows)
    size = ch.data.size[rows].astype(np.int64)
    osize = ch.open.size[rows].astype(np.int64)
    joined = b"".join(closed + opened)
    raw = np.frombuffer(joined, dtype=np.uint8)
    base = np.cumsum(size) - size
    n_closed = ch.n_closed[rows].astype(np.int64)
    owner_c = np.repeat(np.arange(len(rows), dtype=np.int64), n_closed)
    first = np.cumsum(n_closed) - n_closed
    local = np.arange(len(owner_c), dtype=np.int64) - first[owner_c]
    at = (base + size - _ENTRY * n_closed)[owner_c] + _ENTRY * local  # each closed chunk's index entry
    ix = raw[at[:, None] + np.arange(_ENTRY)[None, :]].view("<i8").reshape(-1, STRIDE)
    prev_end = np.concatenate([np.zeros(1, np.int64), ix[:-1, 2]])
    c_start = base[owner_c] + np.where(local > 0, prev_end, 0)
    c_end = base[owner_c] + ix[:, 2]
    has_open = np.flatnonzero(osize > 0)
    o_start = (int(size.sum()) + np.cumsum(osize) - osize)[has_open]
    o_rows = rows[has_open]
    return _ChunkTable(joined, np.concatenate([c_start, o_start]), np.concatenate([c_end, o_start + osize[has_open]]),
                       np.concatenate([ix[:, 3], ch.open_count[o_rows].astype(np.int64)]),
                       np.concatenate([ix[:, 0], ch.open_min[o_rows]]), np.concatenate([ix[:, 1], ch.max_ts[o_rows]]),
                       np.concatenate([owner_c, has_open]))


def _sum_by_owner(owner: np.ndarray, mat: np.ndarray, k: int) -> np.ndarray:
    """Rows of ``mat`` summed by their owner (0..k-1): k x mat's columns."""
    out = np.zeros((k, mat.shape[1]), dtype=np.int64)
    if len(owner) == 0:
        return out
    order = np.argsort(owner, kind="stable")
    o = owner[order]
    first = np.flatnonzero(np.concatenate([[True], o[1:] != o[:-1]]))
    out[o[first]] = np.add.reduceat(mat[order], first, axis=0)
    return out


def _chunk_counts(store: Store, rows: np.ndarray, times: np.ndarray, window_ms: int) -> np.ndarray:
    """window_counts over the rows' sealed samples (their chunks) only."""
    tab = _chunk_table(store, rows)
    w_lo, w_hi = times - window_ms, times  # windows (w_lo, w_hi]
    overlap = (tab.max_ts[:, None] > w_lo[None, :]) & (tab.min_ts[:, None] <= w_hi[None, :])
    whole = (tab.min_ts[:, None] > w_lo[None, :]) & (tab.max_ts[:, None] <= w_hi[None, :])
    decimal = np.frombuffer(tab.buf, dtype=np.uint8)[tab.starts] <= MAX_SCALE  # the chunk's family byte
    by_index = whole & decimal[:, None]
    out = _sum_by_owner(tab.owner, by_index * tab.counts[:, None], len(rows))
    read = overlap & ~by_index
    dec = np.flatnonzero(read.any(axis=1))
    if len(dec):
        t, v = decode_joined(tab.buf, tab.starts[dec], tab.ends[dec], tab.counts[dec])
        offsets = np.concatenate([np.zeros(1, np.int64), np.cumsum(tab.counts[dec])])
        out += _sum_by_owner(tab.owner[dec], _live_in_windows(t, v, offsets, times, window_ms) * read[dec],
                             len(rows))
    return out
