"""The head: the newest raw samples of every series, a small ring per row in 2-D NumPy arrays.

Samples are compressed as they arrive (metricsd/store/chunks.py seals a block of ``capacity``
samples at a time); the ring keeps the newest ``capacity`` of them raw as well, so that the
short windows that autoscalers ask about (a rate over a minute, the last value over two) are
answered from a small matrix gather without decoding anything. The ring is a cache of what the
chunks hold, except for its ``unsealed`` newest samples, which are in no block yet.

     row r (capacity 8):  slot  0   1   2   3   4   5   6   7
                                s5  s6  s7  s8  s1  s2  s3  s4      pos[r] = 4: s1 is the oldest
                                             ^ newest    filled[r] = 8, unsealed[r] = 2 (s7, s8)

Timestamps are int32 milliseconds after a per-row ``base`` (int64): 12 bytes a sample, not 16.
A row spans at most OFFSET_MAX ms (24.8 days); the engine moves the base forward as the ring
turns (``rebase``) and takes a sample that would land past it on its slow path.
metricsd/store/FORMAT.md, "The head in memory", draws the layout.
"""

from __future__ import annotations

import numpy as np

__all__ = ["NO_TS", "OFFSET_MAX", "Head", "zero_grown"]

NO_TS = np.iinfo(np.int64).min
OFFSET_MAX = int(np.iinfo(np.int32).max)


def zero_grown(arr: np.ndarray, rows: int) -> np.ndarray:
    """``arr`` with ``rows`` rows, the new ones zero. Allocated zeroed (calloc: a large array is a
    fresh mapping whose pages the kernel supplies on first touch) and the old rows copied in, so
    the growth headroom of a per-series column costs no RSS until its rows are used; a
    concatenation with ``np.zeros`` wrote every page of it (at 200,000 series the rings' quarter
    of headroom was ~11 MiB resident)."""
    out = np.zeros((rows, *arr.shape[1:]), dtype=arr.dtype)
    out[: len(arr)] = arr
    return out


