"""The store engine: writes, raw reads, pushed-down aggregates, retention. No I/O, no clock.

Contract: not safe for concurrent use. The gRPC servicer calls it from the event loop thread
only, and every call runs to completion without awaiting, so no lock is needed.

Write policy (documented in the proto too): a batch is validated whole before anything is
stored (all-or-nothing); then each series' samples newer than its newest sample are appended
(the fast path), samples within ``ooo_window_ms`` of it are merged in order, older ones are
counted as ``too_old``, and a timestamp the series already holds is counted as ``duplicate``
(first write wins, so a retried batch is idempotent).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from metricsd.maths.slots import SlotFilter
from metricsd.model import InvalidSeries, Labels, describe, series_id, validate_labels
from metricsd.selector import Matcher
from metricsd.store.chunks import Chunks
from metricsd.store.head import NO_TS, Head
from metricsd.store.index import SeriesIndex
from metricsd.store.limits import NewSeriesRate, SeriesLimitExceeded, series_limit_refusal
from metricsd.store.readmany import series_samples_many
from metricsd.store.retention import drop_expired
from metricsd.store.rollup import PACK_BUDGET, RollupPoints, Rollups
from metricsd.store.seal import store_segments
from metricsd.store.settings import StoreSettings

__all__ = ["ChunkRead", "SeriesSamples", "Store", "ValidWrite", "WriteResult"]

ChunkRead = Callable[[int, int, int], tuple[np.ndarray, np.ndarray]]  # (row, start_ms, end_ms) -> Chunks.read's

@dataclass
class WriteResult:
    written: int = 0
    unknown_ids: list[int] = field(default_factory=list)
    too_old: int = 0
    duplicate: int = 0
    # (entry, too_old, duplicate) of each entry of the batch that was merged (not newer than its
    # series' newest sample), entry being its position in ``ids``: a write of several requests
    # together (StoreAPI.write_together) tells each request what it lost. Empty on the fast path.
    merged: list[tuple[int, int, int]] = field(default_factory=list)


@dataclass(frozen=True)
class ValidWrite:
    """A batch validated against the store as it was; apply() it before anything else changes the store."""

    ids: np.ndarray
    counts: np.ndarray
    timestamps: np.ndarray
    values: np.ndarray
    new_series: Mapping[int, Labels]
    rows: np.ndarray  # per series: its row, or -1 for a series new to the store
    generation: int
    ooo_window_ms: int | None = None  # None: the settings' window (see Store.validate)
    new_per_namespace: Mapping[str, int] | None = None  # admitted under the rate limit at now_s
    now_s: float = 0.0


@dataclass(frozen=True)
class SeriesSamples:
    id: int
    labels: Labels
    timestamps: np.ndarray
    values: np.ndarray


class Store:
    def __init__(self, settings: StoreSettings | None = None) -> None:
        self.settings = settings or StoreSettings()
        self.index = SeriesIndex()
        self.head = Head(self.settings.head_keep)
        self.chunks = Chunks(self.settings.head_keep, self.settings.chunk_samples)
        self.rollups = Rollups()
        self.rejected: Counter[str] = Counter()  # samples dropped from applied batches (replayed from the WAL)
        # Samples of refused writes by reason, since the process started: not data, so neither
        # logged nor snapshotted. Stats.rejected reports both.
        self.refused: Counter[str] = Counter()
        self.max_ts = np.iinfo(np.int64).min
        self.samples_written = 0
        self._stamp_buf = np.zeros(64, dtype=np.int64)
        self._position_buf = np.arange(64, dtype=np.int64)
        self._generation = 0  # bumped by every change; a ValidWrite must see the one it was made at
        self.new_series_rate = NewSeriesRate(self.settings.series_limits.max_new_series_per_minute)

    # --- writes ----------------------------------------------------------------------------

    def write(
        self,
        ids: np.ndarray,
        counts: np.ndarray,
        timestamps: np.ndarray,
        values: np.ndarray,
        new_series: Mapping[int, Labels] | None = None,
        now_s: float | None = None,
        runs: Sequence[int] = (),
    ) -> WriteResult:
        """Store a columnar batch (see proto WriteRequest). Raises InvalidSeries or (with ``now_s``)
        SeriesLimitExceeded, storing nothing. ``runs``: see validate()."""
        batch = self.validate(ids, counts, timestamps, values, new_series, now_s=now_s, runs=runs)
        return batch if isinstance(batch, WriteResult) else self.apply(batch)

    def validate(
        self,
        ids: np.ndarray,
        counts: np.ndarray,
        timestamps: np.ndarray,
        values: np.ndarray,
        new_series: Mapping[int, Labels] | None = None,
        ooo_window_ms: int | None = None,
        now_s: float | None = None,
        runs: Sequence[int] = (),
    ) -> ValidWrite | WriteResult:
        """The first half of write(), storing nothing: a ValidWrite to apply(), or a WriteResult
        naming the unknown ids. Raises InvalidSeries. A write-ahead log goes between the halves.

        ``ooo_window_ms`` overrides the settings' out-of-order window for this batch only: a
        replica catching up from its peers (metricsd/replica/catchup.py) fills gaps far older than
        its newest samples, which live writes may not do.

        ``now_s`` (seconds on the caller's monotonic clock) marks a live write: the series limits
        (settings.series_limits) apply to the series it would create, raising SeriesLimitExceeded.
        Without it (WAL replay, catch-up) they do not: that data was acknowledged already.

        ``runs``: the batch's ids are these many ids after these many, each run a request of its own
        (parts of a WriteParts message written together): their rows are looked up run by run, so
        the index remembers each run as the agent sends it every tick (SeriesIndex.rows_of), not
        the combinations of runs that happen to arrive together."""
        new_series = new_series or {}
        ids = np.asarray(ids, dtype=np.uint64)
        counts = np.asarray(counts, dtype=np.int64)
        timestamps = np.asarray(timestamps, dtype=np.int64)
        values = np.asarray(values, dtype=np.float64)
        rows = self._validate(ids, counts, timestamps, values, new_series, runs)
        if rows is None:
            known = self.index.by_id
            return WriteResult(unknown_ids=[int(i) for i in ids.tolist() if int(i) not in known
                                            and int(i) not in new_series])
        wanted = self._admit(ids, rows, new_series, len(timestamps), now_s) if now_s is not None else None
        return ValidWrite(ids, counts, timestamps, values, new_series, rows, self._generation, ooo_window_ms,
                          wanted, now_s or 0.0)

    def _admit(self, ids: np.ndarray, rows: np.ndarray, new_series: Mapping[int, Labels], n_samples: int,
               now_s: float) -> dict[str, int] | None:
        """New series per namespace of a live write within the series limits (None: it creates none).
        Raises SeriesLimitExceeded, counting the batch's samples in ``refused`` under the limit's reason."""
        new_ids = [int(i) for i in ids[rows < 0].tolist()]
        if not new_ids:
            return None
        wanted: Counter[str] = Counter()
        example: dict[str, str] = {}
        for sid in new_ids:
            labels = new_series[sid]
            ns = dict(labels).get("namespace", "")
            wanted[ns] += 1
            example.setdefault(ns, describe(labels))
        limits = self.settings.series_limits
        if len(self.new_series_rate) > 1024:
            self.new_series_rate.prune(now_s)
        msg = series_limit_refusal(self.index.n_alive, len(new_ids), limits.max_series, next(iter(example.values())))
        reason = "series_limit"
        if msg is None:
            msg, reason = self.new_series_rate.refusal(wanted, now_s, example), "new_series_rate"
        if msg is not None:
            self.refused[reason] += n_samples
            raise SeriesLimitExceeded(reason, msg)
        return dict(wanted)

    def apply(self, batch: ValidWrite) -> WriteResult:
        """The second half of write(). Raises RuntimeError if the store changed since validate()."""
        if batch.generation != self._generation:
            raise RuntimeError("the store changed between validate() and apply()")
        self._generation += 1
        if batch.new_per_namespace:
            self.new_series_rate.charge(batch.new_per_namespace, batch.now_s)
        ids, counts, timestamps, values, new_series, rows = (batch.ids, batch.counts, batch.timestamps, batch.values,
                                                             batch.new_series, batch.rows)
        for i in np.flatnonzero(rows < 0).tolist():
            sid = int(ids[i])
            rows[i] = self._add_series(sid, new_series[sid])
        result = WriteResult()
        entry: np.ndarray | None = None  # positions in the batch of the entries kept, when some are empty
        nonempty = counts > 0
        if not bool(nonempty.all()):
            entry = np.flatnonzero(nonempty)
            rows, counts = rows[nonempty], counts[nonempty]
        if len(rows) == 0:
            return result
        starts = np.cumsum(counts) - counts
        first_ts = timestamps[starts]
        fast = first_ts > self.head.last_ts[rows]
        if bool(fast.all()):
            self._append(rows, counts, starts, timestamps, values)
        else:
            f = np.flatnonzero(fast)
            if len(f):
                sel = np.concatenate([np.arange(starts[i], starts[i] + counts[i]) for i in f.tolist()])
                self._append(rows[f], counts[f], np.cumsum(counts[f]) - counts[f], timestamps[sel], values[sel])
            window = self.settings.ooo_window_ms if batch.ooo_window_ms is None else batch.ooo_window_ms
            for i in np.flatnonzero(~fast).tolist():
                s, c = int(starts[i]), int(counts[i])
                too_old, duplicate = result.too_old, result.duplicate
                self._merge_series(int(rows[i]), timestamps[s : s + c], values[s : s + c], result, window)
                result.merged.append((i if entry is None else int(entry[i]), result.too_old - too_old,
                                      result.duplicate - duplicate))
        result.written = int(counts.sum()) - result.too_old - result.duplicate
        self.samples_written += result.written
        self.rejected["too_old"] += result.too_old
        self.rejected["duplicate"] += result.duplicate
        if len(timestamps):
            self.max_ts = max(self.max_ts, int(timestamps.max()))
        return result

    def _validate(
        self, ids: np.ndarray, counts: np.ndarray, ts: np.ndarray, vals: np.ndarray, new_series: Mapping[int, Labels],
        runs: Sequence[int] = (),
    ) -> np.ndarray | None:
        """Rows per series (-1 for new ones), or None when some ids are unknown without labels."""
        if len(ids) != len(counts):
            raise InvalidSeries(f"batch has {len(ids)} series ids but {len(counts)} counts")
        if len(ts) != len(vals):
            raise InvalidSeries(f"batch has {len(ts)} timestamps but {len(vals)} values")
        if int(counts.sum()) != len(ts):
            raise InvalidSeries(f"counts add up to {int(counts.sum())} but the batch has {len(ts)} samples")
        least = int(counts.min()) if len(counts) else 0
        if least < 0:
            raise InvalidSeries("negative sample count")
        limits = self.settings.limits
        for sid, labels in new_series.items():
            validate_labels(labels, limits, require_pod=self.settings.require_pod_labels)
            if series_id(labels) != sid:
                raise InvalidSeries(f"series {describe(labels)}: id {sid:#x} does not match its labels")
        if len(runs) > 1 and sum(runs) == len(ids):
            ends = np.cumsum(runs).tolist()
            rows = np.concatenate([self.index.rows_of(ids[a:b]) for a, b in zip([0, *ends[:-1]], ends, strict=True)])
        else:
            rows = self.index.rows_of(ids)
        known = rows >= 0
        all_known = bool(known.all())
        # A series twice in one batch: stamp each known row with its position; a row written by
        # two positions reads back the later one. New series are few: a set does.
        stamp = self._stamp(len(self.index.labels))
        pos = self._positions(len(ids)) if all_known else np.flatnonzero(known)
        known_rows = rows if all_known else rows[known]
        stamp[known_rows] = pos
        again = stamp[known_rows] != pos
        if bool(again.any()):
            raise InvalidSeries(f"series {self._name(int(ids[pos[np.flatnonzero(again)[0]]]), new_series)} appears "
                                "more than once in the batch")
        if not all_known:
            unknown = [int(i) for i in ids[~known].tolist()]
            if len(set(unknown)) != len(unknown):
                dup = next(i for i in unknown if unknown.count(i) > 1)
                raise InvalidSeries(f"series {self._name(dup, new_series)} appears more than once in the batch")
            if any(i not in new_series for i in unknown):
                return None
        if len(ts):
            lo, hi = int(ts.min()), int(ts.max())
            if lo < limits.min_timestamp_ms or hi > limits.max_timestamp_ms:
                bad = (ts < limits.min_timestamp_ms) | (ts > limits.max_timestamp_ms)
                i = int(np.searchsorted(np.cumsum(counts), int(np.flatnonzero(bad)[0]), side="right"))
                raise InvalidSeries(
                    f"series {self._name(int(ids[i]), new_series)}: timestamp {int(ts[bad][0])} ms out of range "
                    f"[{limits.min_timestamp_ms}, {limits.max_timestamp_ms}] (milliseconds since the epoch?)"
                )
            if least >= 1 and len(ts) == len(counts):  # one sample a series (the live shape): no order to check
                return rows
            step_ok = np.diff(ts) > 0
            seg_start = np.zeros(len(ts), dtype=bool)
            seg_start[(np.cumsum(counts) - counts)[counts > 0]] = True
            bad_pos = np.flatnonzero(~step_ok & ~seg_start[1:])
            if len(bad_pos):
                i = int(np.searchsorted(np.cumsum(counts), int(bad_pos[0]) + 1, side="right"))
                raise InvalidSeries(
                    f"series {self._name(int(ids[i]), new_series)}: timestamps within one write must strictly increase"
                )
        return rows

    def _positions(self, n: int) -> np.ndarray:
        """0..n-1 (read only; kept between writes)."""
        if len(self._position_buf) < n:
            self._position_buf = np.arange(max(n, 2 * len(self._position_buf)), dtype=np.int64)
        return self._position_buf[:n]

    def _stamp(self, n: int) -> np.ndarray:
        if len(self._stamp_buf) < n:
            self._stamp_buf = np.zeros(max(n, 2 * len(self._stamp_buf)), dtype=np.int64)
        return self._stamp_buf

    def _name(self, sid: int, new_series: Mapping[int, Labels]) -> str:
        labels = new_series.get(sid)
        if labels is None:
            row = self.index.row_of(sid)
            labels = self.index.labels[row] if row is not None else None
        return describe(labels) if labels else f"id {sid:#x}"

    def add_series(self, sid: int, labels: Labels) -> int:
        """Register a series with no samples and return its row (restoring a snapshot; labels are
        not validated). Raises KeyError if the id is known."""
        self._generation += 1
        return self._add_series(sid, labels)

    def _add_series(self, sid: int, labels: Labels) -> int:
        row = self.index.add(sid, labels)
        self.head.ensure_rows(row + 1)
        self.chunks.ensure_rows(row + 1)
        self.rollups.ensure_rows(row + 1)
        self.head.reset_row(row)
        self.chunks.reset_row(row)
        return row

    def _append(self, rows: np.ndarray, counts: np.ndarray, starts: np.ndarray, ts: np.ndarray,
                vals: np.ndarray) -> None:
        """Fast path: every segment is newer than its series' newest sample."""
        if len(ts) == len(rows):
            self.rollups.add_one_each(rows, ts, vals)
        else:
            self.rollups.add(np.repeat(rows, counts), ts, vals)
        store_segments(self.head, self.chunks, rows, counts, starts, ts, vals)

    def _merge_series(self, row: int, ts: np.ndarray, vals: np.ndarray, result: WriteResult, window_ms: int) -> None:
        """Rare path: samples not newer than the series' newest. Merge in order, first write wins:
        the chunks from the first new sample on and the ring's unsealed samples are taken out,
        merged with the new ones and appended again."""
        last = int(self.head.last_ts[row])
        too_old = ts < last - window_ms
        result.too_old += int(too_old.sum())
        ts, vals = ts[~too_old], vals[~too_old]
        if len(ts) == 0:
            return
        # Samples held already (a retried message, a hint, read repair's copy of a series this
        # replica has most of) are counted here, before the series is taken apart: a restarted
        # replica rewrote and sealed whole series again for each such write, seconds of its event
        # loop per message (perf/RESULTS.md issue 24 session 39). ``ts`` is in order (validated).
        held, _ = self.series_samples(row, int(ts[0]), int(ts[-1]))
        if len(held):
            dup = np.isin(ts, held)
            result.duplicate += int(dup.sum())
            ts, vals = ts[~dup], vals[~dup]
            if len(ts) == 0:
                return
        self.head.expiry_floor[row] = NO_TS  # older samples, chunks rewritten: retention looks again (retention.py)
        ct, cv = self.chunks.truncate_from(row, int(ts[0]))
        ht, hv = self.head.unsealed_samples(row)
        old_t = np.concatenate([ct, ht])
        old_v = np.concatenate([cv, hv])
        dup = np.isin(ts, old_t)
        result.duplicate += int(dup.sum())
        ts, vals = ts[~dup], vals[~dup]
        self.rollups.add(np.full(len(ts), row), ts, vals)
        all_t = np.concatenate([old_t, ts])
        all_v = np.concatenate([old_v, vals])
        order = np.argsort(all_t, kind="stable")
        self.head.clear(row)  # when nothing sealed was taken out, the open chunk's chain continues
        store_segments(self.head, self.chunks, np.array([row]), np.array([len(all_t)]), np.zeros(1, np.int64),
                       all_t[order], all_v[order])
        self.head.last_ts[row] = max(last, int(all_t.max()) if len(all_t) else last)

    # --- reads -----------------------------------------------------------------------------

    def select(self, matchers: Sequence[Matcher], slots: SlotFilter | None = None) -> np.ndarray:
        """Rows of live series matching every matcher, restricted to some slots if given (a
        read-only array, kept by the index until a series is added or removed)."""
        if slots is not None and slots.slot_count:
            return self.index.selected(matchers, slots.slot_count, slots.slots)
        return self.index.selected(matchers)

    def series_samples(self, row: int, start_ms: int, end_ms: int, chunk_read: ChunkRead | None = None
                       ) -> tuple[np.ndarray, np.ndarray]:
        """Samples of one series in [start_ms, end_ms] (fresh arrays), from the head alone when it
        covers them. ``chunk_read``: how the sealed ones are read, Chunks.read's answer (the
        one-row read's kept decodes, store/readone.py)."""
        ht, hv = self.head.samples(row)
        if not self.chunks.samples[row] or (len(ht) and int(ht[0]) <= start_ms):
            keep = (ht >= start_ms) & (ht <= end_ms)
            return ht[keep], hv[keep]
        ct, cv = (chunk_read or self.chunks.read)(row, start_ms, end_ms)
        u = int(self.head.unsealed[row])
        ut, uv = ht[len(ht) - u :], hv[len(hv) - u :]
        keep = (ut >= start_ms) & (ut <= end_ms)
        if not bool(keep.any()):
            return ct, cv
        return np.concatenate([ct, ut[keep]]), np.concatenate([cv, uv[keep]])

    def series_samples_many(self, rows: np.ndarray, start_ms: int, end_ms: int
                            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """series_samples of each of ``rows``, read together (store/readmany.py: the rings in one
        pass, the chunks of all rows decoded at once): (samples per row, timestamps, values), row
        after row, each in time order."""
        return series_samples_many(self, rows, start_ms, end_ms)

    def read(self, matchers: Sequence[Matcher], start_ms: int, end_ms: int, slots: SlotFilter | None = None
             ) -> list[SeriesSamples]:
        """Every matching series with its samples in [start_ms, end_ms]. The rows are read
        together (series_samples_many), not one series_samples each: since the compressed head a
        row's read decodes its chunks, ~0.2 ms a row of fixed cost (perf/RESULTS.md, "Issue 25:
        a day, 200,000 series, and the read path")."""
        rows = self.select(matchers, slots)
        if len(rows) == 1:
            row = int(rows[0])
            t, v = self.series_samples(row, start_ms, end_ms)
            counts = np.array([len(t)])
        else:
            counts, t, v = series_samples_many(self, rows, start_ms, end_ms)
        ends = np.cumsum(counts)
        out = []
        for row, lo, hi in zip(rows.tolist(), (ends - counts).tolist(), ends.tolist(), strict=True):
            labels = self.index.labels[row]
            assert labels is not None
            out.append(SeriesSamples(self.index.ids[row], labels, t[lo:hi], v[lo:hi]))
        return out

    def rollup_points(self, matchers: Sequence[Matcher], start_ms: int, end_ms: int, slots: SlotFilter | None = None
                      ) -> list[tuple[int, Labels, RollupPoints]]:
        rows = self.select(matchers, slots)
        out = []
        for row, points in zip(rows.tolist(), self.rollups.points_many(rows, start_ms, end_ms), strict=True):
            labels = self.index.labels[row]
            assert labels is not None
            out.append((self.index.ids[row], labels, points))
        return out

    # --- retention -------------------------------------------------------------------------

    def gc(self) -> int:
        """Drop raw chunks past retention and series left with nothing; returns series removed.
        Visits only the rows the cutoff has reached (store/retention.py)."""
        if self.max_ts == np.iinfo(np.int64).min:
            return 0
        removed = drop_expired(self, self.max_ts - self.settings.retention_ms)
        self.rollups.drop_before(self.max_ts - self.settings.rollup_retention_ms)
        self.rollups.pack_old(PACK_BUDGET)
        return removed

    # --- introspection ---------------------------------------------------------------------

    def stats(self) -> dict[str, int | float]:
        n = self.index.n_rows
        alive = self.index.alive[:n]
        chunk_bytes = self.chunks.nbytes
        chunk_samples = int(self.chunks.samples[:n][alive].sum())
        head_samples = int(self.head.unsealed[:n][alive].sum())
        return {
            "series": self.index.n_alive,
            "samples": chunk_samples + head_samples,
            "chunk_bytes": chunk_bytes,
            "chunk_samples": chunk_samples,
            "bytes_per_sample": chunk_bytes / chunk_samples if chunk_samples else 0.0,
            "head_samples": head_samples,
            "pods": self.index.n_pods,
            "rollup_buckets": self.rollups.n_buckets(),
        }

    def _check(self) -> None:
        """Check every invariant (slow; for tests)."""
        self.index._check()
        self.rollups._check()
        n = self.index.n_rows
        self.head._check(n)
        chunks = self.chunks
        for row in self.index.live_rows():
            chunks._check(row)
            hi = int(chunks.max_ts[row])
            ht, _ = self.head.samples(row)
            u = int(self.head.unsealed[row])
            if chunks.samples[row]:
                assert bool(np.all(ht[len(ht) - u :] > hi)), f"row {row}: unsealed samples overlap chunks"
                assert bool(np.all(ht[: len(ht) - u] <= hi)), f"row {row}: sealed ring samples newer than chunks"
            else:
                assert u == len(ht), f"row {row}: ring samples in no chunk must be unsealed"
            floor = int(self.head.expiry_floor[row])  # a lower bound on what retention looks at
            first = chunks.first_max_ts(row)
            assert floor <= (first if first != NO_TS else (int(ht[0]) if len(ht) else NO_TS)), f"row {row}: floor"
