"""A table keyed by series id, for the send path's per-series state (the watermark, the buffer's
record of which series' labels a segment holds, a sender's series).

An open-addressing hash table in NumPy arrays: a batch's lookups are a few vectorised probes
(a series id's home row is a multiplicative hash of it; linear probing on collision), never a
Python step per series. The table is at most a quarter full, so nine ids in ten are found at
their home row and the others in the next few rows, read at once: about one memory access per
id, where a binary search over sorted ids took about 17 dependent ones (on the shared, loaded
machine those cache misses made the lookups the send path's largest steady cost,
perf/RESULTS.md).

Rows are dense: the hash table maps an id to its row, and an id's row is the number of ids added
before it, so the columns are compact arrays (80,000 series: 640 KB a column, where columns laid
out as the hash table, four times as long, missed the cache on most of a batch's lookups: 2026-11-27
session 34, perf/RESULTS.md) and the series a client sends together sit side by side. A row keeps
its place until ``keep`` drops rows (growing the hash table does not move rows). Not thread-safe.
"""

from __future__ import annotations

import numpy as np

__all__ = ["IdTable"]

_MIX = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing: spreads ids that are not hashes too
_MIN_BITS = 6
_WINDOW = 8  # rows after the home row that a lookup reads at once
_MEMO_MIN = 256  # batches of at least this many ids have their rows kept ...
_MEMO_BATCHES = 512  # ... this many batches at most (about 16 MB at 2,000 ids a batch)


