"""Reading the samples of many series at once (full scans, range queries over many series).

``Store.series_samples`` reads one series: a Python step per chunk it decodes. Here the ring
samples of every series are gathered in one NumPy pass, and the chunks of all the series that
need them are joined into one buffer and decoded together (codec/blocks.py: decode_many walks
their block headers in lock step), so the cost is per sample, not per series or chunk. The answer
is series_samples' for each row, back to back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from metricsd.codec.blockdecode import decode_chunks, decode_many

if TYPE_CHECKING:
    from metricsd.store.engine import Store

__all__ = ["decode_joined", "ring_part", "series_samples_many"]

MANY_CHUNKS = 32  # from this many chunks on, decode_many; below, decode_chunks' walk
# Entering open chunks mid-way (Chunks.open_tails) saves ~3/4 of each row's decode at a fixed
# cost: ~1.8 ms a read while walk_many walked a few chunks in lock step, ~0.25 ms since it walks
# fewer than FEW_CHUNKS in Python (a 1 h read of 2 h in process: one row 0.42 against 0.20 ms
# whole, 32 rows 3.3 against 2.7, 64 rows 4.7 against 8.5; perf/RESULTS.md, "Issue 25: a day,
# 200,000 series, and the read path"). Below ~40 rows it still loses.
TAIL_MIN_ROWS = 40
BATCH_SERIES = 4096  # series decoded together: bounds the temporary arrays (a day of 4,096 series: ~0.6 GB)


def series_samples_many(store: Store, rows: np.ndarray, start_ms: int, end_ms: int
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Samples of each of ``rows`` in [start_ms, end_ms]: (samples per row, int64 timestamps and
    float64 values of row after row, each in time order)."""
    rows = np.asarray(rows, dtype=np.int64)
    if len(rows) <= BATCH_SERIES:
        return _batch(store, rows, start_ms, end_ms)
    parts = [_batch(store, rows[i : i + BATCH_SERIES], start_ms, end_ms) for i in range(0, len(rows), BATCH_SERIES)]
    return (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]),
            np.concatenate([p[2] for p in parts]))


