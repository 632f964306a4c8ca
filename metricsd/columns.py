"""Many series as columns: label codes and flat sample arrays, the form a selection travels in.

A selection over tens of thousands of series goes from the store to the PromQL evaluator (and
to the HTTP API's series lookups) as a few arrays instead of a Python object per series:

- :class:`LabelColumns`: for each label name, an int32 code per series (-1 where the series lacks
  the label) into that name's table of values. The store's index keeps its labels this way
  already (metricsd/store/index.py), so a selection's labels are a gather of its rows' codes.
- :class:`SeriesColumns`: the labels, plus every series' samples back to back (``offsets[i]:
  offsets[i + 1]`` is series i), and the series ids when they come from a store.

Everything here is pure and vectorised: one NumPy call per column or per batch, a Python step per
distinct label value at most (sorting a column's values, grouping), and per series only where an
answer must list series (:meth:`LabelColumns.to_list`). Value tables may be shared with the
store's index (append-only lists), so a code always names the same value.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from metricsd.model import Labels

__all__ = ["LabelColumns", "SeriesColumns", "search_each"]

_EMPTY_CODES = np.zeros(0, dtype=np.int32)


class LabelColumns:
    """Labels of ``n`` series as codes: ``codes[j][i]`` is series i's value of ``names[j]`` as an
    index into ``values[j]``, or -1. ``names`` are sorted and distinct; columns may be all -1.

    Immutable by convention: operations return new objects and share arrays and tables."""

    __slots__ = ("codes", "n", "names", "values")

    def __init__(self, names: Sequence[str], codes: Sequence[np.ndarray], values: Sequence[Sequence[str]],
                 n: int | None = None) -> None:
        self.names: tuple[str, ...] = tuple(names)
        self.codes: tuple[np.ndarray, ...] = tuple(codes)
        self.values: tuple[Sequence[str], ...] = tuple(values)
        self.n = len(self.codes[0]) if self.codes else (n or 0)
        if not len(self.names) == len(self.codes) == len(self.values):
            raise ValueError("names, codes and values must have one entry per label name")
        if list(self.names) != sorted(set(self.names)):
            raise ValueError("label names must be sorted and distinct")

    @classmethod
    def empty(cls, n: int = 0) -> LabelColumns:
        """``n`` series without labels."""
        return cls((), (), (), n)

    @classmethod
    def from_labels(cls, labels: Sequence[Labels]) -> LabelColumns:
        """From label tuples (a Python step per label of each series: for small inputs and old
        wire forms)."""
        tables: dict[str, dict[str, int]] = {}
        for lab in labels:
            for k, v in lab:
                tables.setdefault(k, {}).setdefault(v, len(tables[k]))
        names = sorted(tables)
        codes = {k: np.full(len(labels), -1, dtype=np.int32) for k in names}
        for i, lab in enumerate(labels):
            for k, v in lab:
                codes[k][i] = tables[k][v]
        return cls(names, [codes[k] for k in names], [list(tables[k]) for k in names], len(labels))

    def __len__(self) -> int:
        return self.n

    def labels_at(self, i: int) -> Labels:
        return tuple((name, vals[int(c[i])]) for name, c, vals in zip(self.names, self.codes, self.values, strict=True)
                     if c[i] >= 0)

    def to_list(self) -> list[Labels]:
        """Every series' label tuple (one tuple per series, label pairs shared between series)."""
        if not self.names:
            return [()] * self.n
        cols = []
        for name, c, vals in zip(self.names, self.codes, self.values, strict=True):
            used = np.unique(c)
            pairs: dict[int, tuple[str, str] | None] = {int(k): (name, vals[int(k)]) for k in used if k >= 0}
            pairs[-1] = None
            cols.append([pairs[k] for k in c.tolist()])
        return [tuple(p for p in row if p is not None) for row in zip(*cols, strict=True)]

    def take(self, idx: np.ndarray) -> LabelColumns:
        """The series at ``idx`` (indices or a boolean mask), in that order."""
        idx = np.asarray(idx)
        n = int(idx.sum()) if idx.dtype == bool else len(idx)
        return LabelColumns(self.names, [c[idx] for c in self.codes], self.values, n)

    def keep(self, names: Iterable[str]) -> LabelColumns:
        """Only the columns of ``names`` (the others dropped)."""
        wanted = set(names)
        j = [i for i, k in enumerate(self.names) if k in wanted]
        return LabelColumns([self.names[i] for i in j], [self.codes[i] for i in j], [self.values[i] for i in j], self.n)

    def drop(self, names: Iterable[str]) -> LabelColumns:
        gone = set(names)
        return self.keep(k for k in self.names if k not in gone)

    def column(self, name: str) -> tuple[np.ndarray, Sequence[str]] | None:
        if name not in self.names:
            return None
        j = self.names.index(name)
        return self.codes[j], self.values[j]

    def present_names(self) -> list[str]:
        """The label names at least one series has."""
        return [k for k, c in zip(self.names, self.codes, strict=True) if len(c) and bool((c >= 0).any())]

    def values_of(self, name: str) -> list[str]:
        """The distinct values of ``name`` among the series, sorted."""
        col = self.column(name)
        if col is None:
            return []
        codes, vals = col
        used = np.unique(codes)
        return sorted(vals[int(k)] for k in used[used >= 0])

    def ranks(self, j: int) -> np.ndarray:
        """Per code of column j, its value's rank among the values the series use (sorted order);
        codes no series uses get rank 0. A Python step per distinct value used."""
        c, vals = self.codes[j], self.values[j]
        used = np.unique(c)
        used = used[used >= 0]
        order = sorted(range(len(used)), key=lambda i: vals[int(used[i])])
        ranks = np.zeros(int(used[-1]) + 1 if len(used) else 0, dtype=np.int64)
        ranks[used[np.asarray(order, dtype=np.int64)]] = np.arange(len(used))
        return ranks

    def sort_order(self) -> np.ndarray:
        """The permutation that sorts the series as their label tuples sort (Labels compare pair
        by pair, names first): column j's key is the value's rank + 1 where the label is present;
        where it is absent, the series' next pair has a greater name, so it sorts after every
        present value, unless the series has no later label, and then it sorts first (a prefix)."""
        k = len(self.names)
        if self.n < 2 or k == 0:
            return np.arange(self.n, dtype=np.int64)
        present = [c >= 0 for c in self.codes]
        later = np.zeros(self.n, dtype=bool)  # some label after column j is present
        keys: list[np.ndarray] = [np.zeros(0, np.int64)] * k
        for j in range(k - 1, -1, -1):
            ranks = self.ranks(j)
            big = len(ranks) + 2
            c = self.codes[j]
            key = np.where(present[j], ranks[np.maximum(c, 0)] + 1 if len(ranks) else 1, np.where(later, big, 0))
            keys[j] = key
            later |= present[j]
        return np.lexsort(keys[::-1])

    def group(self, names: Sequence[str], by: bool, always_drop: Sequence[str] = ()) -> tuple[LabelColumns, np.ndarray]:
        """Group the series by the labels ``names`` (``by``) or by all labels but ``names`` and
        ``always_drop`` (``without``): (the groups' labels, each series' group number). Groups are
        numbered in their label tuples' order. Vectorised: the kept columns' codes fold into one
        int64 key per series (codes are renumbered densely first, so the key stays small)."""
        kept = self.keep(names) if by else self.drop([*names, *always_drop])
        if kept.n == 0:
            return LabelColumns(kept.names, [_EMPTY_CODES] * len(kept.names), kept.values, 0), np.zeros(0, np.int64)
        if not kept.names:
            return LabelColumns.empty(1), np.zeros(kept.n, dtype=np.int64)
        dense, sizes, tables = [], [], []
        for c in kept.codes:
            used, inv = np.unique(c, return_inverse=True)  # -1 (absent) first when present
            dense.append(inv.reshape(-1).astype(np.int64))
            sizes.append(len(used))
            tables.append(used)
        if math.prod(sizes) < 2**62:
            key = dense[0]
            for d, size in zip(dense[1:], sizes[1:], strict=True):
                key = key * size + d
            uniq, inverse = np.unique(key, return_inverse=True)
            ucodes: list[np.ndarray] = [np.zeros(0, np.int64)] * len(dense)
            for j in range(len(dense) - 1, -1, -1):
                ucodes[j] = uniq % sizes[j]
                uniq = uniq // sizes[j]
        else:
            stacked, inverse = np.unique(np.stack(dense, axis=1), axis=0, return_inverse=True)
            ucodes = [stacked[:, j] for j in range(len(dense))]
        groups = LabelColumns(kept.names, [t[u].astype(np.int32) for t, u in zip(tables, ucodes, strict=True)],
                              kept.values, len(ucodes[0]))
        order = groups.sort_order()
        rank = np.empty(len(order), dtype=np.int64)
        rank[order] = np.arange(len(order))
        return groups.take(order), rank[inverse.reshape(-1)]

    @staticmethod
    def concat(parts: Sequence[LabelColumns]) -> LabelColumns:
        """The series of every part, in order; value tables are merged (a Python step per distinct
        value of each part's columns)."""
        parts = [p for p in parts if p.n] or list(parts[:1])
        if not parts:
            return LabelColumns.empty()
        if len(parts) == 1:
            return parts[0]
        names = sorted({k for p in parts for k in p.names})
        out_codes: list[np.ndarray] = []
        out_values: list[Sequence[str]] = []
        for name in names:
            cols = [p.column(name) for p in parts]
            tables = {id(c[1]) for c in cols if c is not None}
            if len(tables) == 1:  # one table for all (one store's index): no renumbering
                vals = next(c[1] for c in cols if c is not None)
                out_codes.append(np.concatenate([c[0] if c is not None else np.full(p.n, -1, np.int32)
                                                 for c, p in zip(cols, parts, strict=True)]).astype(np.int32))
                out_values.append(vals)
                continue
            table: dict[str, int] = {}
            pieces = []
            for c, p in zip(cols, parts, strict=True):
                if c is None:
                    pieces.append(np.full(p.n, -1, dtype=np.int32))
                    continue
                codes, vals = c
                used = np.unique(codes)
                used = used[used >= 0]
                remap = np.full(int(used[-1]) + 2 if len(used) else 1, -1, dtype=np.int32)  # [-1] stays -1
                for u in used.tolist():
                    remap[u] = table.setdefault(vals[u], len(table))
                pieces.append(remap[codes])
            out_codes.append(np.concatenate(pieces))
            out_values.append(list(table))
        return LabelColumns(names, out_codes, out_values, sum(p.n for p in parts))


