"""The series index: rows, a SortedDict keyed by pod, label codes and postings.

Every series gets a row number, never reused while the store runs (a deleted row is a
tombstone), so per-row NumPy columns elsewhere line up with it. Two structures answer selectors
without scanning label sets:

- postings: for each (label, value), the increasing array of rows that carry it;
- label codes: for each label name, an int32 column holding the id of the row's value (-1 when
  absent), so a regex or a negative matcher is one vectorised lookup over the candidate rows,
  and grouping by labels is ``np.unique`` over codes rather than a tuple per series.

The pod index (``SortedDict`` by ``namespace/pod``) lists a namespace by prefix and a pod's
series, as the design asks.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable, Iterator, Sequence

import numpy as np
from sortedcontainers import SortedDict

from metricsd.maths.slots import pod_hash
from metricsd.model import Labels, pod_key
from metricsd.selector import Matcher, MatchOp

__all__ = ["SeriesIndex"]


class _IntColumn:
    """A growable int32 array (amortised O(1) append)."""

    __slots__ = ("arr", "n")

    def __init__(self, capacity: int = 8) -> None:
        self.arr = np.zeros(capacity, dtype=np.int32)
        self.n = 0

    def append(self, v: int) -> None:
        if self.n == len(self.arr):
            self.arr = np.concatenate([self.arr, np.zeros(len(self.arr), np.int32)])
        self.arr[self.n] = v
        self.n += 1

    def view(self) -> np.ndarray:
        return self.arr[: self.n]


BATCH_CACHE_MIN = 64
"""Batches of fewer ids are searched every time: the binary search is cheap for them."""

BATCH_CACHE_SIZE = 2048
"""Batches whose rows are remembered: an agent's ticks of a million series in batches of 1,000 are
1,000 (about 8 KB of key and 4 KB of rows each, 25 MB at most); past it the memory is cleared."""

MAX_SELECTED = 256
"""Selections remembered (SeriesIndex.selected), a question's rows per slot filter; past it the
memory is cleared."""

MAX_SELECTED_ROWS = 4_000_000
"""Rows the remembered selections hold together (4 bytes a row: 16 MB). A selection of more rows
than that is made each time (a catch-up listing every series of a big store's slots, say)."""


class _LabelColumn:
    """One label name: its distinct values, and a code per row (-1 = label absent)."""

    __slots__ = ("codes", "ids", "postings", "values")

    def __init__(self) -> None:
        self.values: list[str] = []
        self.ids: dict[str, int] = {}
        self.codes = np.full(64, -1, dtype=np.int32)
        self.postings: list[_IntColumn] = []

    def ensure_rows(self, n: int) -> None:
        if n > len(self.codes):
            grown = np.full(max(n, 2 * len(self.codes)), -1, dtype=np.int32)
            grown[: len(self.codes)] = self.codes
            self.codes = grown

    def at(self, rows: np.ndarray) -> np.ndarray:
        """The codes of ``rows``: -1 for a row past the column's end, which only grows when a row
        with this label arrives (series without it may be added after the last one that has it)."""
        if len(rows) == 0 or int(rows.max()) < len(self.codes):
            return self.codes[rows]
        out = np.full(len(rows), -1, dtype=np.int32)
        inside = rows < len(self.codes)
        out[inside] = self.codes[rows[inside]]
        return out

    def value_id(self, value: str) -> int:
        vid = self.ids.get(value)
        if vid is None:
            vid = len(self.values)
            self.ids[value] = vid
            self.values.append(value)
            self.postings.append(_IntColumn())
        return vid


class SeriesIndex:
    """Rows of series and the structures that find them. Not safe for concurrent use."""

    def __init__(self) -> None:
        self.labels: list[Labels | None] = []
        self.ids: list[int] = []
        self.id_column = np.zeros(64, dtype=np.uint64)  # ids[row] as a column, for vectorised replies
        # pod_hash(namespace/pod) per row: a slot filter of any slot count is one modulo away.
        self.pod_hash = np.zeros(64, dtype=np.uint64)
        self.by_id: dict[int, int] = {}
        self.pods: SortedDict = SortedDict()  # pod key -> list of rows
        self.columns: dict[str, _LabelColumn] = {}
        self.alive = np.zeros(64, dtype=bool)
        self.n_alive = 0
        self._pairs: dict[tuple[str, str], tuple[str, str]] = {}
        # ids of live series sorted, with their rows: a batch of ids maps to rows in one
        # searchsorted instead of a dict lookup per series (the write path's hot spot).
        self._sorted_ids = np.zeros(0, dtype=np.uint64)
        self._sorted_rows = np.zeros(0, dtype=np.int64)
        self._pending: list[tuple[int, int]] = []
        self._ranks: dict[str, tuple[int, np.ndarray]] = {}  # label name -> (values seen, rank per value id)
        self._dead_sorted = 0  # removed series still in _sorted_ids
        self._batch_rows: dict[bytes, np.ndarray] = {}  # a write batch's ids, as bytes -> their rows (rows_of)
        # (matchers, slot count, slots) -> rows, read-only; emptied by add and remove (selected)
        self._selected: dict[tuple[tuple[Matcher, ...], int, tuple[int, ...]], np.ndarray] = {}
        self._selected_rows = 0

    @property
    def n_rows(self) -> int:
        return len(self.labels)

    def row_of(self, sid: int) -> int | None:
        return self.by_id.get(sid)

    def rows_of(self, ids: np.ndarray) -> np.ndarray:
        """Rows of many ids at once (uint64 array); -1 where the id is not a live series.

        Agents send the same series in the same order every tick, so the rows of a batch of ids
        are remembered by the batch's bytes: checking them (each row live and holding its id)
        touches one cache line per series, where the binary search over a million sorted ids
        touched twenty, and missed cache on most (it was 39% of a live write's time at a million
        series). A remembered batch that fails the check is searched again; rows are never
        reused, so a live row holding the id is that series' row."""
        key = ids.tobytes()
        cached = self._batch_rows.get(key)
        if cached is not None and bool(self.alive[cached].all()) and bool((self.id_column[cached] == ids).all()):
            return cached.astype(np.int64)
        if self._pending:
            self._merge_pending()
        if self._dead_sorted > max(1024, len(self._sorted_ids) // 4):
            self._rebuild_sorted()
        if len(self._sorted_ids) == 0:
            return np.full(len(ids), -1, dtype=np.int64)
        # Removed series stay in the sorted arrays until the next rebuild (remove() is O(1)); an
        # id removed and added again is there twice, its live row last (stable merge): take the
        # last match and check that its row is live.
        pos = np.searchsorted(self._sorted_ids, ids, side="right") - 1
        pos_c = np.maximum(pos, 0)
        cand = self._sorted_rows[pos_c]
        found = (self._sorted_ids[pos_c] == ids) & self.alive[cand]
        rows = np.where(found, cand, -1)
        if len(ids) >= BATCH_CACHE_MIN and bool(found.all()):
            if len(self._batch_rows) >= BATCH_CACHE_SIZE:
                self._batch_rows.clear()
            self._batch_rows[key] = rows.astype(np.int32)
        return rows

    def _merge_pending(self) -> None:
        new = np.array(self._pending, dtype=np.uint64)
        self._pending.clear()
        ids = np.concatenate([self._sorted_ids, new[:, 0]])
        rows = np.concatenate([self._sorted_rows, new[:, 1].astype(np.int64)])
        order = np.argsort(ids, kind="stable")
        self._sorted_ids, self._sorted_rows = ids[order], rows[order]

    def _rebuild_sorted(self) -> None:
        self._pending.clear()
        self._dead_sorted = 0
        live = [(sid, row) for sid, row in self.by_id.items()]
        self._sorted_ids = np.array([sid for sid, _ in live], dtype=np.uint64)
        self._sorted_rows = np.array([row for _, row in live], dtype=np.int64)
        order = np.argsort(self._sorted_ids, kind="stable")
        self._sorted_ids, self._sorted_rows = self._sorted_ids[order], self._sorted_rows[order]

    def _intern(self, labels: Labels) -> Labels:
        """Share each (name, value) pair between series: most pairs (namespace, workload, node,
        metric name) repeat across thousands of series, and a pod's pairs across its series."""
        pairs = self._pairs
        out = []
        for pair in labels:
            shared = pairs.get(pair)
            if shared is None:
                shared = pairs[pair] = (sys.intern(pair[0]), sys.intern(pair[1]))
            out.append(shared)
        return tuple(out)

    def add(self, sid: int, labels: Labels) -> int:
        """Register a new series and return its row. Raises KeyError if the id is known."""
        if sid in self.by_id:
            raise KeyError(f"series id {sid:#x} already present")
        labels = self._intern(labels)
        self._forget_selected()
        row = len(self.labels)
        self.labels.append(labels)
        self.ids.append(sid)
        self.by_id[sid] = row
        self._pending.append((sid, row))
        if row >= len(self.alive):
            self.alive = np.concatenate([self.alive, np.zeros(len(self.alive), dtype=bool)])
            self.id_column = np.concatenate([self.id_column, np.zeros(len(self.id_column), dtype=np.uint64)])
            self.pod_hash = np.concatenate([self.pod_hash, np.zeros(len(self.pod_hash), dtype=np.uint64)])
        self.alive[row] = True
        self.id_column[row] = sid
        self.pod_hash[row] = pod_hash(pod_key(labels))
        self.n_alive += 1
        self.pods.setdefault(pod_key(labels), []).append(row)
        for name, value in labels:
            col = self.columns.get(name)
            if col is None:
                col = self.columns[name] = _LabelColumn()
            col.ensure_rows(row + 1)
            vid = col.value_id(value)
            col.codes[row] = vid
            col.postings[vid].append(row)
        return row

    def remove(self, row: int) -> None:
        """Tombstone a row: it no longer matches anything; its number is not reused. O(labels):
        it rebuilt the sorted id column each time, 180 ms a series at 200,000 series, so a
        retention pass dropping a day's churned pods held the store for minutes."""
        labels = self.labels[row]
        if labels is None:
            return
        self.labels[row] = None
        self._forget_selected()
        del self.by_id[self.ids[row]]
        self._dead_sorted += 1  # left in the sorted arrays; rows_of checks alive, rebuilds past a quarter
        self.alive[row] = False
        self.n_alive -= 1
        key = pod_key(labels)
        rows = self.pods[key]
        rows.remove(row)
        if not rows:
            del self.pods[key]

    # --- selection -------------------------------------------------------------------------

    def _value_mask(self, col: _LabelColumn, m: Matcher) -> np.ndarray:
        """For each value id of the column (+1 slot for 'absent' at index 0): does it match."""
        lut = np.empty(len(col.values) + 1, dtype=bool)
        lut[0] = m.matches("")
        if m.op is MatchOp.EQ:
            lut[1:] = False
            vid = col.ids.get(m.value)
            if vid is not None:
                lut[vid + 1] = True
        elif m.op is MatchOp.NEQ:
            lut[1:] = True
            vid = col.ids.get(m.value)
            if vid is not None:
                lut[vid + 1] = False
        else:
            lut[1:] = [m.matches(v) for v in col.values]
        return lut

    def _postings_for(self, m: Matcher) -> np.ndarray | None:
        """Candidate rows for a matcher that only series carrying the label can satisfy."""
        if m.matches(""):
            return None
        col = self.columns.get(m.name)
        if col is None:
            return np.zeros(0, dtype=np.int32)
        if m.op is MatchOp.EQ:
            vid = col.ids.get(m.value)
            return col.postings[vid].view() if vid is not None else np.zeros(0, dtype=np.int32)
        lut = self._value_mask(col, m)[1:]
        hits = np.flatnonzero(lut)
        if len(hits) == 0:
            return np.zeros(0, dtype=np.int32)
        if len(hits) == 1:
            return col.postings[int(hits[0])].view()
        return np.unique(np.concatenate([col.postings[int(h)].view() for h in hits]))

    def select(self, matchers: Sequence[Matcher]) -> np.ndarray:
        """Rows (increasing int32) of live series matching every matcher.

        Seeds from the smallest postings list among equality matchers (else from any matcher
        that excludes the empty value, else from all live rows), then filters the candidates
        through each other matcher's value lookup table: one vectorised step per matcher.
        """
        seed_i: int | None = None
        seed: np.ndarray | None = None
        for i, m in enumerate(matchers):
            if m.op is MatchOp.EQ and not m.matches(""):
                p = self._postings_for(m)
                if p is not None and (seed is None or len(p) < len(seed)):
                    seed_i, seed = i, p
        if seed is None:
            for i, m in enumerate(matchers):
                p = self._postings_for(m)
                if p is not None:
                    seed_i, seed = i, p
                    break
        if seed is None:
            candidates = np.flatnonzero(self.alive[: self.n_rows]).astype(np.int32)
        else:
            candidates = seed[self.alive[seed]]
        for i, m in enumerate(matchers):
            if i == seed_i or len(candidates) == 0:
                continue
            col = self.columns.get(m.name)
            if col is None:
                if not m.matches(""):
                    return np.zeros(0, dtype=np.int32)
                continue
            lut = self._value_mask(col, m)
            candidates = candidates[lut[col.at(candidates) + 1]]
        return candidates

    def selected(self, matchers: Sequence[Matcher], slot_count: int = 0, slots: Sequence[int] = ()) -> np.ndarray:
        """select, then in_slots when ``slot_count``; kept (a read-only array) until a series is
        added or removed, within MAX_SELECTED selections and MAX_SELECTED_ROWS rows. Dashboards
        and autoscalers ask the same few questions every interval while the series stay the same,
        so a question's selection (and its slot filter, which a proxy sends with every question)
        is made once, not per question."""
        key = (tuple(matchers), slot_count, tuple(slots) if slot_count else ())
        rows = self._selected.get(key)
        if rows is None:
            rows = self.select(matchers)
            if slot_count:
                rows = self.in_slots(rows, slot_count, slots)
            rows.flags.writeable = False
            if len(rows) <= MAX_SELECTED_ROWS:
                if len(self._selected) >= MAX_SELECTED or self._selected_rows + len(rows) > MAX_SELECTED_ROWS:
                    self._forget_selected()
                self._selected[key] = rows
                self._selected_rows += len(rows)
        return rows

    def _forget_selected(self) -> None:
        self._selected.clear()
        self._selected_rows = 0

    def in_slots(self, rows: np.ndarray, slot_count: int, slots: Iterable[int]) -> np.ndarray:
        """The rows whose pod's slot (pod hash mod slot_count) is one of ``slots``."""
        wanted = np.zeros(slot_count, dtype=bool)
        wanted[np.fromiter(slots, dtype=np.int64)] = True
        return rows[wanted[(self.pod_hash[rows] % np.uint64(slot_count)).astype(np.int64)]]

    def label_values(self, name: str, rows: np.ndarray | None = None) -> list[str]:
        col = self.columns.get(name)
        if col is None:
            return []
        if rows is None:
            present = [i for i, p in enumerate(col.postings) if bool(self.alive[p.view()].any())]
        else:
            codes = col.at(rows)
            present = [int(c) for c in np.unique(codes[codes >= 0])]
        return sorted(col.values[i] for i in present)

    def label_names(self) -> list[str]:
        return sorted(self.columns)

    def group_codes(self, rows: np.ndarray, by: Sequence[str]) -> tuple[list[Labels], np.ndarray]:
        """Group rows by the values of ``by``: (group label sets sorted, group index per row).

        Vectorised, because an answer grouped by pod and container has tens of thousands of
        groups: the codes of the label columns are folded into one int64 key per row, and
        groups are ordered by each value's rank among its column's values, not by comparing
        tuples (only when some row lacks a label, as tuples order such groups differently)."""
        if not by:
            return [()], np.zeros(len(rows), dtype=np.int64)
        if len(rows) == 0:
            return [], np.zeros(0, dtype=np.int64)
        names = sorted(set(by))
        cols = [self.columns.get(n) for n in names]
        # code + 1 per row and column (0: the label is absent); the radix of each column
        codes = [c.at(rows).astype(np.int64) + 1 if c is not None else np.zeros(len(rows), np.int64) for c in cols]
        sizes = [len(c.values) + 1 if c is not None else 1 for c in cols]
        if math.prod(sizes) < 2**62:
            key = codes[0]
            for code, size in zip(codes[1:], sizes[1:], strict=True):
                key = key * size + code
            uniq, inverse = np.unique(key, return_inverse=True)
            ucodes: list[np.ndarray] = [np.zeros(0, np.int64)] * len(cols)
            for j in range(len(cols) - 1, -1, -1):
                ucodes[j] = uniq % sizes[j]
                uniq = uniq // sizes[j]
        else:
            stacked, inverse = np.unique(np.stack(codes, axis=1), axis=0, return_inverse=True)
            ucodes = [stacked[:, j] for j in range(len(cols))]
        n = len(ucodes[0])
        pairs = [[(name, c.values[k - 1]) if k else None for k in uc.tolist()] if c is not None else [None] * n
                 for name, c, uc in zip(names, cols, ucodes, strict=True)]
        if all(int(uc.min(initial=1)) > 0 for uc in ucodes):
            groups: list[Labels] = list(zip(*pairs, strict=True))
            ranks = [self._value_ranks(name)[uc - 1] for name, uc in zip(names, ucodes, strict=True)]
            order = np.lexsort(ranks[::-1]) if n else np.zeros(0, np.int64)
        else:
            groups = [tuple(p for p in g if p is not None) for g in zip(*pairs, strict=True)]
            order = np.array(sorted(range(n), key=lambda i: groups[i]), dtype=np.int64)
        rank = np.empty(n, dtype=np.int64)
        rank[order] = np.arange(n)
        return [groups[i] for i in order.tolist()], rank[inverse.reshape(-1)]

    def _value_ranks(self, name: str) -> np.ndarray:
        """Each value id's rank in sorted order among the column's values, kept until it grows."""
        col = self.columns[name]
        cached = self._ranks.get(name)
        if cached is None or cached[0] != len(col.values):
            ranks = np.empty(len(col.values), dtype=np.int64)
            ranks[sorted(range(len(col.values)), key=col.values.__getitem__)] = np.arange(len(col.values))
            cached = self._ranks[name] = (len(col.values), ranks)
        return cached[1]

    def pods_with_prefix(self, prefix: str) -> Iterator[str]:
        return iter(self.pods.irange(prefix, prefix + "\uffff"))

    def live_rows(self) -> Iterable[int]:
        return (r for r, lab in enumerate(self.labels) if lab is not None)

    def _check(self) -> None:
        """Invariants, for randomised tests: every structure agrees with the label lists."""
        assert len(self.ids) == len(self.labels)
        live = [r for r, lab in enumerate(self.labels) if lab is not None]
        assert self.n_alive == len(live) == len(self.by_id)
        for r in live:
            labels = self.labels[r]
            assert labels is not None
            assert self.by_id[self.ids[r]] == r
            assert int(self.id_column[r]) == self.ids[r]
            assert int(self.pod_hash[r]) == pod_hash(pod_key(labels))
            assert r in self.pods[pod_key(labels)]
            for name, value in labels:
                col = self.columns[name]
                assert col.values[int(col.codes[r])] == value
        for rows in self.pods.values():
            assert rows and all(self.alive[r] for r in rows)
        got = self.rows_of(np.array(self.ids, dtype=np.uint64)) if self.ids else np.zeros(0, np.int64)
        for r, g in enumerate(got.tolist()):
            # a dead row's id may belong to a newer row of the same series (written again after retention)
            assert g == (r if self.labels[r] is not None else self.by_id.get(self.ids[r], -1))
        for col in self.columns.values():
            for p in col.postings:
                v = p.view()
                assert bool(np.all(np.diff(v) > 0)), "postings must be strictly increasing"
