"""Hourly rollups per series: min, max, sum, count and last of each hour, kept for 8 days.

They feed the overcommit advisor's weekly peaks and the HPA's "same hour yesterday" fallback
long after raw samples are gone. The open hour of every series lives in NumPy columns and is
updated in bulk on each write; a closed hour moves to the series' history (6 float64 per hour).
NaN samples and stale markers are not folded in (a NaN would poison the sum).

Updates are folded per run of samples with the same (row, hour): ``reduceat`` over runs, then
one vectorised merge per "wave" (the k-th run of each row in the batch), so a batch that spans
an hour boundary costs two waves, not a loop per sample.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass

import numpy as np

__all__ = ["HOUR_MS", "RollupPoints", "Rollups"]

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


class Rollups:
    """Not safe for concurrent use; the store serialises access."""

    def __init__(self, rows: int = 64) -> None:
        self.hour = np.full(rows, _NO_HOUR, dtype=np.int64)
        self.min = np.full(rows, np.inf)
        self.max = np.full(rows, -np.inf)
        self.sum = np.zeros(rows)
        self.count = np.zeros(rows)
        self.last = np.full(rows, np.nan)
        self.closed: dict[int, array] = {}  # row -> flat (hour, min, max, sum, count, last)*
        # A lower bound on every closed hour's start: drop_before returns at once while the cutoff
        # has not reached it, instead of visiting every series' history each retention pass.
        self._closed_floor = math.inf

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
            for row in rn[self.hour[rn] != _NO_HOUR].tolist():
                self._close(row)
            self.hour[rn] = hours[newer]
            self.min[rn], self.max[rn], self.sum[rn] = mn[newer], mx[newer], sm[newer]
            self.count[rn], self.last[rn] = cnt[newer], last[newer]
        older = hours < cur
        for i in np.flatnonzero(older).tolist():  # out-of-order into a closed hour: rare
            self._merge_closed(int(rows[i]), int(hours[i]), float(mn[i]), float(mx[i]), float(sm[i]),
                               float(cnt[i]))

    def _close(self, row: int) -> None:
        self._closed_floor = min(self._closed_floor, float(self.hour[row]))
        buf = self.closed.setdefault(row, array("d"))
        buf.extend((float(self.hour[row]), self.min[row], self.max[row], self.sum[row], self.count[row],
                    self.last[row]))

    def _merge_closed(self, row: int, hour: int, mn: float, mx: float, sm: float, cnt: float) -> None:
        self._closed_floor = min(self._closed_floor, float(hour))
        buf = self.closed.setdefault(row, array("d"))
        hours = [int(buf[i]) for i in range(0, len(buf), 6)]
        if hour in hours:
            i = 6 * hours.index(hour)
            buf[i + 1] = min(buf[i + 1], mn)
            buf[i + 2] = max(buf[i + 2], mx)
            buf[i + 3] += sm
            buf[i + 4] += cnt
            return  # "last" stays: the closed hour already saw a later sample
        pos = sum(1 for h in hours if h < hour)
        recs = [buf[i : i + 6] for i in range(0, len(buf), 6)]
        recs.insert(pos, array("d", (float(hour), mn, mx, sm, cnt, np.nan)))
        self.closed[row] = array("d", [x for rec in recs for x in rec])

    def points(self, row: int, start_ms: int, end_ms: int) -> RollupPoints:
        """Hours whose start lies in [start_ms, end_ms], closed ones and the open one."""
        buf = self.closed.get(row)
        flat = np.frombuffer(buf, dtype=np.float64).reshape(-1, 6) if buf else np.zeros((0, 6))
        if self.hour[row] != _NO_HOUR:
            cur = np.array([[self.hour[row], self.min[row], self.max[row], self.sum[row], self.count[row],
                             self.last[row]]])
            flat = np.concatenate([flat, cur])
        hours = flat[:, 0].astype(np.int64)
        sel = (hours >= start_ms) & (hours <= end_ms)
        f = flat[sel]
        return RollupPoints(hours[sel], f[:, 1], f[:, 2], f[:, 3], f[:, 4], f[:, 5])

    def set_closed(self, row: int, buf: array) -> None:
        """A series' closed hours as a snapshot holds them (oldest first)."""
        self.closed[row] = buf
        if buf:
            self._closed_floor = min(self._closed_floor, buf[0])

    def drop_before(self, cutoff_ms: int) -> None:
        if self._closed_floor >= cutoff_ms - HOUR_MS:
            return
        floor = math.inf
        for row, buf in list(self.closed.items()):
            if buf and buf[0] < cutoff_ms - HOUR_MS:
                flat = np.frombuffer(buf, dtype=np.float64).reshape(-1, 6)
                keep = flat[flat[:, 0] + HOUR_MS > cutoff_ms]
                if len(keep):
                    buf = self.closed[row] = array("d", keep.ravel().tolist())
                else:
                    del self.closed[row]
                    continue
            if buf:
                floor = min(floor, buf[0])
        self._closed_floor = floor

    def _check(self) -> None:
        assert all(self._closed_floor <= buf[0] for buf in self.closed.values() if buf), "closed floor"

    def forget(self, row: int) -> None:
        self.closed.pop(row, None)
        self.hour[row] = _NO_HOUR

    def n_buckets(self) -> int:
        return sum(len(b) // 6 for b in self.closed.values()) + int(np.count_nonzero(self.hour != _NO_HOUR))
