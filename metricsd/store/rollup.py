"""Hourly rollups per series: min, max, sum, count and last of each hour, kept for 8 days.

They feed the overcommit advisor's weekly peaks and the HPA's "same hour yesterday" fallback
long after raw samples are gone. The open hour of every series lives in NumPy columns and is
updated in bulk on each write. Closed hours are kept by hour, not by series: one block of
columns per hour (the rows that had samples in it, sorted, and their min, max, sum, last and
count), 40 bytes a series and hour with no Python object per series. Every closed hour is packed
into LZ4 frames of 1,024 rows (metricsd/store/rollpack.py, ~8.7 bytes a series and hour: a day of
them was 0.11 of a store's 1.28 bytes a sample): by the write that opens the next hour, or, for
hours restored from a snapshot, by the retention passes a budget at a time; the newest closed one
by the first retention pass after a minute in which no series closed a record into it. A read
decodes only the frames that hold its rows. A write that moves many series into a new hour closes
their previous hours with a few NumPy calls, retention drops whole hours, and a read of many
series gathers each hour's values for all of them at once.
NaN samples and stale markers are not folded in (a NaN would poison the sum).

Updates are folded per run of samples with the same (row, hour): ``reduceat`` over runs, then
one vectorised merge per "wave" (the k-th run of each row in the batch), so a batch that spans
an hour boundary costs two waves, not a loop per sample.
"""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass, field

import numpy as np

from metricsd.store import rollpack
from metricsd.store.head import zero_grown
from metricsd.store.rollpack import Packed

__all__ = ["HOUR_MS", "PACK_BUDGET", "HourBlock", "RollupPoints", "Rollups"]

