"""Appending samples: into each series' ring in the head and, a block at a time, into its chunks.

A write appends a segment of new samples to each of its series. The samples that complete a
block (the ring's unsealed ones first, then the segment's) are sealed at once for every series
of the write: the k-th block of each series in one ``encode_blocks`` call (a "wave"; the
agents' shape, one sample a series, makes at most one wave, the backfill shape a few). Then
the newest samples go into the rings, which keep the last ``capacity`` raw for short queries.

Everything here is NumPy over the series of the write, except one bytes concatenation per
series and block (metricsd/store/chunks.py) and the slow path for series whose ring cannot
reach a sample (written less often than every 24.8 days / ring size).
"""

from __future__ import annotations

import numpy as np

from metricsd.codec.blocks import encode_blocks
from metricsd.maths.samplehash import sample_hashes
from metricsd.store.chunks import Chunks
from metricsd.store.head import Head

__all__ = ["SEAL_ROWS", "flush", "store_segments"]

SEAL_ROWS = 2048
"""Series sealed in one encode_blocks call at most: a wave of more is sealed in slices. The codec's
temporaries (k x block int64 arrays) then stay in cache: a wave of 8,000 series in one call cost
47% more a sample than four of 2,000 (perf/RESULTS.md, issue 24 session 34)."""


def store_segments(head: Head, chunks: Chunks, rows: np.ndarray, counts: np.ndarray, starts: np.ndarray,
                   ts: np.ndarray, vals: np.ndarray) -> None:
    """Append segment i (``counts[i]`` samples of ``ts``/``vals`` from ``starts[i]``, strictly
    increasing and newer than everything the series holds) to distinct ``rows[i]``."""
    if len(rows) == 0:
        return
    counts = np.asarray(counts, dtype=np.int64)
    starts = np.asarray(starts, dtype=np.int64)
    ok = head.fit(rows, counts, starts, ts)
    if not bool(ok.all()):
        for i in np.flatnonzero(~ok).tolist():
            s, c = int(starts[i]), int(counts[i])
            _store_sparse(head, chunks, int(rows[i]), ts[s : s + c], vals[s : s + c])
        rows, counts, starts = rows[ok], counts[ok], starts[ok]
        if len(rows) == 0:
            return
    _seal_blocks(head, chunks, rows, counts, starts, ts, vals)
    head.write(rows, counts, starts, ts, vals)


def _seal_blocks(head: Head, chunks: Chunks, rows: np.ndarray, counts: np.ndarray, starts: np.ndarray,
                 ts: np.ndarray, vals: np.ndarray) -> None:
    """Seal every block the segments complete (reading the rings before they are written)."""
    block = chunks.block
    unsealed = head.unsealed[rows]
    total = unsealed + counts
    if not bool((total >= block).any()):  # fast path: no block fills (most writes of the agents' shape)
        head.unsealed[rows] = total
        return
    n_blocks = total // block
    head.unsealed[rows] = total - n_blocks * block
    todo = np.flatnonzero(n_blocks)
    rows, unsealed, starts, n_blocks = rows[todo], unsealed[todo].astype(np.int64), starts[todo], n_blocks[todo]
    # sequence element e of a series: its ring's unsealed samples first, then its segment
    ring_first = head.pos[rows].astype(np.int64) - unsealed  # ring slot of element 0, before wrapping
    col = np.arange(block)[None, :]
    for wave in range(int(n_blocks.max())):
        in_wave = np.flatnonzero(n_blocks > wave) if wave else np.arange(len(rows))
        for lo in range(0, len(in_wave), SEAL_ROWS):
            sel = in_wave[lo : lo + SEAL_ROWS]
            r = rows[sel]
            e = wave * block + col
            in_ring = e < unsealed[sel][:, None]
            slot = (ring_first[sel][:, None] + e) % head.capacity
            src = np.where(in_ring, 0, starts[sel][:, None] + e - unsealed[sel][:, None])
            t = np.where(in_ring, head.slot_ts(r, slot), ts[src])
            v = np.where(in_ring, head.slot_vals(r, slot), vals[src])
            _append_blocks(chunks, r, t, v)


def _append_blocks(chunks: Chunks, rows: np.ndarray, t: np.ndarray, v: np.ndarray) -> None:
    """Seal one block per row (k x n samples) and append it to the row's open chunk."""
    enc = encode_blocks(t, v, chunks.chain(rows), chunks.block)
    hashes = sample_hashes(t, v).sum(axis=1, dtype=np.uint64)
    chunks.append(rows, enc, t[:, 0], t[:, -1], t.shape[1], hashes)


def flush(head: Head, chunks: Chunks, row: int) -> None:
    """Seal the ring's unsealed samples of ``row`` as a short block (before the ring is emptied)."""
    u = int(head.unsealed[row])
    if u == 0:
        return
    t, v = head.unsealed_samples(row)
    _append_blocks(chunks, np.array([row]), t[None, :], v[None, :])
    head.unsealed[row] = 0


def _store_sparse(head: Head, chunks: Chunks, row: int, ts: np.ndarray, vals: np.ndarray) -> None:
    """The slow path, a sample at a time: when the ring cannot reach the next sample (its span
    would pass OFFSET_MAX), seal what it has unsealed and empty it."""
    one = np.ones(1, dtype=np.int64)
    zero = np.zeros(1, dtype=np.int64)
    rows = np.array([row])
    for i in range(len(ts)):
        t, v = ts[i : i + 1], vals[i : i + 1]
        if not bool(head.fit(rows, one, zero, t)[0]):
            flush(head, chunks, row)
            head.clear(row)
        _seal_blocks(head, chunks, rows, one, zero, t, v)
        head.write(rows, one, zero, t, v)