def ring_part(store: Store, rows: np.ndarray, start_ms: int, end_ms: int
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """What each row's ring gives a read of [start_ms, end_ms]: (covered, samples per row,
    timestamps, values). A covered row's ring holds everything from start_ms on (or the series
    has nothing in chunks) and gives all its samples in range; the others give only their
    unsealed ones, the rest being in their chunks."""
    head, chunks = store.head, store.chunks
    width = max(1, int(head.filled[rows].max()) if len(rows) else 1)
    ht, hv, cnt = head.newest(rows, width)
    col = np.arange(width)[None, :]
    in_range = (col < cnt[:, None]) & (ht >= start_ms) & (ht <= end_ms)
    covered = (chunks.samples[rows] == 0) | ((cnt > 0) & (ht[:, 0] <= start_ms))
    unsealed = head.unsealed[rows].astype(np.int64)
    from_ring = in_range & (covered[:, None] | (col >= (cnt - unsealed)[:, None]))
    return covered, from_ring.sum(axis=1), ht[from_ring], hv[from_ring]


def decode_joined(buf: bytes, starts: np.ndarray, ends: np.ndarray, counts: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray]:
    """The chunks ``buf[starts[i]:ends[i]]`` decoded one after another: a few through
    decode_chunks' walk, many (MANY_CHUNKS or more) through decode_many's lock step."""
    if len(counts) < MANY_CHUNKS:  # a lock step per block position costs more than a Python walk of a few chunks
        return decode_chunks(buf, starts.tolist(), ends.tolist(), counts.tolist())
    return decode_many(buf, starts, ends, counts)


def _batch(store: Store, rows: np.ndarray, start_ms: int, end_ms: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    k = len(rows)
    covered, ring_counts, ring_t, ring_v = ring_part(store, rows, start_ms, end_ms)
    c_counts = np.zeros(k, np.int64)
    c_t, c_v = np.zeros(0, np.int64), np.zeros(0, np.float64)
    need = np.flatnonzero(~covered)
    if len(need):
        c_counts, c_t, c_v = _chunk_samples(store, rows, need, start_ms, end_ms)
    counts = c_counts + ring_counts
    out_t, out_v = np.empty(int(counts.sum()), np.int64), np.empty(int(counts.sum()), np.float64)
    first = np.cumsum(counts) - counts
    if len(c_t):  # each row's chunk samples first, then its ring's
        at = np.repeat(first - (np.cumsum(c_counts) - c_counts), c_counts) + np.arange(len(c_t))
        out_t[at], out_v[at] = c_t, c_v
    at = np.repeat(first + c_counts - (np.cumsum(ring_counts) - ring_counts), ring_counts) + np.arange(
        int(ring_counts.sum()))
    out_t[at], out_v[at] = ring_t, ring_v
    return counts, out_t, out_v


def _chunk_samples(store: Store, rows: np.ndarray, need: np.ndarray, start_ms: int, end_ms: int
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The chunk samples in range of ``rows[need]``: (per row of ``rows``, timestamps, values).
    A row whose range starts inside its open chunk is read from a block near the start
    (Chunks.open_tails), not from the chunk's first block."""
    if len(need) < TAIL_MIN_ROWS:
        return _whole_chunks(store, rows, need, start_ms, end_ms)
    chunks = store.chunks
    tailed, tail_counts, tail_t, tail_v = chunks.open_tails(rows[need], start_ms)
    if bool(tailed.any()):
        rest = _whole_chunks(store, rows, need[~tailed], start_ms, end_ms)
        owner = np.concatenate([np.repeat(need[tailed], tail_counts), np.repeat(np.arange(len(rows)), rest[0])])
        t, v = np.concatenate([tail_t, rest[1]]), np.concatenate([tail_v, rest[2]])
        keep = np.flatnonzero((t >= start_ms) & (t <= end_ms) | (np.arange(len(t)) >= len(tail_t)))
        order = keep[np.argsort(owner[keep], kind="stable")]  # row after row, each part already in time order
        return np.bincount(owner[keep], minlength=len(rows)), t[order], v[order]
    return _whole_chunks(store, rows, need, start_ms, end_ms)


def _whole_chunks(store: Store, rows: np.ndarray, need: np.ndarray, start_ms: int, end_ms: int
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """_chunk_samples with every chunk that overlaps the range decoded from its start."""
    chunks = store.chunks
    bufs: list[bytes | memoryview] = []
    starts: list[int] = []
    ends: list[int] = []
    counts: list[int] = []
    owner: list[int] = []
    at = 0
    for i in need.tolist():
        row = int(rows[i])
        e = chunks.entries(row)
        which = np.flatnonzero((e[:, 1] >= start_ms) & (e[:, 0] <= end_ms)).tolist()
        if not which:
            continue
        payload, _ = chunks.closed(row)
        n_closed = int(chunks.n_closed[row])
        lo = int(e[which[0] - 1, 2]) if which[0] else 0  # where the first chunk wanted begins
        if which[-1] < n_closed:
            bufs.append(payload[lo : int(e[which[-1], 2])])
        else:
            bufs.append(payload[lo:])
            bufs.append(chunks.open[row])
        for j in which:
            starts.append(at + (int(e[j - 1, 2]) if j else 0) - lo)
            ends.append(at + int(e[j, 2]) - lo)
            counts.append(int(e[j, 3]))
            owner.append(i)
        at = ends[-1]
    if not counts:
        return np.zeros(len(rows), np.int64), np.zeros(0, np.int64), np.zeros(0, np.float64)
    buf = b"".join(bufs)
    t, v = decode_joined(buf, np.array(starts), np.array(ends), np.array(counts))
    keep = (t >= start_ms) & (t <= end_ms)
    sample_owner = np.repeat(np.array(owner, np.int64), counts)
    return np.bincount(sample_owner[keep], minlength=len(rows)), t[keep], v[keep]
