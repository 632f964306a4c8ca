"""Hourly rollups per series: min, max, sum, count and last of each hour, kept for 8 days.

They feed the overcommit advisor's weekly peaks and the HPA's "same hour yesterday" fallback
long after raw samples are gone. The open hour of every series lives in NumPy columns and is
updated in bulk on each write. Closed hours are kept by hour, not by series: one block of
columns per hour (the rows that had samples in it, sorted, and their min, max, sum, last and
count), 40 bytes a series and hour with no Python object per series. A write that moves many
series into a new hour closes their previous hours with a few NumPy calls, retention drops whole
hours, and a read of many series gathers each hour's values for all of them at once.
NaN samples and stale markers are not folded in (a NaN would poison the sum).

Updates are folded per run of samples with the same (row, hour): ``reduceat`` over runs, then
one vectorised merge per "wave" (the k-th run of each row in the batch), so a batch that spans
an hour boundary costs two waves, not a loop per sample.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

import numpy as np

__all__ = ["HOUR_MS", "HourBlock", "RollupPoints", "Rollups"]

HOUR_MS = 3_600_000
_NO_HOUR = np.iinfo(np.int64).min


@dataclass
class RollupPoints:
    """The hourly rollups of one series, oldest first; hour is the hour's start in ms."""

    hour: np.ndarray
    min: np.ndarray
    max: np.ndarray
    sum: np.ndarray
    count: np.ndarray
    last: np.ndarray


@dataclass
class HourBlock:
    """The closed rollups of one hour: ``rows`` sorted, and per row min, max, sum, last
    (``vals``, k x 4 float64) and count (int32). Rows closed since the block was last read wait in
    ``parts`` and are merged in on the next read (``settle``)."""

    hour: int
    rows: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    vals: np.ndarray = field(default_factory=lambda: np.zeros((0, 4)))
    count: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=list)

    def settle(self) -> None:
        if not self.parts:
            return
        rows = np.concatenate([self.rows, *(p[0] for p in self.parts)])
        vals = np.concatenate([self.vals, *(p[1] for p in self.parts)])
        count = np.concatenate([self.count, *(p[2] for p in self.parts)])
        self.parts = []
        order = np.argsort(rows, kind="stable")
        self.rows, self.vals, self.count = rows[order], vals[order], count[order]

    def __len__(self) -> int:
        return len(self.rows) + sum(len(p[0]) for p in self.parts)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.rows, self.vals, self.count)) + sum(
            sum(a.nbytes for a in p) for p in self.parts)


