"""The series index: rows, label codes, postings, and selection by matchers as set operations.

Every series gets a row number, never reused while the store runs (a deleted row is a
tombstone), so per-row NumPy columns elsewhere line up with it. Everything per row is a column:

- ``id_column`` (uint64), ``pod_hash`` (uint64: a slot filter of any slot count is one modulo
  away), ``alive`` (bool);
- per label name, a code per row into that name's table of distinct values (-1: the row lacks
  the label), int8, int16 or int32 as the table's size needs (store/postings.py); handed out as
  int32 (:meth:`label_columns`). A series' labels are its codes (:meth:`labels_of`, :meth:`label_columns`):
  each distinct value is held once, and no tuple, dict entry or list slot is kept per series;
- per label name, postings: the rows of every value as one sorted array (CSR, rebuilt lazily
  when enough rows were added since; newer rows are scanned from the codes);
- the live ids sorted, with their rows, so a batch of ids maps to rows in one searchsorted.

A selection is set operations on these (Prometheus' PostingsForMatchers): each matcher becomes
a lookup table over its label's codes (a regular expression runs once per distinct value, and the
table is kept and extended as values appear), the cheapest matcher that requires its label
seeds the candidates from postings, and the others filter them through their tables, one
vectorised step each. A matcher that the empty value satisfies (``!=``, ``!~``, ``=""``) also
matches series without the label, as in Prometheus.

bytes per series at 1,000,000 series: perf/bench_index.py, perf/RESULTS.md ("The series index").
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

import numpy as np

from metricsd.columns import LabelColumns
from metricsd.maths.slots import pod_hash
from metricsd.model import Labels, pod_key
from metricsd.selector import Matcher, MatchOp
from metricsd.store.postings import EMPTY_ROWS, LabelColumn, grown
from metricsd.store.rowruns import RowOrder

__all__ = ["SeriesIndex"]


BATCH_CACHE_MIN = 64
"""Batches of fewer ids are searched every time: the binary search is cheap for them."""

BATCH_CACHE_SIZE = 2048
"""Batches whose rows are remembered: an agent's ticks of a million series in batches of 1,000 are
1,000 (about 8 KB of key and 4 KB of rows each, 25 MB at most); past it the memory is cleared. Only a
batch seen twice is remembered (the first time its hash alone): a real Prometheus' remote-write
batches are cut by count and never repeat, and filled it with ~12 MB of entries never used again
(perf/RESULTS.md, issue 24 session 38)."""

SORT_KEYS_MIN = 32
"""Batches of at least this many ids are searched in id order (SeriesIndex.rows_of)."""

MAX_SELECTED = 256
"""Selections remembered (SeriesIndex.selected), a question's rows per slot filter; past it the
memory is cleared."""

MAX_SELECTED_ROWS = 4_000_000
"""Rows the remembered selections hold together (4 bytes a row: 16 MB). A selection of more rows
than that is made each time (a catch-up listing every series of a big store's slots, say)."""

MAX_MATCH_TABLES = 1024
"""Matchers whose per-value lookup tables are kept (a regex over 100,000 pod names runs once per
name, not once per question); past it they are cleared."""

MAX_MATCH_TABLE_BYTES = 16 * 1024 * 1024
"""Bytes the kept tables hold together (a byte per value: 160 tables over 100,000 pod names)."""


class _Rows(Sequence[int]):
    """``index.ids``: each row's series id, as a Python int (a view of id_column)."""

    def __init__(self, index: SeriesIndex) -> None:
        self._index = index

    def __len__(self) -> int:
        return self._index.n_rows

    def __getitem__(self, row: int) -> int:  # type: ignore[override]
        if not 0 <= row < self._index.n_rows:
            raise IndexError(row)
        return int(self._index.id_column[row])


class _LabelView(Sequence["Labels | None"]):
    """``index.labels``: each row's label tuple, made from its codes (None for a removed row)."""

    def __init__(self, index: SeriesIndex) -> None:
        self._index = index

    def __len__(self) -> int:
        return self._index.n_rows

    def __getitem__(self, row: int) -> Labels | None:  # type: ignore[override]
        if not 0 <= row < self._index.n_rows:
            raise IndexError(row)
        return self._index.labels_of(row) if self._index.alive[row] else None


class _ById:
    """``index.by_id``: the row of a live series id (a mapping view over the sorted ids)."""

    def __init__(self, index: SeriesIndex) -> None:
        self._index = index

    def get(self, sid: int, default: int | None = None) -> int | None:
        row = self._index.row_of(sid)
        return default if row is None else row

    def __contains__(self, sid: object) -> bool:
        return isinstance(sid, int) and self._index.row_of(sid) is not None

    def __len__(self) -> int:
        return self._index.n_alive


class SeriesIndex:
    """Rows of series and the structures that find them. Not safe for concurrent use."""

    def __init__(self) -> None:
        self._n = 0
        self.id_column = np.zeros(0, dtype=np.uint64)  # id per row, for vectorised replies
        self.pod_hash = np.zeros(0, dtype=np.uint64)  # pod_hash(namespace/pod) per row
        self.alive = np.zeros(0, dtype=bool)
        self.n_alive = 0
        self.columns: dict[str, LabelColumn] = {}
        self.ids = _Rows(self)
        self.labels = _LabelView(self)
        self.by_id = _ById(self)
        # ids of live series sorted, with their rows: a batch of ids maps to rows in one
        # searchsorted instead of a dict lookup per series (the write path's hot spot).
        self._sorted_ids = np.zeros(0, dtype=np.uint64)
        self._sorted_rows = np.zeros(0, dtype=np.int32)
        self._pending: dict[int, int] = {}  # id -> row of the series added since the sorted ids were merged
        self._ranks: dict[str, tuple[int, np.ndarray]] = {}  # label name -> (values seen, rank per value id)
        self._dead_sorted = 0  # removed series still in _sorted_ids
        self._order = RowOrder()  # rows in the order written: where rows_of guesses a batch's rows
        # a write batch's ids, by the hash of their bytes -> their rows (rows_of; checked on use, so a
        # collision costs a search, and the ids' bytes are not kept: 8 bytes a series)
        self._batch_rows: dict[int, np.ndarray] = {}
        self._batch_seen: set[int] = set()  # hashes of batches seen once (rows_of keeps a batch seen twice)
        # (matchers, slot count, slots) -> rows, read-only; emptied by add and remove (selected)
        self._selected: dict[tuple[tuple[Matcher, ...], int, tuple[int, ...]], np.ndarray] = {}
        self._selected_rows = 0
        self._tables: dict[Matcher, np.ndarray] = {}  # regex matcher -> does each value match (index 0: absent)
        self._table_bytes = 0
        self._names: list[str] = []  # sorted(columns)

    @property
    def n_rows(self) -> int:
        return self._n

    @property
    def n_pods(self) -> int:
        """Distinct live pod keys (namespace/pod): a NumPy pass over the rows (for stats)."""
        ns, pod = self.columns.get("namespace"), self.columns.get("pod")
        rows = np.flatnonzero(self.alive[: self._n])
        if ns is None or pod is None or len(rows) == 0:
            return 0
        key = ns.codes[rows].astype(np.int64) * (len(pod.values) + 1) + pod.codes[rows]
        return len(np.unique(key))

    # --- ids -> rows -----------------------------------------------------------------------

    def row_of(self, sid: int) -> int | None:
        """The row of a live series id; O(log n), merges nothing."""
        row = self._pending.get(sid)
        if row is not None and self.alive[row]:
            return row
        if len(self._sorted_ids) == 0:
            return None
        pos = max(int(np.searchsorted(self._sorted_ids, np.uint64(sid), side="right")) - 1, 0)
        row = int(self._sorted_rows[pos])
        return row if int(self._sorted_ids[pos]) == sid and self.alive[row] else None

    def rows_of(self, ids: np.ndarray) -> np.ndarray:
        """Rows of many ids at once (uint64 array); -1 where the id is not a live series.

        Agents send the same series in the same order every tick, so the rows of a batch of ids
        are remembered by the batch's bytes: checking them (each row live and holding its id)
        touches one cache line per series, where the binary search over a million sorted ids
        touched twenty, and missed cache on most (it was 39% of a live write's time at a million
        series). A remembered batch that fails the check is searched again; rows are never
        reused, so a live row holding the id is that series' row."""
        ids = np.asarray(ids, dtype=np.uint64)
        h = hash(ids.tobytes())
        cached = self._batch_rows.get(h)
        if cached is not None and len(cached) == len(ids) and bool(self.alive[cached].all()) \
                and bool((self.id_column[cached] == ids).all()):
            return cached.astype(np.int64)
        if len(ids) >= SORT_KEYS_MIN and self._n:  # a real Prometheus' request: runs of an order seen before
            guessed, k = self._order.guess(ids, self.id_column, self.alive, self.row_of)
            if k < len(ids):  # searched: the order to guess the next batches from (store/rowruns.py)
                rows = np.concatenate([guessed, self._search(ids[k:])])
                self._order.record(rows[rows >= 0])
            else:
                rows = guessed
        else:
            rows = self._search(ids)
        if len(ids) >= BATCH_CACHE_MIN and bool((rows >= 0).all()):
            if h in self._batch_seen:  # a batch sent again (an agent's, every tick): remember its rows
                if len(self._batch_rows) >= BATCH_CACHE_SIZE:
                    self._batch_rows.clear()
                self._batch_rows[h] = rows.astype(np.int32)
            else:  # the first time: its hash alone (a real Prometheus' batches never repeat)
                if len(self._batch_seen) >= 4 * BATCH_CACHE_SIZE:
                    self._batch_seen.clear()
                self._batch_seen.add(h)
        return rows

    def _search(self, ids: np.ndarray) -> np.ndarray:
        """rows_of by the binary search of the sorted live ids."""
        if self._pending:
            self._merge_pending()
        if self._dead_sorted > max(1024, len(self._sorted_ids) // 4):
            self._rebuild_sorted()
        if len(self._sorted_ids) == 0:
            return np.full(len(ids), -1, dtype=np.int64)
        # Removed series stay in the sorted arrays until the next rebuild (remove() is O(1)); an
        # id removed and added again is there twice, its live row last (stable merge): take the
        # last match and check that its row is live.
        if len(ids) >= SORT_KEYS_MIN:
            # in key order: each search starts where the previous one ended, the probes of
            # neighbouring keys share cache lines (in a batch's own order nearly every probe missed)
            order = np.argsort(ids)
            pos = np.empty(len(ids), np.int64)
            pos[order] = np.searchsorted(self._sorted_ids, ids[order], side="right") - 1
        else:
            pos = np.searchsorted(self._sorted_ids, ids, side="right") - 1
        pos_c = np.maximum(pos, 0)
        cand = self._sorted_rows[pos_c].astype(np.int64)
        found = (self._sorted_ids[pos_c] == ids) & self.alive[cand]
        return np.where(found, cand, -1)

    def _merge_pending(self) -> None:
        """Insert the rows added since into the sorted ids: a sort of the new ones and one O(n)
        insertion, not a sort of every id."""
        rows = np.fromiter(self._pending.values(), dtype=np.int32, count=len(self._pending))
        self._pending.clear()
        new = self.id_column[rows]
        order = np.argsort(new, kind="stable")
        new, rows = new[order], rows[order]
        at = np.searchsorted(self._sorted_ids, new, side="right")  # after equal ids: the newest row last
        self._sorted_ids = np.insert(self._sorted_ids, at, new)
        self._sorted_rows = np.insert(self._sorted_rows, at, rows)

    def _rebuild_sorted(self) -> None:
        self._pending.clear()  # every live row is in the rebuilt arrays
        self._dead_sorted = 0
        live = np.flatnonzero(self.alive[: self._n]).astype(np.int32)
        order = np.argsort(self.id_column[live], kind="stable")
        self._sorted_ids, self._sorted_rows = self.id_column[live][order], live[order]

    # --- adding and removing -----------------------------------------------------------------

    def _grow(self, n: int) -> None:
        if n <= len(self.alive):
            return
        self.alive = grown(self.alive, n, False)
        cap = len(self.alive)
        self.id_column = grown(self.id_column, cap)
        self.pod_hash = grown(self.pod_hash, cap)
        for col in self.columns.values():
            col.codes = grown(col.codes, cap, -1)

    def add(self, sid: int, labels: Labels) -> int:
        """Register a new series and return its row. Raises KeyError if the id is known."""
        if self.row_of(sid) is not None:
            raise KeyError(f"series id {sid:#x} already present")
        self._forget_selected()
        row = self._n
        self._grow(row + 1)
        self._n += 1
        self.alive[row] = True
        self.id_column[row] = sid
        self.pod_hash[row] = pod_hash(pod_key(labels))
        self.n_alive += 1
        self._pending[sid] = row
        self._order.add(row)
        for name, value in labels:
            col = self.columns.get(name)
            if col is None:
                col = self.columns[name] = LabelColumn(len(self.alive))
                self._names = sorted(self.columns)
            vid = col.value_id(value)  # may widen col.codes: index it after
            col.codes[row] = vid
        return row

    def remove(self, row: int) -> None:
        """Tombstone a row: it no longer matches anything; its number is not reused. O(1): the
        sorted ids keep it until a quarter of them are dead (rows_of checks ``alive``)."""
        if not self.alive[row]:
            return
        self._forget_selected()
        self._dead_sorted += 1
        self.alive[row] = False
        self.n_alive -= 1

    # --- labels of rows ------------------------------------------------------------------------

    def labels_of(self, row: int) -> Labels:
        """The row's labels, sorted by name (from its codes)."""
        out = []
        for name in self._names:
            col = self.columns[name]
            code = int(col.codes[row])
            if code >= 0:
                out.append((name, col.values[code]))
        return tuple(out)

    def label_columns(self, rows: np.ndarray) -> LabelColumns:
        """The rows' labels as codes (label names no row has are left out); the value tables are
        the index's own, which only ever grow, so the codes stay valid."""
        rows = np.asarray(rows, dtype=np.int64)
        names, codes, values = [], [], []
        for name in self._names:
            col = self.columns[name]
            c = col.codes[rows]
            if len(c) and bool((c >= 0).any()):
                names.append(name)
                codes.append(c.astype(np.int32, copy=False))  # whatever the column's own width
                values.append(col.values)
        return LabelColumns(names, codes, values, len(rows))

    def live_rows(self) -> Iterable[int]:
        return np.flatnonzero(self.alive[: self._n]).tolist()

    # --- selection -------------------------------------------------------------------------

    def _table(self, col: LabelColumn, m: Matcher) -> np.ndarray:
        """For each value code of the column (+1: index 0 is 'absent'), does it match. A regex's
        table is kept and extended with the values added since, so it runs once per value."""
        n = len(col.values)
        if m.op is MatchOp.EQ or m.op is MatchOp.NEQ:
            lut = np.full(n + 1, m.op is MatchOp.NEQ, dtype=bool)
            lut[0] = m.matches("")
            vid = col.ids.get(m.value)
            if vid is not None:
                lut[vid + 1] = m.op is MatchOp.EQ
            return lut
        have = self._tables.get(m)
        if have is not None and len(have) == n + 1:
            return have
        done = 0 if have is None else len(have) - 1
        lut = np.empty(n + 1, dtype=bool)
        if have is not None:
            lut[: done + 1] = have
        else:
            lut[0] = m.matches("")
        lut[done + 1 :] = [m.matches(v) for v in col.values[done:]]
        if len(self._tables) >= MAX_MATCH_TABLES or self._table_bytes + lut.nbytes > MAX_MATCH_TABLE_BYTES:
            self._tables.clear()
            self._table_bytes = 0
        self._table_bytes += lut.nbytes - (0 if have is None else have.nbytes)
        self._tables[m] = lut
        return lut

    def select(self, matchers: Sequence[Matcher]) -> np.ndarray:
        """Rows (increasing int32) of live series matching every matcher.

        Matchers that the empty value does not satisfy need their label: the one whose postings
        are smallest seeds the candidates (past a quarter of the rows, every live row is taken
        instead); every other matcher filters them, an equality by comparing codes, the others
        through their lookup tables. Without such a matcher the candidates are every live row."""
        n = self._n
        # (column, code for an equality, or the lookup table, whether it needs the label)
        conds: list[tuple[LabelColumn, int, np.ndarray | None, bool]] = []
        cond: tuple[LabelColumn, int, np.ndarray | None, bool]
        seed_at, seed_size = -1, n + 1
        for m in matchers:
            col = self.columns.get(m.name)
            if col is None:
                if not m.matches(""):
                    return EMPTY_ROWS.copy()
                continue  # every series lacks the label, and the empty value matches
            if m.op is MatchOp.EQ and m.value:
                vid = col.ids.get(m.value)
                if vid is None:
                    return EMPTY_ROWS.copy()
                hits, cond = np.array([vid]), (col, vid, None, True)
            else:
                lut = self._table(col, m)
                cond = (col, -1, lut, not lut[0])
                hits = np.flatnonzero(lut[1:]) if not lut[0] else np.zeros(0, np.int64)
                if not lut[0] and len(hits) == 0:
                    return EMPTY_ROWS.copy()
            if cond[3]:
                size = col.postings_size(hits, n) if len(hits) <= 64 else n
                if size < seed_size:
                    seed_at, seed_size = len(conds), size
            conds.append(cond)
        if seed_at >= 0 and seed_size <= n // 4:
            col, vid, table, _ = conds.pop(seed_at)
            cand = col.postings(np.array([vid]) if table is None else np.flatnonzero(table[1:]), n)
            cand = cand[self.alive[cand]]
        else:
            cand = np.flatnonzero(self.alive[:n]).astype(np.int32)
        for col, vid, table, _ in sorted(conds, key=lambda c: not c[3]):  # label-requiring matchers first
            if len(cand) == 0:
                break
            codes = col.codes[cand]
            cand = cand[codes == vid] if table is None else cand[table[codes + 1]]
        return cand

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
        codes = col.codes[: self._n][self.alive[: self._n]] if rows is None else col.codes[rows]
        present = np.unique(codes[codes >= 0])
        return sorted(col.values[i] for i in present.tolist())

    def label_names(self) -> list[str]:
        return sorted(self.columns)

    def group_codes(self, rows: np.ndarray, by: Sequence[str]) -> tuple[list[Labels], np.ndarray]:
        """Group rows by the values of ``by``: (group label sets sorted, group index per row).

        Vectorised, because an answer grouped by pod and container has tens of thousands of
        groups: LabelColumns.group folds the codes into one key per row."""
        if not by:
            return [()], np.zeros(len(rows), dtype=np.int64)
        groups, idx = self.label_columns(rows).keep(by).group(sorted(set(by)), True)
        return groups.to_list(), idx

    def pods_with_prefix(self, prefix: str) -> Iterator[str]:
        """Pod keys (namespace/pod) of live series that start with ``prefix``, sorted."""
        ns, pod = self.columns.get("namespace"), self.columns.get("pod")
        if ns is None or pod is None:
            return iter(())
        rows = np.flatnonzero(self.alive[: self._n] & (ns.codes[: self._n] >= 0) & (pod.codes[: self._n] >= 0))
        keys = {f"{ns.values[a]}/{pod.values[b]}" for a, b in zip(ns.codes[rows].tolist(), pod.codes[rows].tolist(),
                                                                    strict=True)}
        return iter(sorted(k for k in keys if k.startswith(prefix)))

    def _check(self) -> None:
        """Invariants, for randomised tests: every structure agrees with the label codes."""
        n = self._n
        live = np.flatnonzero(self.alive[:n])
        assert self.n_alive == len(live)
        for col in self.columns.values():
            assert len(col.codes) >= n and len(col.values) == len(col.ids)
            assert all(col.ids[v] == i for i, v in enumerate(col.values))
            for c in range(len(col.post_start) - 1):
                rows = col.post_rows[col.post_start[c] : col.post_start[c + 1]]
                assert bool((col.codes[rows] == c).all()) and bool(np.all(np.diff(rows) > 0))
            assert len(col.post_rows) == int((col.codes[: col.built] >= 0).sum())
        for r in live.tolist():
            labels = self.labels_of(r)
            assert int(self.pod_hash[r]) == pod_hash(pod_key(labels))
            assert self.row_of(int(self.id_column[r])) == r
        got = self.rows_of(self.id_column[:n]) if n else np.zeros(0, np.int64)
        for r, g in enumerate(got.tolist()):
            # a dead row's id may belong to a newer row of the same series (written again after retention)
            assert g == r if self.alive[r] else (g == -1 or (g > r and bool(self.alive[g])))
