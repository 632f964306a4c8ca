"""Aggregates pushed down into a store: select, reduce per series, fold per group.

The hot path (a short window over thousands of series) gathers only the newest samples of each
series' ring in the head into a small matrix and reduces it in one vectorised pass; only series
whose window reaches past their ring decode chunks. Group labels come from the index's label codes, so no
Python work is done per series.
"""

from __future__ import annotations

import numpy as np

from metricsd.maths.partials import AcrossFn, finalize, group_partials, quantile_across
from metricsd.maths.select import requested, select_groups
from metricsd.maths.slotdigest import SlotDigestArrays, series_hashes, slot_digests
from metricsd.maths.spec import AggregateResult, AggregateSpec, InvalidAggregate, SideQuery, SideResult
from metricsd.maths.window import SeriesFn, reduce_windows
from metricsd.store.engine import Store
from metricsd.store.scan import window_counts

__all__ = ["eval_times", "run_aggregate"]


def eval_times(start_ms: int, end_ms: int, step_ms: int, max_times: int) -> np.ndarray:
    if end_ms < start_ms:
        raise InvalidAggregate(f"end {end_ms} is before start {start_ms}")
    if start_ms == end_ms:
        return np.array([start_ms], dtype=np.int64)
    if step_ms <= 0:
        raise InvalidAggregate("a range aggregate needs step_ms > 0")
    n = (end_ms - start_ms) // step_ms + 1
    if n > max_times:
        raise InvalidAggregate(f"{n} evaluation times exceed the limit of {max_times}; use a larger step")
    return start_ms + step_ms * np.arange(n, dtype=np.int64)


def _validate(spec: AggregateSpec) -> None:
    for side in (spec.query, spec.denominator):
        if side is None:
            continue
        if not side.matchers:
            raise InvalidAggregate("a selector needs at least one matcher")
        if side.window_ms <= 0:
            raise InvalidAggregate("window_ms must be positive")
        if side.fn not in SeriesFn.__members__.values():
            raise InvalidAggregate("unknown per-series function")
    if spec.across not in AcrossFn.__members__.values():
        raise InvalidAggregate("unknown across-series function")
    if spec.across is AcrossFn.QUANTILE and spec.denominator is not None:
        raise InvalidAggregate("a ratio of quantiles is not supported")


