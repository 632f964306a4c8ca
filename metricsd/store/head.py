"""The head: the newest raw samples of every series, a small ring per row in 2-D NumPy arrays.

Samples are compressed as they arrive (metricsd/store/chunks.py seals a block of ``capacity``
samples at a time); the ring keeps the newest ``capacity`` of them raw as well, so that the
short windows that autoscalers ask about (a rate over a minute, the last value over two) are
answered from a small matrix gather without decoding anything. The ring is a cache of what the
chunks hold, except for its ``unsealed`` newest samples, which are in no block yet.

     row r (capacity 8):  slot  0   1   2   3   4   5   6   7
                                s5  s6  s7  s8  s1  s2  s3  s4      pos[r] = 4: s1 is the oldest
                                             ^ newest    filled[r] = 8, unsealed[r] = 2 (s7, s8)

Timestamps are not stored for a "regular" row, one whose ring samples are evenly spaced (an agent
stamping its samples on its tick: every row of compare.py's workload; a scraper whose timestamps
jitter by a millisecond makes its rows wide, below): its ring's timestamps are its newest one
(``base``) minus ``step`` times each sample's age. 8 bytes a sample, not 12 (at 200,000 series
the rings' timestamps were ~25 MiB of the server's RSS). A row that leaves its step (jitter, a
missed scrape, a backfill out of line) becomes "wide" for as long as the store runs: its
timestamps are int32 milliseconds after ``base`` in a side matrix (``wide_ts``, one row of it
per wide row), as every row's were before. A wide row spans at most OFFSET_MAX ms (24.8 days); the
head moves its base forward as the ring turns and a sample that would land past it goes to the
engine's slow path. Values likewise: a "flat" row (every ring value the same bits: a request, a
limit) keeps one (``flat``); a "varying" row's are in ``vals``, a row of it per varying row.
metricsd/store/FORMAT.md, "The head and the chunks in memory", draws the layout.
"""

from __future__ import annotations

import numpy as np

from metricsd.store.headrows import NO_TS, OFFSET_MAX, HeadRows, flat_view, zero_grown

__all__ = ["NO_TS", "OFFSET_MAX", "Head", "zero_grown"]


