"""Retention: drop sealed chunks older than the cutoff and series left with nothing.

A pass used to visit every live row in Python: 39-71 ms of a 40,000-series store's event loop every
minute with nothing to drop (perf/RESULTS.md, "The cluster column after writes moved to streams"),
a second a minute at a million series. Now each row carries an expiry floor in the head
(``Head.expiry_floor``): a lower bound on what retention looks at in it, its oldest chunk's newest
sample or, without chunks, its oldest sample. A pass selects the rows whose floor is below the
cutoff with one NumPy comparison, visits only those, and sets each visited row's floor exactly. On
the same store: the first pass after a start (every floor unknown) 32 ms, the next ones 0.0 - 0.2
ms. The rows such a first pass finds with nothing to drop (their oldest chunk ends after the
cutoff: every row of a store holding less than the retention) get their floor in one NumPy pass:
40,000 series with open chunks only, 262 -> 1.0 ms; with a closed chunk each (2.8 h at 10 s) 365 ->
80 ms, the first closed chunk's end read per row. Under steady retention a row is visited once per
chunk span, when its oldest chunk expires; series written together seal together, so that pass
still visits most rows at once (a stall once per chunk span, ~20 minutes at a 10 s interval,
instead of every minute).

The floor stays a lower bound because every sample enters through ``Store.apply``. Its fast path
appends only samples newer than the row's newest, so chunks sealed from them end after the
floor; samples not newer than the newest go through the merge (``_merge_series``), which resets
the floor to NO_TS. A new or reset row starts at NO_TS, so rows restored from a snapshot are all
visited by the first pass.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from metricsd.store.head import NO_TS

if TYPE_CHECKING:
    from metricsd.store.chunks import Chunks
    from metricsd.store.engine import Store

__all__ = ["drop_expired"]


def drop_expired(store: Store, cutoff: int) -> int:
    """Drop the raw chunks of ``store`` whose newest sample is older than ``cutoff`` and the series
    left with nothing; returns the series removed. Visits only rows the cutoff may reach.

    Of those, the rows whose oldest chunk ends at or after the cutoff lose nothing: their floor is
    set in one NumPy pass (the first pass after a start or after new series, when every floor is
    unknown, is nearly all such rows; it was a Python loop over each, 15-26% of a cluster store's
    live-ingest profile, perf/RESULTS.md issue 24). Only the rows with something to drop, or with
    no chunk at all, go one by one.

    The pass ends with the chunk arenas' clean (arena.py: worn slabs, now with this pass's dead
    regions too, moved up and dropped), which with chunk slabs in files (metricsd/store/slabfiles.py)
    also drops their pages from the resident set again: queries, snapshots and this pass's own reads
    faulted them in. Once, at the end: a clean first and a settle after read the slabs twice."""
    try:
        return _drop_expired(store, cutoff)
    finally:
        store.chunks.clean()  # once a pass


def _drop_expired(store: Store, cutoff: int) -> int:
    head, index, chunks = store.head, store.index, store.chunks
    n = index.n_rows
    rows = np.flatnonzero(index.alive[:n] & (head.expiry_floor[:n] < cutoff))
    if len(rows) == 0:
        return 0
    store._generation += 1
    first_end = _first_chunk_ends(chunks, rows)
    quiet = first_end >= cutoff  # NO_TS (no chunk) is below any cutoff
    head.expiry_floor[rows[quiet]] = first_end[quiet]
    # no chunk (every sample in the ring, unsealed) and a sample the cutoff keeps: its ring's oldest
    unchunked = rows[(first_end == NO_TS) & (head.last_ts[rows] >= cutoff)]
    head.unsealed[unchunked] = head.filled[unchunked]
    head.expiry_floor[unchunked] = np.where(head.filled[unchunked] > 0, head.oldest_ts(unchunked), NO_TS)
    rows = rows[~quiet & ~((first_end == NO_TS) & (head.last_ts[rows] >= cutoff))]
    removed: list[int] = []
    kept: list[int] = []
    for row in rows.tolist():
        chunks.drop_before(row, cutoff)
        if not chunks.samples[row]:
            # the chunks are gone: the ring's samples are the only copy now, to be sealed again
            head.unsealed[row] = head.filled[row]
            if int(head.last_ts[row]) < cutoff:
                index.remove(row)
                head.reset_row(row)
                chunks.reset_row(row)
                removed.append(row)
                continue
        kept.append(row)
    store.rollups.forget(np.array(removed, dtype=np.int64))
    _set_floors(store, np.array(kept, dtype=np.int64))
    return len(removed)


def _first_chunk_ends(chunks: Chunks, rows: np.ndarray) -> np.ndarray:
    """``Chunks.first_max_ts`` of each of ``rows``: NumPy for rows without closed chunks (the open
    chunk's max_ts), the first index entry read from the bytes for the others."""
    out = np.where(chunks.open_count[rows] > 0, chunks.max_ts[rows], NO_TS)
    closed = np.flatnonzero(chunks.n_closed[rows] > 0)
    if len(closed):
        out[closed] = [chunks.first_max_ts(r) for r in rows[closed].tolist()]
    return out


def _set_floors(store: Store, rows: np.ndarray) -> None:
    """What retention looks at in each row from now on: its oldest chunk's newest sample, else its
    oldest sample (NO_TS: none, so the next pass looks again)."""
    head = store.head
    chunk_end = _first_chunk_ends(store.chunks, rows)
    head_start = np.where(head.filled[rows] > 0, head.oldest_ts(rows), NO_TS)
    head.expiry_floor[rows] = np.where(chunk_end != NO_TS, chunk_end, head_start)