def _tail(store: Store, rows: np.ndarray, need: int, width: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The newest samples of each row's ring, enough that the oldest gathered is at or before
    ``need`` (or the ring's oldest): (k x width timestamps, values, samples per row)."""
    head = store.head
    while True:
        ts, vals, cnt = head.newest(rows, width)
        if width >= head.capacity or bool(np.all((cnt == head.filled[rows]) | (ts[:, 0] <= need))):
            return ts, vals, cnt
        width = min(2 * width, head.capacity)


def _head_covers(store: Store, rows: np.ndarray, lo: int) -> np.ndarray:
    """Whether each row's ring holds every sample after ``lo`` (its oldest is at or before it, or
    the series has nothing in chunks): the rows read from the head, not from decoded chunks."""
    head = store.head
    filled = head.filled[rows]
    return ((filled > 0) & (head.oldest_ts(rows) <= lo)) | (store.chunks.samples[rows] == 0)


def series_stats(store: Store, rows: np.ndarray, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """Per series, the samples in (lo, hi] and the newest timestamp at or before hi (-1: none):
    what a slot digest covers (metricsd/maths/slotdigest.py). Timestamps only, no values reduced."""
    head = store.head
    n = len(rows)
    counts = np.zeros(n, dtype=np.int64)
    newest = np.full(n, -1, dtype=np.int64)
    if n == 0:
        return counts, newest
    covered = _head_covers(store, rows, lo)
    fast = np.flatnonzero(covered)
    if len(fast):
        fr = rows[fast]
        upto = head.rank(fr, hi)
        counts[fast] = upto - head.rank(fr, lo)
        some = np.flatnonzero(upto > 0)
        newest[fast[some]] = head.ts_at(fr[some], upto[some] - 1)
    slow = np.flatnonzero(~covered)
    if len(slow):
        cnt, flat_t, _ = store.series_samples_many(rows[slow], lo + 1, hi)
        counts[slow] = cnt
        some = np.flatnonzero(cnt)
        newest[slow[some]] = flat_t[np.cumsum(cnt)[some] - 1]
    return counts, newest


def _digests(store: Store, spec: AggregateSpec, sides: list[SideQuery], rows_per_side: list[np.ndarray],
             times: np.ndarray) -> SlotDigestArrays:
    if spec.slots is None or not spec.slots.slot_count:
        raise InvalidAggregate("slot_digests needs a slot filter")
    stray = sorted(set(spec.data_slots) - set(spec.slots.slots))
    if stray:
        raise InvalidAggregate(f"data_slots {stray[:5]} are not among the request's slots")
    slot_count = np.uint64(spec.slots.slot_count)
    slots, counts, hashes = [], [], []
    for i, (side, rows) in enumerate(zip(sides, rows_per_side, strict=True)):
        c, newest = series_stats(store, rows, int(times[0]) - side.window_ms, int(times[-1]))
        slots.append((store.index.pod_hash[rows] % slot_count).astype(np.int64))
        counts.append(c)
        hashes.append(series_hashes(store.index.id_column[rows], i, c, newest))
    return slot_digests(np.concatenate(slots), np.concatenate(counts), np.concatenate(hashes))


def series_values(store: Store, rows: np.ndarray, side: SideQuery, times: np.ndarray) -> tuple[np.ndarray, np.ndarray,
                                                                                            int]:
    """Reduce each series in ``rows`` over its window at each time: (values, samples, scanned)."""
    lo = int(times[0]) - side.window_ms
    hi = int(times[-1])
    n = len(rows)
    out_v = np.full((n, len(times)), np.nan)
    out_s = np.zeros((n, len(times)), dtype=np.uint32)
    if n == 0:
        return out_v, out_s, 0
    # The newest sample at or before the first evaluation time is all ``last`` needs from before
    # it; every other function needs everything after the window's start.
    need = int(times[0]) if side.fn is SeriesFn.LAST else lo
    covered = _head_covers(store, rows, need)
    fast = np.flatnonzero(covered)
    scanned = 0
    if len(fast):
        ts, vals, cnt = _tail(store, rows[fast], need, 2 if side.fn is SeriesFn.LAST else 8)
        v, s = reduce_windows(ts, vals, cnt, times, side.window_ms, side.fn)
        out_v[fast], out_s[fast] = v, s
        scanned += int(s.sum())
    slow = np.flatnonzero(~covered)
    if len(slow) and side.fn is SeriesFn.COUNT:  # whole chunks are counted from their headers (store/scan.py)
        c = window_counts(store, rows[slow], times, side.window_ms)
        out_v[slow], out_s[slow] = np.where(c > 0, c, np.nan), c
        scanned += int(c.sum())
    elif len(slow):
        cnt, flat_t, flat_v = store.series_samples_many(rows[slow], lo + 1, hi)
        width = max(1, int(cnt.max()))
        ts = np.zeros((len(slow), width), dtype=np.int64)
        vals = np.zeros((len(slow), width))
        which = np.repeat(np.arange(len(slow)), cnt)
        col = np.arange(len(flat_t)) - np.repeat(np.cumsum(cnt) - cnt, cnt)
        ts[which, col], vals[which, col] = flat_t, flat_v
        v, s = reduce_windows(ts, vals, cnt, times, side.window_ms, side.fn)
        out_v[slow], out_s[slow] = v, s
        scanned += int(s.sum())
    return out_v, out_s, scanned


def run_aggregate(store: Store, spec: AggregateSpec) -> AggregateResult:
    """Answer an aggregate from one store's data. Raises InvalidAggregate for a bad request."""
    _validate(spec)
    times = eval_times(spec.start_ms, spec.end_ms, spec.step_ms, store.settings.max_eval_times)
    sides = [spec.query] + ([spec.denominator] if spec.denominator is not None else [])
    rows_per_side = [store.select(side.matchers, spec.slots) for side in sides]
    digests = None
    if spec.data_slots and not spec.slot_digests:
        raise InvalidAggregate("data_slots is only meaningful with slot_digests")
    if spec.slot_digests:
        digests = _digests(store, spec, sides, rows_per_side, times)
        assert spec.slots is not None  # _digests checked
        rows_per_side = [store.index.selected(side.matchers, spec.slots.slot_count, spec.data_slots) for side in sides]
    # Groups over both sides together, so numerator and denominator line up.
    all_rows = np.concatenate(rows_per_side) if len(rows_per_side) > 1 else rows_per_side[0]
    groups, gidx_all = store.index.group_codes(all_rows, spec.group_by)
    results: list[SideResult] = []
    scanned = 0
    offset = 0
    ids_arr = store.index.id_column
    for side, rows in zip(sides, rows_per_side, strict=True):
        gidx = gidx_all[offset : offset + len(rows)]
        offset += len(rows)
        v, s, sc = series_values(store, rows, side, times)
        scanned += sc
        results.append(SideResult(group_partials(v, s, gidx, len(groups)), ids_arr[rows], gidx, v, s))
    num = results[0]
    den = results[1] if len(results) > 1 else None
    if spec.across is AcrossFn.QUANTILE:
        values = quantile_across(spec.quantile, num.values, num.samples, num.group, len(groups))
    else:
        values = finalize(spec.across, num.partials)
        if den is not None:
            with np.errstate(divide="ignore", invalid="ignore"):
                values = values / finalize(spec.across, den.partials)
    res = AggregateResult(times, groups, values, num, den, int(sum(len(r) for r in rows_per_side)), scanned,
                          digests=digests)
    selection = requested(spec.top_k, spec.bottom_k)
    return res if selection is None else select_groups(res, *selection)