class Head:
    """Columnar ring buffers. Not safe for concurrent use; the store serialises access."""

    def __init__(self, capacity: int, rows: int = 64) -> None:
        if not 1 <= capacity <= 255:
            raise ValueError("the head keeps 1..255 samples a series")
        self.capacity = capacity
        self.ts = np.zeros((rows, capacity), dtype=np.int32)  # ms after base[row]
        self.vals = np.zeros((rows, capacity), dtype=np.float64)
        self.base = np.zeros(rows, dtype=np.int64)  # meaningful while filled[row] > 0
        self.pos = np.zeros(rows, dtype=np.int16)  # the slot the next sample goes to (capacity <= 255)
        self.filled = np.zeros(rows, dtype=np.int16)  # samples in the ring (<= capacity)
        self.unsealed = np.zeros(rows, dtype=np.int16)  # the newest ones that are in no block yet
        # Newest timestamp ever written to the row: the append fast path.
        self.last_ts = np.full(rows, NO_TS, dtype=np.int64)
        # A lower bound on what retention looks at in the row (its oldest chunk's newest sample,
        # or its oldest sample when it has no chunks); NO_TS: unknown. Kept by the store so a
        # retention pass visits only rows the cutoff has reached (store/retention.py).
        self.expiry_floor = np.full(rows, NO_TS, dtype=np.int64)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.ts, self.vals, self.base, self.pos, self.filled, self.unsealed,
                                      self.last_ts, self.expiry_floor))

    def ensure_rows(self, n: int) -> None:
        have = len(self.filled)
        if n <= have:
            return
        extra = max(n, have + max(1024, have // 4)) - have  # grow by a quarter: doubling wastes up to half
        self.ts, self.vals, self.base, self.pos, self.filled, self.unsealed = (
            zero_grown(a, have + extra) for a in (self.ts, self.vals, self.base, self.pos, self.filled, self.unsealed))
        self.last_ts = np.concatenate([self.last_ts, np.full(extra, NO_TS, np.int64)])
        self.expiry_floor = np.concatenate([self.expiry_floor, np.full(extra, NO_TS, np.int64)])

    def reset_row(self, row: int) -> None:
        self.clear(row)
        self.last_ts[row] = NO_TS
        self.expiry_floor[row] = NO_TS

    def clear(self, row: int) -> None:
        """Empty the ring (its newest timestamp stays): every sample must be in chunks already."""
        self.filled[row] = 0
        self.unsealed[row] = 0
        self.pos[row] = 0

    # --- positions -------------------------------------------------------------------------

    def slots(self, rows: np.ndarray, first: np.ndarray, width: int) -> np.ndarray:
        """Ring slots of logical positions first .. first + width - 1 of each row (0: its oldest
        sample), wrapped; positions past the row's samples are the caller's to mask."""
        start = self.pos[rows].astype(np.int64) - self.filled[rows] + first
        return (start[:, None] + np.arange(width)[None, :]) % self.capacity

    def newest(self, rows: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The newest ``width`` samples of each row (fewer when it has fewer), oldest first:
        (k x width int64 timestamps, k x width values, samples per row). Columns past a row's
        count hold other slots of its ring and are to be ignored."""
        rows = np.asarray(rows, dtype=np.int64)
        filled = self.filled[rows].astype(np.int64)
        cnt = np.minimum(filled, width)
        cols = self.slots(rows, filled - cnt, width)
        r = rows[:, None]
        return self.ts[r, cols].astype(np.int64) + self.base[rows][:, None], self.vals[r, cols], cnt

    def oldest_ts(self, rows: np.ndarray) -> np.ndarray:
        """The oldest timestamp in each row's ring (meaningless for an empty ring)."""
        rows = np.asarray(rows, dtype=np.int64)
        slot = (self.pos[rows].astype(np.int64) - self.filled[rows]) % self.capacity
        return self.ts[rows, slot].astype(np.int64) + self.base[rows]

    def samples(self, row: int) -> tuple[np.ndarray, np.ndarray]:
        """The ring's samples of ``row`` in time order (copies)."""
        n = int(self.filled[row])
        cols = self.slots(np.array([row]), np.zeros(1, np.int64), n)[0]
        return self.ts[row, cols].astype(np.int64) + self.base[row], self.vals[row, cols]

    def unsealed_samples(self, row: int) -> tuple[np.ndarray, np.ndarray]:
        """The samples of ``row`` that are in no block yet, oldest first (copies)."""
        t, v = self.samples(row)
        u = int(self.unsealed[row])
        return t[len(t) - u :], v[len(v) - u :]

    def rank(self, rows: np.ndarray, t: int) -> np.ndarray:
        """How many ring samples of each row are at or before ``t`` (ms): a binary search of every
        row at once, log2(capacity) rounds of one gathered element per row (the slot digests'
        statistics, metricsd/store/query.py: series_stats)."""
        rows = np.asarray(rows, dtype=np.int64)
        count = self.filled[rows].astype(np.int64)
        rel = t - self.base[rows]
        out = count.copy()
        if len(rows) == 0:
            return out
        cap = self.capacity
        first = self.pos[rows].astype(np.int64) - count  # slot of logical position 0, before wrapping
        flat = self.ts.reshape(-1)
        row_at = rows * cap

        def at(i: np.ndarray) -> np.ndarray:  # the timestamp offset at logical position i of each row
            return flat[row_at + (first + i) % cap]

        # Fast path: a query at the present has every sample of most rows at or before t.
        search = np.flatnonzero((count > 0) & (at(np.maximum(count, 1) - 1) > rel))
        if len(search) == 0:
            return out
        count, rel, first, row_at = count[search], rel[search], first[search], row_at[search]
        pos = np.zeros(len(search), dtype=np.int64)
        step = 1 << (int(cap).bit_length() - 1)
        while step:
            cand = np.minimum(pos + step, count)
            pos = np.where(at(cand - 1) <= rel, cand, pos)
            step >>= 1
        out[search] = pos
        return out

    # --- writes ----------------------------------------------------------------------------

    def write(self, rows: np.ndarray, counts: np.ndarray, starts: np.ndarray, ts: np.ndarray,
              vals: np.ndarray) -> None:
        """Push segment i (``counts[i]`` samples of ``ts``/``vals`` from ``starts[i]``) into the ring
        of distinct ``rows[i]``: only its newest ``capacity`` can stay. The caller has checked with
        ``fit`` that the ring's base reaches them, and keeps ``unsealed`` itself."""
        if len(rows) == 0:
            return
        cap = self.capacity
        counts = np.asarray(counts, dtype=np.int64)
        kept = np.minimum(counts, cap)
        first = starts + counts - kept  # the samples that can survive in the ring
        empty = (self.filled[rows] == 0) | (counts >= cap)
        if bool(empty.any()):
            self.base[rows[empty]] = ts[first[empty]]
        if bool((counts == 1).all()):  # one sample a series (the agents' shape)
            slot = self.pos[rows]
            self.ts[rows, slot] = ts[starts] - self.base[rows]
            self.vals[rows, slot] = vals[starts]
        else:
            sample_rows = np.repeat(rows, kept)
            offset = np.arange(int(kept.sum())) - np.repeat(np.cumsum(kept) - kept, kept)
            src = np.repeat(first, kept) + offset
            slot = (np.repeat(self.pos[rows].astype(np.int64) + counts - kept, kept) + offset) % cap
            self.ts[sample_rows, slot] = ts[src] - self.base[sample_rows]
            self.vals[sample_rows, slot] = vals[src]
        self.pos[rows] = (self.pos[rows].astype(np.int64) + counts) % cap
        self.filled[rows] = np.minimum(self.filled[rows].astype(np.int64) + counts, cap)
        self.last_ts[rows] = ts[starts + counts - 1]

    def fit(self, rows: np.ndarray, counts: np.ndarray, starts: np.ndarray, ts: np.ndarray) -> np.ndarray:
        """Before ``write``: move each row's base forward so that every sample its ring keeps
        afterwards is an int32 offset from it. Returns whether each row can take its segment; a
        row that cannot (the samples it would keep span more than OFFSET_MAX ms: a series written
        once in weeks) goes to the engine's slow path, untouched here."""
        rows = np.asarray(rows, dtype=np.int64)
        counts = np.asarray(counts, dtype=np.int64)
        newest = ts[starts + counts - 1]
        # Fast path: the base reaches the newest sample (every kept one lies between the two).
        quick = newest - self.base[rows] <= OFFSET_MAX
        quick &= self.filled[rows] > 0
        if bool(quick.all()):
            return quick
        ok = quick.copy()
        todo = np.flatnonzero(~quick)
        rows, counts, starts, newest = rows[todo], counts[todo], starts[todo], newest[todo]
        cap = self.capacity
        filled = self.filled[rows].astype(np.int64)
        n_old = np.clip(cap - counts, 0, filled)  # old samples the ring keeps
        oldest = ts[starts + counts - np.minimum(counts, cap)]
        has_old = np.flatnonzero(n_old > 0)
        if len(has_old):
            oldest[has_old] = self.ts_at(rows[has_old], filled[has_old] - n_old[has_old])
        fits = newest - oldest <= OFFSET_MAX
        ok[todo] = fits
        move = np.flatnonzero(fits & (n_old > 0))
        if len(move):
            rr = rows[move]
            shift = oldest[move] - self.base[rr]
            # samples older than the new base go negative: this write overwrites them
            shifted = self.ts[rr].astype(np.int64) - shift[:, None]
            self.ts[rr] = np.clip(shifted, np.iinfo(np.int32).min, OFFSET_MAX).astype(np.int32)
            self.base[rr] = oldest[move]
        return ok

    def ts_at(self, rows: np.ndarray, logical: np.ndarray) -> np.ndarray:
        """The timestamp at logical position ``logical`` (0: the oldest) of each row's ring."""
        slot = (self.pos[rows].astype(np.int64) - self.filled[rows] + logical) % self.capacity
        return self.ts[rows, slot].astype(np.int64) + self.base[rows]

    def replace_row(self, row: int, ts: np.ndarray, vals: np.ndarray, unsealed: int) -> None:
        """Set a row's ring to the newest ``capacity`` of ``ts``/``vals`` (recovery, merges; the rare
        path), the last ``unsealed`` of them in no block yet. Raises ValueError when they do not fit
        (more unsealed samples than the ring holds, or a span past OFFSET_MAX)."""
        keep = min(len(ts), self.capacity)
        ts, vals = ts[len(ts) - keep :], vals[len(vals) - keep :]
        if unsealed > keep:
            raise ValueError("more unsealed samples than the ring holds")
        if keep and int(ts[-1]) - int(ts[0]) > OFFSET_MAX:
            raise ValueError("ring content spans more than the head's offsets reach")
        if keep:
            self.base[row] = int(ts[0])
            self.ts[row, :keep] = np.asarray(ts, dtype=np.int64) - int(ts[0])
            self.vals[row, :keep] = vals
            self.last_ts[row] = max(int(self.last_ts[row]), int(ts[-1]))
        self.filled[row] = keep
        self.pos[row] = keep % self.capacity
        self.unsealed[row] = unsealed

    def _check(self, rows: int) -> None:
        for r in range(rows):
            f, u = int(self.filled[r]), int(self.unsealed[r])
            assert 0 <= u <= f <= self.capacity, f"row {r}: unsealed {u}, filled {f}"
            assert 0 <= int(self.pos[r]) < self.capacity
            t, _ = self.samples(r)
            if f > 1:
                assert bool(np.all(np.diff(t) > 0)), f"row {r} timestamps not increasing"
            if f:
                off = self.ts[r, self.slots(np.array([r]), np.zeros(1, np.int64), f)[0]]
                assert int(off.min()) >= 0, f"row {r} has a sample before its base"
                assert int(self.last_ts[r]) >= int(t[-1])
