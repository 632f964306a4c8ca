"""The head's columns and its reads: where each ring sample of a row is and what it holds.

metricsd/store/head.py describes the layout and writes it (``Head``); this module holds the columns
(``HeadRows``) and everything that only reads them: the timestamp and value of a ring slot, a row's
newest samples, its rank at a time. metricsd/store/FORMAT.md draws the layout.
"""

from __future__ import annotations

import numpy as np

__all__ = ["NO_TS", "OFFSET_MAX", "HeadRows", "flat_view", "zero_grown"]

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


def flat_view(a: np.ndarray) -> np.ndarray:
    """A C-contiguous matrix's elements as a 1-D view (raises AttributeError if that needed a copy, so
    a write through it can never be lost). The head scatters one sample a row through it at
    ``row * capacity + slot``: a 2-D fancy assignment of 8,000 (row, slot) pairs took ~2.5x as long
    as the 1-D one (perf/RESULTS.md, session 41 s41-24s)."""
    out = a.view()
    out.shape = (a.size,)
    return out


class HeadRows:
    """The head's columnar ring buffers and their reads. Not safe for concurrent use; the store
    serialises access."""

    def __init__(self, capacity: int, rows: int = 64) -> None:
        if not 1 <= capacity <= 255:
            raise ValueError("the head keeps 1..255 samples a series")
        self.capacity = capacity
        # The step a regular row may have: a row widened later must fit its ring in int32 offsets.
        self.step_max = OFFSET_MAX // max(capacity - 1, 1)
        # Values: a "flat" row (every ring sample the same float64 bits: a request, a limit, a
        # capacity) keeps one; a "varying" row's are in vals[varying[row] - 1], by slot.
        self.flat = np.zeros(rows, dtype=np.float64)  # flat row: the value of each of its ring samples
        self.varying = np.zeros(rows, dtype=np.int32)  # 0: flat; k: its values in vals[k - 1]
        self.vals = np.zeros((0, capacity), dtype=np.float64)
        self.n_varying = 0
        # regular row: its newest ring timestamp; wide row: what its wide_ts offsets are after
        self.base = np.zeros(rows, dtype=np.int64)  # meaningful while filled[row] > 0
        self.step = np.zeros(rows, dtype=np.int32)  # regular row: ms between its ring samples (filled >= 2)
        self.wide = np.zeros(rows, dtype=np.int32)  # 0: regular; k: wide, its timestamps in wide_ts[k - 1]
        self.wide_ts = np.zeros((0, capacity), dtype=np.int32)  # ms after base[row], by slot
        self.n_wide = 0
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
        return sum(a.nbytes for a in (self.flat, self.varying, self.vals, self.base, self.step, self.wide,
                                      self.wide_ts, self.pos, self.filled, self.unsealed, self.last_ts,
                                      self.expiry_floor))

    def ensure_rows(self, n: int) -> None:
        have = len(self.filled)
        if n <= have:
            return
        extra = max(n, have + max(1024, have // 4)) - have  # grow by a quarter: doubling wastes up to half
        self.flat, self.varying, self.base, self.step, self.wide, self.pos, self.filled, self.unsealed = (
            zero_grown(a, have + extra)
            for a in (self.flat, self.varying, self.base, self.step, self.wide, self.pos, self.filled, self.unsealed))
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

    # --- timestamps --------------------------------------------------------------------------

    def slot_ts(self, rows: np.ndarray, slots: np.ndarray) -> np.ndarray:
        """The int64 timestamps in ring ``slots`` (k, or k x width) of ``rows`` (k). A slot that
        holds no sample of its row gives a meaningless value, for the caller to mask."""
        rows = np.asarray(rows, dtype=np.int64)
        two = slots.ndim == 2

        def col(a: np.ndarray) -> np.ndarray:
            return a[:, None] if two else a

        age = (col(self.pos[rows].astype(np.int64) - 1) - slots) % self.capacity
        out = col(self.base[rows]) - col(self.step[rows].astype(np.int64)) * age
        if self.n_wide:
            w = self.wide[rows]
            some = np.flatnonzero(w)
            if len(some):
                wr = w[some].astype(np.int64) - 1
                out[some] = self.wide_ts[col(wr), slots[some]] + col(self.base[rows[some]])
        return out

    def slot_vals(self, rows: np.ndarray, slots: np.ndarray) -> np.ndarray:
        """The values in ring ``slots`` (k, or k x width) of ``rows`` (k), as ``slot_ts``."""
        rows = np.asarray(rows, dtype=np.int64)
        two = slots.ndim == 2
        if not self.n_varying:
            return np.broadcast_to(self.flat[rows][:, None] if two else self.flat[rows], slots.shape).copy()
        v = self.varying[rows].astype(np.int64) - 1
        if bool((v >= 0).all()):  # a question about counters or usage: every row varies
            return self.vals[v[:, None] if two else v, slots]
        out = np.broadcast_to(self.flat[rows][:, None] if two else self.flat[rows], slots.shape).copy()
        some = np.flatnonzero(v >= 0)
        if len(some):
            out[some] = self.vals[v[some][:, None] if two else v[some], slots[some]]
        return out

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
        return self.slot_ts(rows, cols), self.slot_vals(rows, cols), cnt

    def oldest_ts(self, rows: np.ndarray) -> np.ndarray:
        """The oldest timestamp in each row's ring (meaningless for an empty ring)."""
        rows = np.asarray(rows, dtype=np.int64)
        slot = (self.pos[rows].astype(np.int64) - self.filled[rows]) % self.capacity
        return self.slot_ts(rows, slot)

    def samples(self, row: int) -> tuple[np.ndarray, np.ndarray]:
        """The ring's samples of ``row`` in time order (copies)."""
        n = int(self.filled[row])
        rows = np.array([row], dtype=np.int64)
        cols = self.slots(rows, np.zeros(1, np.int64), n)
        return self.slot_ts(rows, cols)[0], self.slot_vals(rows, cols)[0]

    def unsealed_samples(self, row: int) -> tuple[np.ndarray, np.ndarray]:
        """The samples of ``row`` that are in no block yet, oldest first (copies)."""
        t, v = self.samples(row)
        u = int(self.unsealed[row])
        return t[len(t) - u :], v[len(v) - u :]

    def rank(self, rows: np.ndarray, t: int) -> np.ndarray:
        """How many ring samples of each row are at or before ``t`` (ms): a binary search of every
        row at once, log2(capacity) rounds of one timestamp per row (the slot digests'
        statistics, metricsd/store/query.py: series_stats)."""
        rows = np.asarray(rows, dtype=np.int64)
        count = self.filled[rows].astype(np.int64)
        out = count.copy()
        if len(rows) == 0:
            return out
        cap = self.capacity
        first = self.pos[rows].astype(np.int64) - count  # slot of logical position 0, before wrapping
        # Fast path: a query at the present has every sample of most rows at or before t.
        newest = self.slot_ts(rows, (first + np.maximum(count, 1) - 1) % cap)
        search = np.flatnonzero((count > 0) & (newest > t))
        if len(search) == 0:
            return out
        rows, count, first = rows[search], count[search], first[search]
        pos = np.zeros(len(search), dtype=np.int64)
        step = 1 << (int(cap).bit_length() - 1)
        while step:
            cand = np.minimum(pos + step, count)
            pos = np.where(self.slot_ts(rows, (first + cand - 1) % cap) <= t, cand, pos)
            step >>= 1
        out[search] = pos
        return out

    def ts_at(self, rows: np.ndarray, logical: np.ndarray) -> np.ndarray:
        """The timestamp at logical position ``logical`` (0: the oldest) of each row's ring."""
        rows = np.asarray(rows, dtype=np.int64)
        slot = (self.pos[rows].astype(np.int64) - self.filled[rows] + logical) % self.capacity
        return self.slot_ts(rows, slot)

    def _check(self, rows: int) -> None:
        for r in range(rows):
            f, u = int(self.filled[r]), int(self.unsealed[r])
            assert 0 <= u <= f <= self.capacity, f"row {r}: unsealed {u}, filled {f}"
            assert 0 <= int(self.pos[r]) < self.capacity
            t, _ = self.samples(r)
            if f > 1:
                assert bool(np.all(np.diff(t) > 0)), f"row {r} timestamps not increasing"
            if f and self.wide[r]:
                rr = np.array([r])
                off = self.wide_ts[int(self.wide[r]) - 1, self.slots(rr, np.zeros(1, np.int64), f)[0]]
                assert int(off.min()) >= 0, f"row {r} has a sample before its base"
            if f:
                assert int(self.last_ts[r]) >= int(t[-1])
