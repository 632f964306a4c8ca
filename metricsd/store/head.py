"""The head: the newest samples of every series, in 2-D NumPy arrays (one row per series).

Row r holds samples [0, count[r]) in time order; the first sealed[r] of them are also in the
series' last sealed chunk (kept so short windows never decode a chunk). When a row is full, its
unsealed samples [sealed, count) become a chunk and the last ``keep`` samples slide to the
front. Appending to many rows at once is a handful of vectorised assignments.

     row r:  | sealed (also in chunks) | unsealed ............ | free |
             0                   sealed[r]              count[r]    capacity

Timestamps are int32 milliseconds after a per-row ``base`` (int64), not int64: 12 bytes a sample
instead of 16, a quarter of the head, which is most of a store's memory per series
(metricsd/store/FORMAT.md, "The head in memory"). A row spans at most OFFSET_MAX ms (24.8 days);
the engine seals and empties a row before a sample would fall past that (``fits``).
"""

from __future__ import annotations

import numpy as np

__all__ = ["NO_TS", "OFFSET_MAX", "Head"]

NO_TS = np.iinfo(np.int64).min
OFFSET_MAX = int(np.iinfo(np.int32).max)


class Head:
    """Columnar head buffers. Not safe for concurrent use; the store serialises access."""

    def __init__(self, capacity: int, keep: int, rows: int = 64) -> None:
        if not 0 < keep < capacity:
            raise ValueError("keep must be in (0, capacity)")
        self.capacity = capacity
        self.keep = keep
        self.ts = np.zeros((rows, capacity), dtype=np.int32)  # ms after base[row]
        self.base = np.zeros(rows, dtype=np.int64)  # meaningful while count[row] > 0
        self.vals = np.zeros((rows, capacity), dtype=np.float64)
        self.count = np.zeros(rows, dtype=np.int32)
        self.sealed = np.zeros(rows, dtype=np.int32)
        # Newest timestamp ever written to the row (also after a seal): the append fast path.
        self.last_ts = np.full(rows, NO_TS, dtype=np.int64)
        # Newest sealed timestamp of the row's series (NO_TS: no chunks), kept by the store so a
        # query can tell, without touching chunk objects, whether the head alone covers a window.
        self.chunk_max_ts = np.full(rows, NO_TS, dtype=np.int64)
        # A lower bound on what retention looks at in the row (its oldest chunk's newest sample,
        # or its oldest sample when it has no chunks); NO_TS: unknown. Kept by the store so a
        # retention pass visits only rows the cutoff has reached (store/retention.py).
        self.expiry_floor = np.full(rows, NO_TS, dtype=np.int64)

    def ensure_rows(self, n: int) -> None:
        have = len(self.count)
        if n <= have:
            return
        new = max(n, have + max(1024, have // 4))  # grow by a quarter: doubling wastes up to half
        self.ts = np.concatenate([self.ts, np.zeros((new - have, self.capacity), np.int32)])
        self.base = np.concatenate([self.base, np.zeros(new - have, np.int64)])
        self.vals = np.concatenate([self.vals, np.zeros((new - have, self.capacity), np.float64)])
        self.count = np.concatenate([self.count, np.zeros(new - have, np.int32)])
        self.sealed = np.concatenate([self.sealed, np.zeros(new - have, np.int32)])
        self.last_ts = np.concatenate([self.last_ts, np.full(new - have, NO_TS, np.int64)])
        self.chunk_max_ts = np.concatenate([self.chunk_max_ts, np.full(new - have, NO_TS, np.int64)])
        self.expiry_floor = np.concatenate([self.expiry_floor, np.full(new - have, NO_TS, np.int64)])

    def reset_row(self, row: int) -> None:
        self.clear(row)
        self.last_ts[row] = NO_TS
        self.chunk_max_ts[row] = NO_TS
        self.expiry_floor[row] = NO_TS

    def clear(self, row: int) -> None:
        """Empty the row's samples (its newest timestamp stays): every one must be in chunks or merged."""
        self.count[row] = 0
        self.sealed[row] = 0

    def room(self, rows: np.ndarray) -> np.ndarray:
        return self.capacity - self.count[rows]

    def fits(self, rows: np.ndarray, first: np.ndarray, newest: np.ndarray) -> np.ndarray:
        """Whether segments from ``first`` to ``newest`` (ms) can join their rows without an
        offset past OFFSET_MAX: an empty row takes its base from the segment."""
        base = np.where(self.count[rows] == 0, first, self.base[rows])
        return np.asarray(newest - base <= OFFSET_MAX)

    def abs_ts(self, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        """Timestamps (int64 ms) at ``head[rows, cols]``; ``rows`` broadcasts against ``cols``."""
        return self.ts[rows, cols].astype(np.int64) + self.base[rows]

    def rank(self, rows: np.ndarray, t: int) -> np.ndarray:
        """How many samples of each row are at or before ``t`` (ms): a binary search of every row
        at once, log2(capacity) rounds of one gathered element per row. Counting samples in a span
        this way gathers a few elements per row instead of a matrix of each row's newest columns
        (the slot digests' statistics, metricsd/store/query.py: series_stats)."""
        rows = np.asarray(rows, dtype=np.int64)
        count = self.count[rows].astype(np.int64)
        rel = t - self.base[rows]
        flat = self.ts.reshape(-1)
        before_first = rows * self.capacity - 1  # flat index of row[-1]; row[c - 1] is before_first + c
        # Fast path: a query at the present has every sample of most rows at or before t.
        out = count.copy()
        search = np.flatnonzero((count > 0) & (flat[before_first + np.maximum(count, 1)] > rel))
        if len(search) == 0:
            return out
        count, rel, before_first = count[search], rel[search], before_first[search]
        # Binary lifting: pos grows by each power of two while the sample at pos - 1 is <= t.
        pos = np.zeros(len(search), dtype=np.int64)
        step = 1 << (int(self.capacity).bit_length() - 1)
        while step:
            cand = np.minimum(pos + step, count)
            pos = np.where(flat[before_first + cand] <= rel, cand, pos)
            step >>= 1
        out[search] = pos
        return out

    def first_ts(self, rows: np.ndarray) -> np.ndarray:
        """The oldest timestamp of each row (meaningless for an empty row)."""
        return self.ts[rows, 0].astype(np.int64) + self.base[rows]

    def unsealed(self, row: int) -> tuple[np.ndarray, np.ndarray]:
        """Copies of the samples of ``row`` that are not yet in a chunk."""
        s, c = int(self.sealed[row]), int(self.count[row])
        return self.ts[row, s:c].astype(np.int64) + self.base[row], self.vals[row, s:c].copy()

    def samples(self, row: int) -> tuple[np.ndarray, np.ndarray]:
        """Every sample in the row, sealed overlap included (timestamps a new array, values a view)."""
        c = int(self.count[row])
        return self.ts[row, :c].astype(np.int64) + self.base[row], self.vals[row, :c]

    def take_for_seal(self, row: int) -> tuple[np.ndarray, np.ndarray]:
        """Remove the unsealed samples for sealing into a chunk; keep the last ``keep`` as overlap,
        rebased so that the row's offsets start again from 0."""
        ts, vals = self.take_for_seal_many(np.array([row]), int(self.sealed[row]), int(self.count[row]))
        return ts[0], vals[0]

    def take_for_seal_many(self, rows: np.ndarray, sealed: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        """take_for_seal of many rows that all hold ``count`` samples, ``sealed`` of them sealed:
        (k x (count - sealed)) timestamps and values, the rows left with their last ``keep``."""
        ts = self.ts[rows, sealed:count].astype(np.int64) + self.base[rows][:, None]
        vals = self.vals[rows, sealed:count]  # fancy indexing: a copy
        k = min(self.keep, count)
        if k:
            shift = self.ts[rows, count - k]
            self.ts[rows, :k] = self.ts[rows, count - k : count] - shift[:, None]
            self.vals[rows, :k] = self.vals[rows, count - k : count]
            self.base[rows] += shift
        self.count[rows] = k
        self.sealed[rows] = k
        return ts, vals

    def append_many(self, rows: np.ndarray, seg_counts: np.ndarray, ts: np.ndarray, vals: np.ndarray) -> None:
        """Append segment i (seg_counts[i] samples) to rows[i], for distinct rows with room.

        ``ts``/``vals`` hold the segments back to back. The caller guarantees each segment is
        newer than its row's last_ts, fits (``seg_counts <= room(rows)``) and ``fits()``.
        """
        if len(rows) == 0:
            return
        if bool(np.all(seg_counts == 1)):  # fast path: one sample per series (the agents' shape)
            pos = self.count[rows]
            empty = pos == 0
            if bool(empty.any()):
                self.base[rows[empty]] = ts[empty]
            self.ts[rows, pos] = ts - self.base[rows]
            self.vals[rows, pos] = vals
            self.count[rows] = pos + 1
            self.last_ts[rows] = ts
            return
        starts = np.cumsum(seg_counts) - seg_counts
        empty = self.count[rows] == 0
        if bool(empty.any()):
            self.base[rows[empty]] = ts[starts[empty]]
        sample_rows = np.repeat(rows, seg_counts)
        offset = np.arange(len(ts)) - np.repeat(starts, seg_counts)
        pos = np.repeat(self.count[rows], seg_counts) + offset
        self.ts[sample_rows, pos] = ts - self.base[sample_rows]
        self.vals[sample_rows, pos] = vals
        self.count[rows] += seg_counts.astype(np.int32)
        ends = starts + seg_counts - 1
        self.last_ts[rows] = ts[ends]

    def replace_row(self, row: int, ts: np.ndarray, vals: np.ndarray, sealed: int) -> None:
        """Set a row's whole content (out-of-order merges and recovery; the rare path)."""
        n = len(ts)
        if n > self.capacity:
            raise ValueError("row content exceeds head capacity")
        if n and int(ts[-1]) - int(ts[0]) > OFFSET_MAX:
            raise ValueError("row content spans more than the head's offsets reach")
        if n:
            self.base[row] = int(ts[0])
            self.ts[row, :n] = np.asarray(ts, dtype=np.int64) - int(ts[0])
        self.vals[row, :n] = vals
        self.count[row] = n
        self.sealed[row] = sealed
        if n:
            self.last_ts[row] = max(int(self.last_ts[row]), int(ts[-1]))

    def _check(self, rows: int) -> None:
        for r in range(rows):
            c, s = int(self.count[r]), int(self.sealed[r])
            assert 0 <= s <= c <= self.capacity
            if c > 1:
                assert bool(np.all(np.diff(self.ts[r, :c]) > 0)), f"row {r} timestamps not increasing"
            if c:
                assert int(self.ts[r, 0]) >= 0, f"row {r} has a sample before its base"
                assert int(self.last_ts[r]) >= int(self.ts[r, c - 1]) + int(self.base[r])