class Head(HeadRows):
    """The head: HeadRows' columns, written. Not safe for concurrent use; the store serialises access."""

    def _vary(self, rows: np.ndarray) -> None:
        """Flat rows (distinct) become varying: their flat value written into every slot of a new
        row of ``vals``."""
        k = len(rows)
        if k == 0:
            return
        start = self.n_varying
        if start + k > len(self.vals):
            have = len(self.vals)
            self.vals = zero_grown(self.vals, max(start + k, have + max(1024, have // 4)))
        self.vals[start : start + k] = self.flat[rows][:, None]
        self.varying[rows] = np.arange(start + 1, start + k + 1, dtype=np.int32)
        self.n_varying += k

    def _write_vals(self, rows: np.ndarray, filled: np.ndarray, counts: np.ndarray, first: np.ndarray,
                    owner: np.ndarray | None, src: np.ndarray, slot: np.ndarray, vals: np.ndarray) -> None:
        """``write``'s values: sample j, ``vals[src[j]]``, into ``slot[j]`` of ``rows[owner[j]]``
        (``owner`` None: one sample a row). A flat row stays flat while every value its ring keeps
        has its bits; otherwise it becomes varying first."""
        if owner is None and self.capacity > 1:
            self._write_one_val(rows, filled, src, slot, vals)
            return
        bits = vals.view(np.uint64)
        fresh = (filled == 0) | (counts >= self.capacity)  # the ring becomes the segment's newest samples
        flat = self.varying[rows] == 0 if self.n_varying else np.ones(len(rows), dtype=bool)
        target = np.where(fresh, bits[first], self.flat[rows].view(np.uint64))
        if owner is None:
            off = flat & (bits[src] != target)
        else:
            bad = bits[src] != target[owner]
            off = flat & (np.bincount(owner[bad], minlength=len(rows)) > 0)
        if bool(off.any()):
            self._vary(rows[off])
        set_flat = flat & fresh & ~off
        self.flat[rows[set_flat]] = vals[first[set_flat]]
        if self.n_varying:
            sample_rows = rows if owner is None else rows[owner]
            at = self.varying[sample_rows].astype(np.int64) * self.capacity + slot - self.capacity
            some = np.flatnonzero(at >= 0)  # varying rows (slot < capacity: a flat row's is negative)
            if len(some) == len(at):
                flat_view(self.vals)[at] = vals[src]
            elif len(some):
                flat_view(self.vals)[at[some]] = vals[src[some]]

    def _write_one_val(self, rows: np.ndarray, filled: np.ndarray, src: np.ndarray, slot: np.ndarray,
                       vals: np.ndarray) -> None:
        """``_write_vals`` of one sample a row (the agents' shape), in as few NumPy calls as it takes
        when nothing changes kind: a flat row's value compared, a varying row's stored."""
        v = vals[src]
        var = self.varying[rows]
        is_flat = var == 0
        off = is_flat & (v.view(np.uint64) != self.flat[rows].view(np.uint64))
        if bool(off.any()):
            empty = filled == 0  # an empty ring takes the value as its flat one
            start = off & empty
            self.flat[rows[start]] = v[start]
            turn = off & ~empty
            if bool(turn.any()):
                self._vary(rows[turn])
                var = self.varying[rows]
                is_flat &= ~turn
        if bool(is_flat.all()):
            return
        at = var.astype(np.int64) * self.capacity + slot - self.capacity  # (var - 1) * capacity + slot
        if bool(is_flat.any()):
            some = np.flatnonzero(var)
            at, v = at[some], v[some]
        flat_view(self.vals)[at] = v

    def _widen(self, rows: np.ndarray) -> None:
        """Regular rows (distinct) become wide: their ring timestamps written out as int32 offsets
        from their oldest, which fit (a regular step is at most step_max)."""
        k = len(rows)
        if k == 0:
            return
        cap = self.capacity
        start = self.n_wide
        if start + k > len(self.wide_ts):
            have = len(self.wide_ts)
            self.wide_ts = zero_grown(self.wide_ts, max(start + k, have + max(64, have // 4)))
        slots = np.broadcast_to(np.arange(cap), (k, cap))
        t = self.slot_ts(rows, slots)
        filled = self.filled[rows].astype(np.int64)
        oldest = self.base[rows] - self.step[rows].astype(np.int64) * np.maximum(filled - 1, 0)
        age = (self.pos[rows].astype(np.int64)[:, None] - 1 - slots) % cap
        off = np.where(age < filled[:, None], t - oldest[:, None], 0)
        self.wide_ts[start : start + k] = off.astype(np.int32)
        self.base[rows] = np.where(filled > 0, oldest, self.base[rows])
        self.wide[rows] = np.arange(start + 1, start + k + 1, dtype=np.int32)
        self.n_wide += k

    # --- writes ----------------------------------------------------------------------------

    def write(self, rows: np.ndarray, counts: np.ndarray, starts: np.ndarray, ts: np.ndarray,
              vals: np.ndarray) -> None:
        """Push segment i (``counts[i]`` samples of ``ts``/``vals`` from ``starts[i]``) into the ring
        of distinct ``rows[i]``: only its newest ``capacity`` can stay. The caller has checked with
        ``fit`` that the ring takes them (a regular row stays on its step, a wide row's base
        reaches them), and keeps ``unsealed`` itself.

        Every row wide (a real Prometheus' rows: its scrape stamps jitter) skips the regular rows'
        step bookkeeping and the split of the write into wide and regular rows: a ~500-sample
        request paid ~15 NumPy calls on empty selections (perf/RESULTS.md issue 24 session 42)."""
        if len(rows) == 0:
            return
        cap = self.capacity
        counts = np.asarray(counts, dtype=np.int64)
        filled = self.filled[rows]
        pos = self.pos[rows]
        one = bool((counts == 1).all())  # one sample a series (the agents' and a real Prometheus' shape)
        if one:  # the ring keeps the one sample: it is its own first and newest
            kept, first = counts, starts
            newest = ts[starts]
            self._write_vals(rows, filled, counts, starts, None, starts, pos, vals)
        else:
            kept = np.minimum(counts, cap)
            first = starts + counts - kept  # the samples that can survive in the ring
            newest = ts[starts + counts - 1]
            owner = np.repeat(np.arange(len(rows)), kept)
            offset = np.arange(int(kept.sum())) - np.repeat(np.cumsum(kept) - kept, kept)
            src = first[owner] + offset
            slot = ((pos.astype(np.int64) + counts - kept)[owner] + offset) % cap
            self._write_vals(rows, filled, counts, first, owner, src, slot, vals)
        wide = self.wide[rows] if self.n_wide else None
        if wide is not None and bool(wide.all()):
            self._write_wide(rows, counts, starts, kept, first, filled == 0, ts, wide, pos, one)
        else:
            self._write_regular(rows, counts, starts, kept, first, filled, newest, ts, wide, pos, one)
        self.pos[rows] = (pos.astype(np.int64) + counts) % cap
        self.filled[rows] = np.minimum(filled.astype(np.int64) + counts, cap)
        self.last_ts[rows] = newest

    def _write_regular(self, rows: np.ndarray, counts: np.ndarray, starts: np.ndarray, kept: np.ndarray,
                       first: np.ndarray, filled: np.ndarray, newest: np.ndarray, ts: np.ndarray,
                       wide: np.ndarray | None, pos: np.ndarray, one: bool) -> None:
        """``write``'s timestamps when some rows are regular: the wide ones' offsets, then each
        regular row's newest timestamp and the step back to the one before it."""
        reg, r_counts, r_starts, r_kept, r_filled, r_newest = rows, counts, starts, kept, filled, newest
        if wide is not None and bool(wide.any()):
            w = np.flatnonzero(wide)
            self._write_wide(rows[w], counts[w], starts[w], kept[w], first[w], filled[w] == 0, ts, wide[w], pos[w],
                             one)
            r = np.flatnonzero(wide == 0)
            reg, r_counts, r_starts, r_kept, r_filled, r_newest = (
                rows[r], counts[r], starts[r], kept[r], filled[r], newest[r])
        if one:
            prev = self.base[reg]
            has_two = r_filled > 0
        else:
            cap = self.capacity
            prev = np.where(r_kept >= 2, ts[np.maximum(r_starts + r_counts - 2, 0)], self.base[reg])
            has_two = (r_kept >= 2) | ((r_filled > 0) & (r_counts < cap))
        gap = r_newest - prev
        new = gap != self.step[reg]  # most rows: on their step already
        if bool(new.any()):
            new &= has_two & (gap > 0) & (gap <= self.step_max)
            self.step[reg[new]] = gap[new]
        self.base[reg] = r_newest

    def _write_wide(self, rows: np.ndarray, counts: np.ndarray, starts: np.ndarray, kept: np.ndarray,
                    first: np.ndarray, empty: np.ndarray, ts: np.ndarray, wide: np.ndarray, pos: np.ndarray,
                    one: bool) -> None:
        """``write``'s timestamps of wide rows: int32 offsets from their base. ``wide`` and ``pos``:
        the rows' entries of those columns, ``one``: one sample a row."""
        cap = self.capacity
        fresh = empty if one and cap > 1 else empty | (counts >= cap)
        if bool(fresh.any()):
            self.base[rows[fresh]] = ts[first[fresh]]
        w = wide.astype(np.int64) - 1
        if one:  # the agents' and a real Prometheus' shape
            flat_view(self.wide_ts)[w * cap + pos] = ts[starts] - self.base[rows]
            return
        sample_w = np.repeat(w, kept)
        offset = np.arange(int(kept.sum())) - np.repeat(np.cumsum(kept) - kept, kept)
        src = np.repeat(first, kept) + offset
        slot = (np.repeat(pos.astype(np.int64) + counts - kept, kept) + offset) % cap
        flat_view(self.wide_ts)[sample_w * cap + slot] = ts[src] - np.repeat(self.base[rows], kept)

    def fit(self, rows: np.ndarray, counts: np.ndarray, starts: np.ndarray, ts: np.ndarray) -> np.ndarray:
        """Before ``write``: a regular row whose segment leaves its step becomes wide, and a wide
        row's base moves forward so that every sample its ring keeps afterwards is an int32 offset
        from it. Returns whether each row can take its segment; a row that cannot (a wide row whose
        samples would span more than OFFSET_MAX ms: a series written once in weeks) goes to the
        engine's slow path, untouched here."""
        rows = np.asarray(rows, dtype=np.int64)
        counts = np.asarray(counts, dtype=np.int64)
        if self.n_wide:
            wide = self.wide[rows]
            if bool(wide.all()):  # every row wide (a real Prometheus' jittered stamps): none to widen
                return self._fit_wide(rows, counts, starts, ts)
            regular = np.flatnonzero(wide == 0)
            off = regular[~self._on_step(rows[regular], counts[regular], starts[regular], ts)]
        else:
            off = np.flatnonzero(~self._on_step(rows, counts, starts, ts))
        self._widen(rows[off])
        ok = np.ones(len(rows), dtype=bool)
        if not self.n_wide:
            return ok
        w = np.flatnonzero(self.wide[rows])
        if len(w):
            ok[w] = self._fit_wide(rows[w], counts[w], starts[w], ts)
        return ok

    def _on_step(self, rows: np.ndarray, counts: np.ndarray, starts: np.ndarray, ts: np.ndarray) -> np.ndarray:
        """Whether each regular row's ring stays evenly spaced (by at most step_max) with its
        segment written: every gap between the samples it keeps equals its step."""
        cap = self.capacity
        filled = self.filled[rows]
        fresh = (filled == 0) | (counts >= cap)  # the ring becomes the segment's newest samples
        lim = self.step_max
        if bool((counts == 1).all()):  # the agents' shape: one comparison a row
            gap = ts[starts] - self.base[rows]
            on = gap == self.step[rows]  # a step is 0 or one that was checked, so this is enough
            if bool(on.all()):
                return on
            return fresh | ((gap > 0) & (gap <= lim) & ((filled < 2) | on))
        kept = np.minimum(counts, cap)
        first = starts + counts - kept
        n = int(kept.sum())
        owner = np.repeat(np.arange(len(rows)), kept)
        offset = np.arange(n) - np.repeat(np.cumsum(kept) - kept, kept)
        src = np.repeat(first, kept) + offset
        joined = offset > 0
        prev = np.where(joined, ts[np.maximum(src - 1, 0)], self.base[rows][owner])
        gap = ts[src] - prev
        counted = joined | ~fresh[owner]  # a fresh ring's oldest sample has no gap before it
        # the step each row must keep: its own (two or more samples stay), else its first gap
        first_gap = np.where(fresh, ts[np.minimum(first + 1, len(ts) - 1)] - ts[first],
                             ts[first] - self.base[rows])
        want = np.where(~fresh & (filled >= 2), self.step[rows].astype(np.int64), first_gap)
        bad = counted & ((gap != want[owner]) | (gap <= 0) | (gap > lim))
        return np.bincount(owner[bad], minlength=len(rows)) == 0

    def _fit_wide(self, rows: np.ndarray, counts: np.ndarray, starts: np.ndarray, ts: np.ndarray) -> np.ndarray:
        """``fit`` for wide rows: move each base forward so every kept sample is an int32 offset."""
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
            w = self.wide[rr].astype(np.int64) - 1
            shift = oldest[move] - self.base[rr]
            # samples older than the new base go negative: this write overwrites them
            shifted = self.wide_ts[w].astype(np.int64) - shift[:, None]
            self.wide_ts[w] = np.clip(shifted, np.iinfo(np.int32).min, OFFSET_MAX).astype(np.int32)
            self.base[rr] = oldest[move]
        return ok

    def replace_row(self, row: int, ts: np.ndarray, vals: np.ndarray, unsealed: int) -> None:
        """Set a row's ring to the newest ``capacity`` of ``ts``/``vals`` (recovery, merges; the rare
        path), the last ``unsealed`` of them in no block yet. Raises ValueError when they do not fit
        (more unsealed samples than the ring holds, or a span past OFFSET_MAX)."""
        keep = min(len(ts), self.capacity)
        ts = np.asarray(ts[len(ts) - keep :], dtype=np.int64)
        vals = vals[len(vals) - keep :]
        if unsealed > keep:
            raise ValueError("more unsealed samples than the ring holds")
        if keep and int(ts[-1]) - int(ts[0]) > OFFSET_MAX:
            raise ValueError("ring content spans more than the head's offsets reach")
        self.load(np.array([row]), np.array([keep]), np.array([unsealed]), ts, vals)
        if keep:
            self.last_ts[row] = max(int(self.last_ts[row]), int(ts[-1]))

    def load(self, rows: np.ndarray, filled: np.ndarray, unsealed: np.ndarray, ts: np.ndarray,
             vals: np.ndarray) -> None:
        """Set the rings of distinct ``rows`` at once (a snapshot's restore): row i takes
        ``filled[i]`` samples of ``ts``/``vals`` (row after row, oldest first, at most capacity,
        spanning at most OFFSET_MAX ms), the last ``unsealed[i]`` of them in no block yet. Evenly
        spaced rings are regular; the others are wide."""
        rows = np.asarray(rows, dtype=np.int64)
        filled = np.asarray(filled, dtype=np.int64)
        cap = self.capacity
        ends = np.cumsum(filled)
        starts = ends - filled
        owner = np.repeat(np.arange(len(rows)), filled)
        offset = np.arange(len(ts)) - starts[owner]
        if len(ts):  # every ring begins again: flat when all its values have the same bits
            vals = np.ascontiguousarray(vals, dtype=np.float64)
            self._write_vals(rows, np.zeros(len(rows), np.int64), filled, np.minimum(starts, len(ts) - 1), owner,
                             np.arange(len(ts)), offset, vals)
        self.filled[rows] = filled
        self.unsealed[rows] = unsealed
        self.pos[rows] = filled % cap
        two = filled >= 2
        last = max(len(ts) - 1, 0)
        step = np.where(two, ts[np.minimum(starts + 1, last)] - ts[np.minimum(starts, last)], 0) if len(ts) else \
            np.zeros(len(rows), np.int64)
        gap = np.diff(ts, prepend=ts[:1]) if len(ts) else np.zeros(0, np.int64)
        bad = (offset > 0) & ((gap != step[owner]) | (gap <= 0) | (gap > self.step_max))
        even = np.bincount(owner[bad], minlength=len(rows)) == 0
        was_wide = self.wide[rows] != 0
        some = filled > 0
        # regular: the newest and the step (a wide row stays wide)
        reg = np.flatnonzero(even & ~was_wide)
        self.base[rows[reg[some[reg]]]] = ts[ends[reg[some[reg]]] - 1]
        self.step[rows[reg]] = np.where(two[reg], step[reg], 0)
        wide = np.flatnonzero(~(even & ~was_wide))
        if len(wide) == 0:
            return
        new = wide[~was_wide[wide]]
        self.filled[rows[new]] = 0  # nothing to write out: their samples are set below
        self._widen(rows[new])
        self.filled[rows[new]] = filled[new]
        wr = rows[wide]
        self.base[wr[some[wide]]] = ts[starts[wide[some[wide]]]]
        mine = np.repeat(np.isin(np.arange(len(rows)), wide), filled)
        w = self.wide[rows[owner[mine]]].astype(np.int64) - 1
        self.wide_ts[w, offset[mine]] = (ts[mine] - self.base[rows[owner[mine]]]).astype(np.int32)