class Rollups:
    """Not safe for concurrent use; the store serialises access."""

    def __init__(self, rows: int = 64) -> None:
        self.hour = np.full(rows, _NO_HOUR, dtype=np.int64)
        self.min = np.full(rows, np.inf)
        self.max = np.full(rows, -np.inf)
        self.sum = np.zeros(rows)
        self.count = np.zeros(rows)
        self.last = np.full(rows, np.nan)
        self.blocks: list[HourBlock] = []  # closed hours, oldest first
        self._hours: list[int] = []  # their starts, for bisect

    def ensure_rows(self, n: int) -> None:
        have = len(self.hour)
        if n <= have:
            return
        extra = max(n, have + max(1024, have // 4)) - have
        self.hour = np.concatenate([self.hour, np.full(extra, _NO_HOUR, np.int64)])
        self.min = np.concatenate([self.min, np.full(extra, np.inf)])
        self.max = np.concatenate([self.max, np.full(extra, -np.inf)])
        self.sum = np.concatenate([self.sum, np.zeros(extra)])
        self.count = np.concatenate([self.count, np.zeros(extra)])
        self.last = np.concatenate([self.last, np.full(extra, np.nan)])

    def add(self, sample_rows: np.ndarray, ts: np.ndarray, vals: np.ndarray) -> None:
        """Fold samples in; within a row they must be in time order (out-of-order ones too)."""
        keep = ~np.isnan(vals)
        if not bool(keep.all()):
            sample_rows, ts, vals = sample_rows[keep], ts[keep], vals[keep]
        if len(ts) == 0:
            return
        hour = (ts // HOUR_MS) * HOUR_MS
        order = np.lexsort((ts, sample_rows))
        r, h, v = sample_rows[order], hour[order], vals[order]
        brk = np.ones(len(r), dtype=bool)
        brk[1:] = (r[1:] != r[:-1]) | (h[1:] != h[:-1])
        starts = np.flatnonzero(brk)
        ends = np.append(starts[1:], len(r)) - 1
        run_row, run_hour = r[starts], h[starts]
        run_min = np.minimum.reduceat(v, starts)
        run_max = np.maximum.reduceat(v, starts)
        with np.errstate(over="ignore", invalid="ignore"):  # sums of values near 1e308 become inf, as in PromQL
            run_sum = np.add.reduceat(v, starts)
        run_cnt = (ends - starts + 1).astype(np.float64)
        run_last = v[ends]
        # k-th run of each row: rows change less often than runs
        first_of_row = np.ones(len(run_row), dtype=bool)
        first_of_row[1:] = run_row[1:] != run_row[:-1]
        row_start = np.maximum.accumulate(np.where(first_of_row, np.arange(len(run_row)), 0))
        wave = np.arange(len(run_row)) - row_start
        for k in range(int(wave.max()) + 1):
            sel = wave == k
            self._merge(run_row[sel], run_hour[sel], run_min[sel], run_max[sel], run_sum[sel], run_cnt[sel],
                        run_last[sel])

    def add_one_each(self, rows: np.ndarray, ts: np.ndarray, vals: np.ndarray) -> None:
        """Fast path for one sample per distinct row (the agents' shape): no sorting into runs."""
        keep = ~np.isnan(vals)
        if not bool(keep.all()):
            rows, ts, vals = rows[keep], ts[keep], vals[keep]
        if len(ts):
            self._merge(rows, (ts // HOUR_MS) * HOUR_MS, vals, vals, vals, np.ones(len(vals)), vals)

    def _merge(self, rows: np.ndarray, hours: np.ndarray, mn: np.ndarray, mx: np.ndarray, sm: np.ndarray,
               cnt: np.ndarray, last: np.ndarray) -> None:
        cur = self.hour[rows]
        same = hours == cur
        if bool(same.any()):
            rs = rows[same]
            self.min[rs] = np.minimum(self.min[rs], mn[same])
            self.max[rs] = np.maximum(self.max[rs], mx[same])
            with np.errstate(over="ignore", invalid="ignore"):
                self.sum[rs] += sm[same]
            self.count[rs] += cnt[same]
            self.last[rs] = last[same]
        newer = hours > cur
        if bool(newer.any()):
            rn = rows[newer]
            self._close(rn[self.hour[rn] != _NO_HOUR])
            self.hour[rn] = hours[newer]
            self.min[rn], self.max[rn], self.sum[rn] = mn[newer], mx[newer], sm[newer]
            self.count[rn], self.last[rn] = cnt[newer], last[newer]
        older = hours < cur
        for i in np.flatnonzero(older).tolist():  # out-of-order into a closed hour: rare
            self._merge_closed(int(rows[i]), int(hours[i]), float(mn[i]), float(mx[i]), float(sm[i]),
                               float(cnt[i]))

    def _block(self, hour: int) -> HourBlock:
        """The block of ``hour``, made if missing."""
        i = bisect.bisect_left(self._hours, hour)
        if i < len(self._hours) and self._hours[i] == hour:
            return self.blocks[i]
        block = HourBlock(hour)
        self._hours.insert(i, hour)
        self.blocks.insert(i, block)
        return block

    def _close(self, rows: np.ndarray) -> None:
        """Move the open hours of distinct ``rows`` into their hours' blocks (a few NumPy calls per
        distinct hour: the series of a write usually close the same one)."""
        if len(rows) == 0:
            return
        hours = self.hour[rows]
        vals = np.stack([self.min[rows], self.max[rows], self.sum[rows], self.last[rows]], axis=1)
        count = self.count[rows].astype(np.int32)
        for h in np.unique(hours).tolist():
            sel = hours == h
            self._block(int(h)).parts.append((rows[sel].astype(np.int32), vals[sel], count[sel]))

    def _merge_closed(self, row: int, hour: int, mn: float, mx: float, sm: float, cnt: float) -> None:
        block = self._block(hour)
        block.settle()
        i = int(np.searchsorted(block.rows, row))
        if i < len(block.rows) and int(block.rows[i]) == row:
            v = block.vals[i]
            v[0] = min(v[0], mn)
            v[1] = max(v[1], mx)
            v[2] += sm
            block.count[i] += int(cnt)
            return  # "last" stays: the closed hour already saw a later sample
        block.rows = np.insert(block.rows, i, row)
        block.vals = np.insert(block.vals, i, [mn, mx, sm, np.nan], axis=0)
        block.count = np.insert(block.count, i, int(cnt))

    def points_many(self, rows: np.ndarray, start_ms: int, end_ms: int) -> list[RollupPoints]:
        """The hours of each of ``rows`` whose start lies in [start_ms, end_ms], closed ones and the
        open one, oldest first: one searchsorted per hour for all rows at once."""
        rows = np.asarray(rows, dtype=np.int64)
        k = len(rows)
        lo = bisect.bisect_left(self._hours, start_ms)
        hi = bisect.bisect_right(self._hours, end_ms)
        who: list[np.ndarray] = []
        hour: list[np.ndarray] = []
        vals: list[np.ndarray] = []
        cnt: list[np.ndarray] = []
        for block in self.blocks[lo:hi]:
            block.settle()
            if len(block.rows) == 0 or k == 0:
                continue
            at = np.minimum(np.searchsorted(block.rows, rows), len(block.rows) - 1)
            found = np.flatnonzero(block.rows[at] == rows)
            who.append(found)
            hour.append(np.full(len(found), block.hour, np.int64))
            vals.append(block.vals[at[found]])
            cnt.append(block.count[at[found]].astype(np.float64))
        cur = self.hour[rows]
        open_rows = np.flatnonzero((cur != _NO_HOUR) & (cur >= start_ms) & (cur <= end_ms))
        r = rows[open_rows]
        who.append(open_rows)
        hour.append(cur[open_rows])
        vals.append(np.stack([self.min[r], self.max[r], self.sum[r], self.last[r]], axis=1))
        cnt.append(self.count[r])
        w = np.concatenate(who)
        order = np.argsort(w, kind="stable")  # by row, then (blocks were in hour order) by hour
        w = w[order]
        h, v, c = np.concatenate(hour)[order], np.concatenate(vals)[order], np.concatenate(cnt)[order]
        bounds = np.searchsorted(w, np.arange(k + 1))
        out = []
        for i in range(k):
            s, e = int(bounds[i]), int(bounds[i + 1])
            out.append(RollupPoints(h[s:e], v[s:e, 0], v[s:e, 1], v[s:e, 2], c[s:e], v[s:e, 3]))
        return out

    def points(self, row: int, start_ms: int, end_ms: int) -> RollupPoints:
        """Hours whose start lies in [start_ms, end_ms], closed ones and the open one."""
        return self.points_many(np.array([row]), start_ms, end_ms)[0]

    def restore_closed(self, hours: np.ndarray, sizes: np.ndarray, rows: np.ndarray, vals: np.ndarray,
                       count: np.ndarray) -> None:
        """Closed hours as a snapshot holds them: hour blocks, oldest first, ``sizes[i]`` records
        each (rows sorted within a block)."""
        ends = np.cumsum(sizes)
        vals = np.asarray(vals).reshape(-1, 4)
        for h, s, e in zip(hours.tolist(), (ends - sizes).tolist(), ends.tolist(), strict=True):
            block = self._block(int(h))
            block.rows = rows[s:e].astype(np.int32)
            block.vals = vals[s:e].copy()
            block.count = count[s:e].astype(np.int32)

    def closed_of(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The closed hours of ``rows`` (sorted), renumbered 0..len(rows)-1 as in a snapshot: per
        block its hour and number of records, then every record's new row, values and count."""
        rows = np.asarray(rows, dtype=np.int64)
        hours, sizes, new_rows, vals, counts = [], [], [], [], []
        for block in self.blocks:
            block.settle()
            if len(rows) == 0 or len(block.rows) == 0:
                continue
            at = np.minimum(np.searchsorted(rows, block.rows), len(rows) - 1)
            keep = np.flatnonzero(rows[at] == block.rows)
            if len(keep) == 0:
                continue
            hours.append(block.hour)
            sizes.append(len(keep))
            new_rows.append(at[keep].astype(np.int32))
            vals.append(block.vals[keep])
            counts.append(block.count[keep])
        cat = np.concatenate
        return (np.array(hours, np.int64), np.array(sizes, np.int64),
                cat(new_rows) if new_rows else np.zeros(0, np.int32),
                cat(vals).reshape(-1) if vals else np.zeros(0), cat(counts) if counts else np.zeros(0, np.int32))

    def drop_before(self, cutoff_ms: int) -> None:
        """Drop the closed hours that ended at or before the cutoff."""
        n = bisect.bisect_right(self._hours, cutoff_ms - HOUR_MS)
        if n:
            del self.blocks[:n]
            del self._hours[:n]

    def forget(self, rows: np.ndarray) -> None:
        """Forget the rollups of removed series (retention), every hour at once."""
        rows = np.asarray(rows, dtype=np.int64)
        if len(rows) == 0:
            return
        for block in self.blocks:
            block.settle()
            keep = ~np.isin(block.rows, rows)
            if not bool(keep.all()):
                block.rows, block.vals, block.count = block.rows[keep], block.vals[keep], block.count[keep]
        self.hour[rows] = _NO_HOUR

    def n_buckets(self) -> int:
        return sum(len(b) for b in self.blocks) + int(np.count_nonzero(self.hour != _NO_HOUR))

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.blocks) + sum(a.nbytes for a in (self.hour, self.min, self.max, self.sum,
                                                                            self.count, self.last))

    def _check(self) -> None:
        assert self._hours == [b.hour for b in self.blocks] == sorted(set(self._hours)), "hour blocks out of order"
        for b in self.blocks:
            b.settle()
            assert bool(np.all(np.diff(b.rows) > 0)), f"hour {b.hour}: rows not sorted or repeated"
            assert b.vals.shape == (len(b.rows), 4) and len(b.count) == len(b.rows)
