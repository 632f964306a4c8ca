"""The head: the newest samples of every series, in 2-D NumPy arrays (one row per series).

Row r holds samples [0, count[r]) in time order; the first sealed[r] of them are also in the
series' last sealed chunk (kept so short windows never decode a chunk). When a row is full, its
unsealed samples [sealed, count) become a chunk and the last ``keep`` samples slide to the
front. Appending to many rows at once is a handful of vectorised assignments.

     row r:  | sealed (also in chunks) | unsealed ............ | free |
             0                   sealed[r]              count[r]    capacity
"""

from __future__ import annotations

import numpy as np

__all__ = ["NO_TS", "Head"]

NO_TS = np.iinfo(np.int64).min


class Head:
    """Columnar head buffers. Not safe for concurrent use; the store serialises access."""

    def __init__(self, capacity: int, keep: int, rows: int = 64) -> None:
        if not 0 < keep < capacity:
            raise ValueError("keep must be in (0, capacity)")
        self.capacity = capacity
        self.keep = keep
        self.ts = np.zeros((rows, capacity), dtype=np.int64)
        self.vals = np.zeros((rows, capacity), dtype=np.float64)
        self.count = np.zeros(rows, dtype=np.int32)
        self.sealed = np.zeros(rows, dtype=np.int32)
        # Newest timestamp ever written to the row (also after a seal): the append fast path.
        self.last_ts = np.full(rows, NO_TS, dtype=np.int64)
        # Newest sealed timestamp of the row's series (NO_TS: no chunks), kept by the store so a
        # query can tell, without touching chunk objects, whether the head alone covers a window.
        self.chunk_max_ts = np.full(rows, NO_TS, dtype=np.int64)

    def ensure_rows(self, n: int) -> None:
        have = len(self.count)
        if n <= have:
            return
        new = max(n, have + max(1024, have // 4))  # grow by a quarter: doubling wastes up to half
        self.ts = np.concatenate([self.ts, np.zeros((new - have, self.capacity), np.int64)])
        self.vals = np.concatenate([self.vals, np.zeros((new - have, self.capacity), np.float64)])
        self.count = np.concatenate([self.count, np.zeros(new - have, np.int32)])
        self.sealed = np.concatenate([self.sealed, np.zeros(new - have, np.int32)])
        self.last_ts = np.concatenate([self.last_ts, np.full(new - have, NO_TS, np.int64)])
        self.chunk_max_ts = np.concatenate([self.chunk_max_ts, np.full(new - have, NO_TS, np.int64)])

    def reset_row(self, row: int) -> None:
        self.count[row] = 0
        self.sealed[row] = 0
        self.last_ts[row] = NO_TS
        self.chunk_max_ts[row] = NO_TS

    def room(self, rows: np.ndarray) -> np.ndarray:
        return self.capacity - self.count[rows]

    def unsealed(self, row: int) -> tuple[np.ndarray, np.ndarray]:
        """Copies of the samples of ``row`` that are not yet in a chunk."""
        s, c = int(self.sealed[row]), int(self.count[row])
        return self.ts[row, s:c].copy(), self.vals[row, s:c].copy()

    def samples(self, row: int) -> tuple[np.ndarray, np.ndarray]:
        """Views of every sample in the row, sealed overlap included."""
        c = int(self.count[row])
        return self.ts[row, :c], self.vals[row, :c]

    def take_for_seal(self, row: int) -> tuple[np.ndarray, np.ndarray]:
        """Remove the unsealed samples for sealing into a chunk; keep the last ``keep`` as overlap."""
        ts, vals = self.unsealed(row)
        c = int(self.count[row])
        k = min(self.keep, c)
        self.ts[row, :k] = self.ts[row, c - k : c]
        self.vals[row, :k] = self.vals[row, c - k : c]
        self.count[row] = k
        self.sealed[row] = k
        return ts, vals

    def append_many(self, rows: np.ndarray, seg_counts: np.ndarray, ts: np.ndarray, vals: np.ndarray) -> None:
        """Append segment i (seg_counts[i] samples) to rows[i], for distinct rows with room.

        ``ts``/``vals`` hold the segments back to back. The caller guarantees each segment is
        newer than its row's last_ts and fits (``seg_counts <= room(rows)``).
        """
        if len(rows) == 0:
            return
        if bool(np.all(seg_counts == 1)):  # fast path: one sample per series (the agents' shape)
            pos = self.count[rows]
            self.ts[rows, pos] = ts
            self.vals[rows, pos] = vals
            self.count[rows] = pos + 1
            self.last_ts[rows] = ts
            return
        sample_rows = np.repeat(rows, seg_counts)
        starts = np.cumsum(seg_counts) - seg_counts
        offset = np.arange(len(ts)) - np.repeat(starts, seg_counts)
        pos = np.repeat(self.count[rows], seg_counts) + offset
        self.ts[sample_rows, pos] = ts
        self.vals[sample_rows, pos] = vals
        self.count[rows] += seg_counts.astype(np.int32)
        ends = starts + seg_counts - 1
        self.last_ts[rows] = ts[ends]

    def replace_row(self, row: int, ts: np.ndarray, vals: np.ndarray, sealed: int) -> None:
        """Set a row's whole content (out-of-order merges and recovery; the rare path)."""
        n = len(ts)
        if n > self.capacity:
            raise ValueError("row content exceeds head capacity")
        self.ts[row, :n] = ts
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
                assert int(self.last_ts[r]) >= int(self.ts[r, c - 1])