def search_each(ts: np.ndarray, offsets: np.ndarray, times: np.ndarray) -> np.ndarray:
    """For each series i of the flat array, ``offsets[i] + searchsorted(series_i, times, "right")``
    (series x times).

    A NumPy call per series costs microseconds, which dominates with thousands of series;
    searching one key of (series number, time) removes that loop."""
    rows = offsets.size - 1
    times = np.asarray(times, dtype=np.int64)
    if rows == 0 or ts.size == 0:
        return np.repeat(offsets[:-1, None], times.size, axis=1)
    if rows == 1:  # one series (a panel of one pod): one search, none of the key's six calls
        lo = int(offsets[0])
        return (lo + np.searchsorted(ts[lo:int(offsets[1])], times, side="right"))[None, :]
    base = min(int(ts.min()), int(times.min()))
    span = max(int(ts.max()), int(times.max())) - base + 1
    if span * (rows + 1) < 2**62:
        sid = np.repeat(np.arange(rows, dtype=np.int64), np.diff(offsets))
        key = sid * span + (ts - base)
        row = (np.arange(rows, dtype=np.int64) * span)[:, None]
        return np.searchsorted(key, row + (times - base)[None, :], side="right")
    return np.stack(
        [offsets[i] + np.searchsorted(ts[offsets[i] : offsets[i + 1]], times, side="right") for i in range(rows)]
    )


