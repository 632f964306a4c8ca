"""A table keyed by series id, for the send path's per-series state (the watermark, the buffer's
record of which series' labels a segment holds, a sender's series).

An open-addressing hash table in NumPy arrays: a batch's lookups are a few vectorised probes
(a series id's home row is a multiplicative hash of it; linear probing on collision), never a
Python step per series. The table is at most a quarter full, so nine ids in ten are found at
their home row and the others in the next few rows, read at once: about one memory access per
id, where a binary search over sorted ids took about 17 dependent ones (on the shared, loaded
machine those cache misses made the lookups the send path's largest steady cost,
perf/RESULTS.md). A row keeps its place until the table grows or ``keep`` drops rows, so columns
are plain arrays indexed by row. Not thread-safe.
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
    with their default: the value of a row before an id takes it). Columns are indexed by row;
    ``rows()`` lists the rows in use. Rows found stay valid while ``version`` stays the same."""

    def __init__(self, **defaults: int) -> None:
        self.defaults = defaults
        self._reset(_MIN_BITS)

    def _reset(self, bits: int) -> None:
        self.version = getattr(self, "version", -1) + 1  # rows found before a reset are stale
        self._bits = bits
        self._keys = np.zeros(1 << bits, np.uint64)
        self._used = np.zeros(1 << bits, bool)
        self.cols = {name: np.full(1 << bits, d, np.int64) for name, d in self.defaults.items()}
        self._n = 0
        self._memo: dict[bytes, np.ndarray] = {}  # find's answers for batches of ids, until rows move

    def __len__(self) -> int:
        return self._n

    @property
    def ids(self) -> np.ndarray:
        """The ids in the table, in row order."""
        return self._keys[self._used]

    def rows(self) -> np.ndarray:
        return np.flatnonzero(self._used)

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
        pos = self._home(ids)
        hit = self._keys[pos] == ids  # fast path: nine in ten ids sit at their home row
        if not bool(ids.all()):  # an unused row's key is 0 too
            hit &= self._used[pos]
        out = np.where(hit, pos, -1)
        if bool(hit.all()):
            return out
        # The others: the next _WINDOW rows at once. An id is at the first row holding it, if no
        # unused row (which ends a probe) comes before; past the window (rare), row by row.
        miss = np.flatnonzero(~hit)
        miss = miss[self._used[pos[miss]]]  # an unused home row: not in the table
        mask = (1 << self._bits) - 1
        rows = (pos[miss, None] + np.arange(1, _WINDOW + 1)) & mask
        used = self._used[rows]
        match = used & (self._keys[rows] == ids[miss, None])
        first_match = np.where(match.any(axis=1), match.argmax(axis=1), _WINDOW)
        first_gap = np.where(used.all(axis=1), _WINDOW, (~used).argmax(axis=1))
        found = first_match < first_gap
        out[miss[found]] = rows[found, first_match[found]]
        go = ~found & (first_gap == _WINDOW)
        idx, at = miss[go], rows[go, -1]
        while len(idx):
            at = (at + 1) & mask
            used_at = self._used[at]
            got = used_at & (self._keys[at] == ids[idx])
            out[idx[got]] = at[got]
            go = used_at & ~got
            idx, at = idx[go], at[go]
        return out

    def add(self, ids: np.ndarray) -> np.ndarray:
        """Add the ids not in the table yet (each once, with the defaults); returns every id's row."""
        ids = np.asarray(ids, np.uint64)
        rows = self.find(ids)
        if bool((rows >= 0).all()):
            return rows
        new = np.unique(ids[rows < 0])
        if 4 * (self._n + len(new)) > (1 << self._bits):
            self._grow(self._n + len(new))
        self._place(new, {})
        return self.find(ids)

    def _place(self, ids: np.ndarray, values: dict[str, np.ndarray]) -> None:
        """Put ids that are not in the table in free rows (their column values from ``values``)."""
        mask = (1 << self._bits) - 1
        idx, pos = np.arange(len(ids)), self._home(ids)
        while len(idx):
            free = ~self._used[pos]
            # Of the ids whose row is free, the first for each row takes it; the others probe on.
            cand = np.flatnonzero(free)
            _, first = np.unique(pos[cand], return_index=True)
            won = cand[first]
            rows = pos[won]
            self._used[rows] = True
            self._keys[rows] = ids[idx[won]]
            for name, v in values.items():
                self.cols[name][rows] = v[idx[won]]
            lost = np.ones(len(idx), bool)
            lost[won] = False  # every row a loser tried is in use now: all probe on
            idx, pos = idx[lost], (pos[lost] + 1) & mask
        self._n += len(ids)

    def _grow(self, n: int) -> None:
        bits = self._bits
        while 4 * n > (1 << bits):
            bits += 1
        self._rebuild(self._used, bits)

    def _rebuild(self, keep: np.ndarray, bits: int) -> None:
        ids = self._keys[keep]
        values = {name: col[keep] for name, col in self.cols.items()}
        self._reset(bits)
        self._place(ids, values)

    def keep(self, mask: np.ndarray) -> np.ndarray:
        """Keep the rows in use where ``mask`` (one bool per row) is true; returns the ids dropped.
        Rows move: look ids up again after."""
        mask = mask & self._used
        dropped = self._keys[self._used & ~mask]
        if len(dropped):
            bits = _MIN_BITS
            while 4 * int(mask.sum()) > (1 << bits):
                bits += 1
            self._rebuild(mask, bits)
        return dropped