class IdTable:
    """Series ids and, per id, one int64 value in each column of ``cols`` (named at construction
    with their default: the value of a row before an id takes it). Columns are indexed by row and
    may be longer than ``len(self)``; ``rows()`` lists the rows in use (``0 .. len - 1``). Rows
    found stay valid while ``version`` stays the same."""

    def __init__(self, **defaults: int) -> None:
        self.defaults = defaults
        self.version = -1
        self._reset(_MIN_BITS, np.zeros(0, np.uint64), {})

    def _reset(self, bits: int, ids: np.ndarray, values: dict[str, np.ndarray]) -> None:
        """The table of ``ids`` (distinct) in rows 0, 1, ..., with their column values."""
        self.version += 1  # rows found before a reset are stale
        n = len(ids)
        cap = max(64, 2 * n)
        self._ids = np.zeros(cap, np.uint64)
        self._ids[:n] = ids
        self.cols = {}
        for name, d in self.defaults.items():
            col = np.full(cap, d, np.int64)
            if name in values:
                col[:n] = values[name]
            self.cols[name] = col
        self._n = n
        self._memo: dict[bytes, np.ndarray] = {}  # find's answers for batches of ids, until rows move
        self._rehash(bits)

    def _rehash(self, bits: int) -> None:
        self._bits = bits
        self._hkeys = np.zeros(1 << bits, np.uint64)
        self._hrow = np.full(1 << bits, -1, np.int64)  # per hash position, its id's row (-1: free)
        self._place(np.arange(self._n))

    def __len__(self) -> int:
        return self._n

    @property
    def ids(self) -> np.ndarray:
        """The ids in the table, in row order."""
        return self._ids[: self._n]

    def rows(self) -> np.ndarray:
        return np.arange(self._n)

    def _home(self, ids: np.ndarray) -> np.ndarray:
        return ((ids * _MIX) >> np.uint64(64 - self._bits)).astype(np.int64)

    def find(self, ids: np.ndarray) -> np.ndarray:
        """Each id's row (int64, read-only), -1 for an id not in the table."""
        ids = np.asarray(ids, np.uint64)
        if not self._n:
            return np.full(len(ids), -1, np.int64)
        if len(ids) < _MEMO_MIN:
            return self._find(ids)
        # Batches repeat: a client sends each series in the same request every interval, so the
        # rows of a batch's ids are kept (keyed by the ids' bytes) until rows move.
        key = ids.tobytes()
        rows = self._memo.get(key)
        if rows is None:
            rows = self._find(ids)
            rows.setflags(write=False)
            if bool((rows >= 0).all()):  # an id added later would not be in it
                if len(self._memo) >= _MEMO_BATCHES:
                    self._memo.clear()
                self._memo[key] = rows
        return rows

    def _find(self, ids: np.ndarray) -> np.ndarray:
        """Each id's row: its hash position's row where the key matches (-1: none)."""
        pos = self._home(ids)
        hrow = self._hrow[pos]
        hit = (self._hkeys[pos] == ids) & (hrow >= 0)  # fast path: nine in ten ids sit at their home position
        out = np.where(hit, hrow, -1)
        if bool(hit.all()):
            return out
        # The others: the next _WINDOW positions at once. An id is at the first position holding
        # it, if no free position (which ends a probe) comes before; past the window (rare), one by one.
        miss = np.flatnonzero(~hit)
        miss = miss[hrow[miss] >= 0]  # a free home position: not in the table
        mask = (1 << self._bits) - 1
        at = (pos[miss, None] + np.arange(1, _WINDOW + 1)) & mask
        rows = self._hrow[at]
        used = rows >= 0
        match = used & (self._hkeys[at] == ids[miss, None])
        first_match = np.where(match.any(axis=1), match.argmax(axis=1), _WINDOW)
        first_gap = np.where(used.all(axis=1), _WINDOW, (~used).argmax(axis=1))
        found = first_match < first_gap
        out[miss[found]] = rows[found, first_match[found]]
        go = ~found & (first_gap == _WINDOW)
        idx, p = miss[go], at[go, -1]
        while len(idx):
            p = (p + 1) & mask
            row_at = self._hrow[p]
            got = (row_at >= 0) & (self._hkeys[p] == ids[idx])
            out[idx[got]] = row_at[got]
            go = (row_at >= 0) & ~got
            idx, p = idx[go], p[go]
        return out

    def add(self, ids: np.ndarray) -> np.ndarray:
        """Add the ids not in the table yet (each once, with the defaults, in the order they first
        come in ``ids``); returns every id's row."""
        ids = np.asarray(ids, np.uint64)
        rows = self.find(ids)
        if bool((rows >= 0).all()):
            return rows
        missing = ids[rows < 0]
        _, first = np.unique(missing, return_index=True)
        new = missing[np.sort(first)]
        n, k = self._n, len(new)
        if n + k > len(self._ids):
            cap = max(2 * len(self._ids), n + k)
            self._ids = _grown(self._ids, cap, 0)
            self.cols = {name: _grown(col, cap, self.defaults[name]) for name, col in self.cols.items()}
        self._ids[n:n + k] = new
        self._n = n + k
        if 4 * self._n > (1 << self._bits):
            bits = self._bits
            while 4 * self._n > (1 << bits):
                bits += 1
            self._rehash(bits)  # rows stay where they are
        else:
            self._place(np.arange(n, n + k))
        return self.find(ids)

    def _place(self, rows: np.ndarray) -> None:
        """Put the ids of ``rows`` (not in the hash table yet) at free hash positions."""
        mask = (1 << self._bits) - 1
        ids = self._ids[rows]
        idx, pos = np.arange(len(rows)), self._home(ids)
        while len(idx):
            free = self._hrow[pos] < 0
            # Of the ids whose position is free, the first for each position takes it; the others probe on.
            cand = np.flatnonzero(free)
            _, first = np.unique(pos[cand], return_index=True)
            won = cand[first]
            at = pos[won]
            self._hrow[at] = rows[idx[won]]
            self._hkeys[at] = ids[idx[won]]
            lost = np.ones(len(idx), bool)
            lost[won] = False  # every position a loser tried is taken now: all probe on
            idx, pos = idx[lost], (pos[lost] + 1) & mask

    def keep(self, mask: np.ndarray) -> np.ndarray:
        """Keep the rows where ``mask`` (one bool per row: its first ``len(self)`` are read) is
        true; returns the ids dropped. Rows move: look ids up again after."""
        mask = np.asarray(mask[: self._n], bool)
        dropped = self._ids[: self._n][~mask]
        if len(dropped):
            kept = np.flatnonzero(mask)
            bits = _MIN_BITS
            while 4 * len(kept) > (1 << bits):
                bits += 1
            self._reset(bits, self._ids[kept], {name: col[kept] for name, col in self.cols.items()})
        return dropped


def _grown(a: np.ndarray, cap: int, fill: int) -> np.ndarray:
    out = np.full(cap, fill, a.dtype)
    out[: len(a)] = a
    return out