@dataclass(frozen=True)
class SeriesColumns:
    """Series and their samples: series i holds ``timestamps[offsets[i]:offsets[i + 1]]`` (int64
    ms, increasing) and the same slice of ``values`` (float64, stale markers included)."""

    labels: LabelColumns
    offsets: np.ndarray  # int64, len(labels) + 1
    timestamps: np.ndarray
    values: np.ndarray
    ids: np.ndarray | None = None  # uint64 series ids, from a store

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def samples(self) -> int:
        return int(self.timestamps.size)

    @property
    def counts(self) -> np.ndarray:
        return np.diff(self.offsets)

    @classmethod
    def empty(cls) -> SeriesColumns:
        return cls(LabelColumns.empty(), np.zeros(1, np.int64), np.zeros(0, np.int64), np.zeros(0), None)

    @classmethod
    def from_arrays(cls, labels: Sequence[Labels], ts: Sequence[np.ndarray], vals: Sequence[np.ndarray],
                    ids: np.ndarray | None = None) -> SeriesColumns:
        sizes = np.fromiter((len(t) for t in ts), dtype=np.int64, count=len(ts))
        offsets = np.concatenate([np.zeros(1, np.int64), np.cumsum(sizes)])
        t = np.concatenate(ts).astype(np.int64, copy=False) if len(ts) else np.zeros(0, np.int64)
        v = np.concatenate(vals).astype(np.float64, copy=False) if len(vals) else np.zeros(0)
        return cls(LabelColumns.from_labels(labels), offsets, t, v, ids)

    def series_at(self, i: int) -> tuple[Labels, np.ndarray, np.ndarray]:
        lo, hi = int(self.offsets[i]), int(self.offsets[i + 1])
        return self.labels.labels_at(i), self.timestamps[lo:hi], self.values[lo:hi]

    def take(self, idx: np.ndarray) -> SeriesColumns:
        """The series at ``idx`` (indices, in that order), samples gathered in one step."""
        idx = np.asarray(idx, dtype=np.int64)
        lo, hi = self.offsets[:-1][idx], self.offsets[1:][idx]
        return self._gather(idx, lo, hi)

    def window(self, start_ms: int, end_ms: int, keep_empty: bool = False) -> SeriesColumns:
        """Each series' samples in [start_ms, end_ms]; series left without samples are dropped
        unless ``keep_empty``."""
        if self.timestamps.size == 0 or (int(self.timestamps.min()) >= start_ms and
                                         int(self.timestamps.max()) <= end_ms):
            if keep_empty:
                return self
            idx = np.flatnonzero(np.diff(self.offsets) > 0)
            return self if len(idx) == len(self) else self.take(idx)
        bounds = search_each(self.timestamps, self.offsets, np.array([start_ms - 1, end_ms], dtype=np.int64))
        lo, hi = bounds[:, 0], bounds[:, 1]
        idx = np.arange(len(self), dtype=np.int64) if keep_empty else np.flatnonzero(hi > lo)
        return self._gather(idx, lo[idx], hi[idx])

    def _gather(self, idx: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> SeriesColumns:
        counts = hi - lo
        offsets = np.concatenate([np.zeros(1, np.int64), np.cumsum(counts)])
        flat = np.repeat(lo - offsets[:-1], counts) + np.arange(int(offsets[-1]), dtype=np.int64)
        return SeriesColumns(self.labels.take(idx), offsets, self.timestamps[flat], self.values[flat],
                             None if self.ids is None else self.ids[idx])

    @staticmethod
    def concat(parts: Sequence[SeriesColumns]) -> SeriesColumns:
        if not parts:
            return SeriesColumns.empty()
        if len(parts) == 1:
            return parts[0]
        sizes = [p.samples for p in parts]
        shift = np.cumsum([0, *sizes[:-1]])
        offsets = np.concatenate([np.zeros(1, np.int64)]
                                 + [p.offsets[1:] + s for p, s in zip(parts, shift, strict=True)])
        id_parts = [p.ids for p in parts if p.ids is not None]
        ids = np.concatenate(id_parts) if len(id_parts) == len(parts) else None
        return SeriesColumns(LabelColumns.concat([p.labels for p in parts]), offsets,
                             np.concatenate([p.timestamps for p in parts]), np.concatenate([p.values for p in parts]),
                             ids)