HOUR_MS = 3_600_000
# Records one retention pass packs at most (~0.2 s): a store restored with a week of rollups of a
# million series packs them over the next hour or two instead of in one pass under the lock.
PACK_BUDGET = 2_000_000
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
    (``vals``, k x 4 float64) and count (int32); or, once the hour is older than the newest
    closed one, the same records in ``packed`` frames (metricsd/store/rollpack.py) and the three
    arrays empty. Rows closed since the block was last read wait in ``parts`` and are merged in on
    the next read (``settle``)."""

    hour: int
    rows: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    vals: np.ndarray = field(default_factory=lambda: np.zeros((0, 4)))
    count: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=list)
    packed: Packed | None = None
    closings: int = 0  # writes that closed records into this hour (Rollups.pack_old: is it quiet)

    def settle(self) -> None:
        if not self.parts:
            return
        prow = np.concatenate([p[0] for p in self.parts])
        pval = np.concatenate([p[1] for p in self.parts])
        pcnt = np.concatenate([p[2] for p in self.parts])
        self.parts = []
        lo, hi, rows, vals, count = self._open(prow)
        rows, vals, count = np.concatenate([rows, prow]), np.concatenate([vals, pval]), np.concatenate([count, pcnt])
        order = np.argsort(rows, kind="stable")
        self._put(lo, hi, rows[order], vals[order], count[order])

    def _open(self, rows: np.ndarray) -> tuple[int, int, np.ndarray, np.ndarray, np.ndarray]:
        """The records that could hold ``rows`` (a run of frames ``lo:hi`` when packed, else all),
        to change and hand back to ``_put``."""
        if self.packed is None:
            return 0, 0, self.rows, self.vals, self.count
        f = rollpack.frames_of(self.packed, rows)
        if len(f) == 0:
            return 0, 0, *rollpack.unpack(self.packed, f)
        lo, hi = int(f[0]), int(f[-1]) + 1
        return lo, hi, *rollpack.unpack(self.packed, np.arange(lo, hi))

    def _put(self, lo: int, hi: int, rows: np.ndarray, vals: np.ndarray, count: np.ndarray) -> None:
        if self.packed is None:
            self.rows, self.vals, self.count = rows, vals, count
        else:
            self.packed = rollpack.replace(self.packed, lo, hi, rows, vals, count)

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every record (rows increasing, vals, count), decoded if packed."""
        self.settle()
        if self.packed is None:
            return self.rows, self.vals, self.count
        return rollpack.unpack(self.packed)

    def lookup(self, want: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Of ``want`` (rows, any order): the positions that have a record here, and their vals
        and counts. Decodes only the frames that can hold them."""
        self.settle()
        if self.packed is not None:
            return rollpack.lookup(self.packed, want)
        rows, vals, count = self.rows, self.vals, self.count
        if len(rows) == 0 or len(want) == 0:
            return np.zeros(0, np.int64), np.zeros((0, 4)), np.zeros(0, np.int32)
        at = np.minimum(np.searchsorted(rows, want), len(rows) - 1)
        found = np.flatnonzero(rows[at] == want)
        return found, vals[at[found]], count[at[found]]

    def pack(self) -> None:
        """Keep the records in frames from now on (the hour is past the newest closed one)."""
        self.settle()
        if self.packed is None:
            self.packed = rollpack.pack(self.rows, self.vals, self.count)
            self.rows, self.vals, self.count = np.zeros(0, np.int32), np.zeros((0, 4)), np.zeros(0, np.int32)

    def drop_rows(self, rows: np.ndarray) -> None:
        """Forget the records of ``rows`` (sorted); re-encodes only the frames that held them."""
        self.settle()
        if self.packed is None:
            keep = ~np.isin(self.rows, rows)
            if not bool(keep.all()):
                self.rows, self.vals, self.count = self.rows[keep], self.vals[keep], self.count[keep]
            return
        for f in rollpack.frames_of(self.packed, rows).tolist()[::-1]:  # from the end: frame numbers stay valid
            r, v, c = rollpack.unpack(self.packed, np.array([f]))
            keep = ~np.isin(r, rows)
            if not bool(keep.all()):
                self.packed = rollpack.replace(self.packed, f, f + 1, r[keep], v[keep], c[keep])

    def __len__(self) -> int:
        return (len(self.rows) if self.packed is None else len(self.packed)) + sum(len(p[0]) for p in self.parts)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.rows, self.vals, self.count)) + sum(
            sum(a.nbytes for a in p) for p in self.parts) + (0 if self.packed is None else self.packed.nbytes)


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
        self.packing = True  # pack closed hours past the newest (off: tests' plain reference)
        self._hours: list[int] = []  # their starts, for bisect
        self._newest_seen: tuple[int, int] | None = None  # (hour, closings) of the newest plain block, last pass

    def ensure_rows(self, n: int) -> None:
        have = len(self.hour)
        if n <= have:
            return
        extra = max(n, have + max(1024, have // 4)) - have
        self.hour = np.concatenate([self.hour, np.full(extra, _NO_HOUR, np.int64)])
        self.min = np.concatenate([self.min, np.full(extra, np.inf)])
        self.max = np.concatenate([self.max, np.full(extra, -np.inf)])
        self.sum, self.count = zero_grown(self.sum, have + extra), zero_grown(self.count, have + extra)
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
        if bool(same.all()):  # every row in its open hour (a live write's, but once an hour): no selection
            self.min[rows] = np.minimum(self.min[rows], mn)
            self.max[rows] = np.maximum(self.max[rows], mx)
            with np.errstate(over="ignore", invalid="ignore"):
                self.sum[rows] += sm
            self.count[rows] += cnt
            self.last[rows] = last
            return
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
        had = len(self.blocks)
        for h in np.unique(hours).tolist():
            sel = hours == h
            block = self._block(int(h))
            block.parts.append((rows[sel].astype(np.int32), vals[sel], count[sel]))
            block.closings += 1
        if len(self.blocks) != had and self.packing:
            for block in self.blocks[-3:-1]:  # the hours just past the newest closed one: ~1 ms / 10,000
                if block.packed is None:
                    block.pack()

    def pack_old(self, budget: int) -> int:
        """Pack the closed hours but the newest that are still plain (restored from a snapshot, or
        made by an out-of-order sample), up to about ``budget`` records; the retention pass calls
        it, so a restart does not pay for packing and no pass stalls writes for long. The newest
        closed hour too, once no write closed a record into it between two calls (a minute apart
        in a store): every series has moved on to the next hour, so a late one that closes into
        it afterwards (re-encoding a frame) is rare. Plain, it held 40 bytes a series where
        packed holds ~9: 6 MiB at 200,000 series (perf/RESULTS.md, session 39). Returns the
        records packed."""
        done = 0
        for block in self.blocks[:-1]:
            if done >= budget or not self.packing:
                break
            if block.packed is None:
                done += len(block)
                block.pack()
        if self.blocks and self.packing and done < budget and self.blocks[-1].packed is None:
            newest = self.blocks[-1]
            seen = (newest.hour, newest.closings)
            if seen == self._newest_seen:
                done += len(newest)
                newest.pack()
            self._newest_seen = seen
        return done

    def _merge_closed(self, row: int, hour: int, mn: float, mx: float, sm: float, cnt: float) -> None:
        block = self._block(hour)
        block.settle()
        lo, hi, rows, vals, count = block._open(np.array([row]))
        i = int(np.searchsorted(rows, row))
        if i < len(rows) and int(rows[i]) == row:
            vals, count = vals.copy(), count.copy()
            v = vals[i]
            v[0] = min(v[0], mn)
            v[1] = max(v[1], mx)
            v[2] += sm
            count[i] += int(cnt)  # "last" stays: the closed hour already saw a later sample
        else:
            rows = np.insert(rows, i, row)
            vals = np.insert(vals, i, [mn, mx, sm, np.nan], axis=0)
            count = np.insert(count, i, int(cnt))
        block._put(lo, hi, rows, vals, count)

    def points_many(self, rows: np.ndarray, start_ms: int, end_ms: int) -> list[RollupPoints]:
        """The hours of each of ``rows`` whose start lies in [start_ms, end_ms], closed ones and the
        open one, oldest first: one searchsorted per hour for all rows at once."""
        rows = np.asarray(rows, dtype=np.int64)
        k = len(rows)
        lo = bisect.bisect_left(self._hours, start_ms)
        hi = bisect.bisect_right(self._hours, end_ms)
        parts: list[tuple[np.ndarray, int | np.ndarray, np.ndarray, np.ndarray]] = []
        for block in self.blocks[lo:hi]:
            found, bv, bc = block.lookup(rows)
            if len(found):
                parts.append((found, block.hour, bv, bc))
        cur = self.hour[rows]
        open_rows = np.flatnonzero((cur != _NO_HOUR) & (cur >= start_ms) & (cur <= end_ms))
        r = rows[open_rows]
        open_vals = np.stack([self.min[r], self.max[r], self.sum[r], self.last[r]], axis=1)
        if len(open_rows):
            parts.append((open_rows, cur[open_rows], open_vals, self.count[r]))
        # each row's points by row, then (blocks are in hour order, the open hour last) by hour: every
        # part's records go to the next free place of their rows, no sort of all the points
        if k and all(len(p[0]) == k for p in parts):  # every row in every hour: a k x hours matrix
            n = len(parts)
            hm = np.empty((k, n), np.int64)
            cm = np.empty((k, n))
            cols = np.empty((4, k, n))
            for j, (_, hr, bv, bc) in enumerate(parts):
                hm[:, j] = hr
                cm[:, j] = bc
                cols[:, :, j] = bv.T
            mn, mx, sm, la = cols
            return [RollupPoints(*p) for p in zip(hm, mn, mx, sm, cm, la, strict=True)]  # row views, made in C
        per_row = np.zeros(k, np.int64)
        for found, _, _, _ in parts:
            per_row[found] += 1
        bounds = np.zeros(k + 1, np.int64)
        np.cumsum(per_row, out=bounds[1:])
        total = int(bounds[-1])
        h = np.empty(total, np.int64)
        c = np.empty(total)
        cols = np.empty((4, total))
        nxt = bounds[:-1].copy()
        for found, hr, bv, bc in parts:
            if len(found) == k:  # every row has this hour (found is 0..k-1)
                pos = nxt.copy()
                nxt += 1
            else:
                pos = nxt[found]
                nxt[found] += 1
            h[pos] = hr
            c[pos] = bc
            cols[:, pos] = bv.T
        mn, mx, sm, la = cols
        b = bounds.tolist()
        return [RollupPoints(h[s:e], mn[s:e], mx[s:e], sm[s:e], c[s:e], la[s:e]) for s, e in itertools.pairwise(b)]

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
            brows, bvals, bcount = block.arrays()
            if len(rows) == 0 or len(brows) == 0:
                continue
            at = np.minimum(np.searchsorted(rows, brows), len(rows) - 1)
            keep = np.flatnonzero(rows[at] == brows)
            if len(keep) == 0:
                continue
            hours.append(block.hour)
            sizes.append(len(keep))
            new_rows.append(at[keep].astype(np.int32))
            vals.append(bvals[keep])
            counts.append(bcount[keep])
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
        rows = np.unique(np.asarray(rows, dtype=np.int64))
        if len(rows) == 0:
            return
        for block in self.blocks:
            block.drop_rows(rows)
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
            rows, vals, count = b.arrays()
            assert bool(np.all(np.diff(rows) > 0)), f"hour {b.hour}: rows not sorted or repeated"
            assert vals.shape == (len(rows), 4) and len(count) == len(rows)
            if b.packed is not None:
                assert len(b.rows) == 0 and list(b.packed.starts[:1]) == [0], f"hour {b.hour}: packed and plain"
                assert len(b.packed.row0) == len(b.packed.data) == len(b.packed.starts) - 1
