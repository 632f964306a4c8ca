"""One label name of the series index: its distinct values, a code per row, postings by code.

metricsd/store/index.py keeps one ``LabelColumn`` per label name; a series' labels are its codes
across them, and a selection seeds its candidates from a column's postings (the rows of a value as
one sorted array, CSR, rebuilt lazily: the rows added since are scanned from the codes).

A code is as narrow as the column's values allow: int8 while it has fewer than 127 values, int16
below 32,767, then int32 (the column is widened in one copy when a value past its type arrives).
Most label names have a handful of values (cluster, namespace, container, resource, unit, the
metric name): at 200,000 series the nine columns of the pod workload took 36 bytes a series as
int32 and take 13 (perf/RESULTS.md, session 44). The largest code is kept one below the type's
maximum, so ``codes + 1`` (a lookup table's index, absent = 0) never overflows.
"""

from __future__ import annotations

import numpy as np

__all__ = ["CODE_TYPES", "EMPTY_ROWS", "LabelColumn", "grown"]

EMPTY_ROWS = np.zeros(0, dtype=np.int32)

CODE_TYPES = (np.dtype(np.int8), np.dtype(np.int16), np.dtype(np.int32))
"""A column's code types, narrowest first; a column starts at the first and widens as values arrive."""


def grown(arr: np.ndarray, n: int, fill: int | bool = 0) -> np.ndarray:
    """``arr`` with room for at least ``n`` rows, growing by a quarter (doubling wastes up to half)."""
    if n <= len(arr):
        return arr
    out = np.full(max(n, len(arr) + max(1024, len(arr) // 4)), fill, dtype=arr.dtype)
    out[: len(arr)] = arr
    return out


class LabelColumn:
    """One label name: its distinct values, a code per row, and postings by code."""

    __slots__ = ("built", "codes", "ids", "limit", "post_rows", "post_start", "values")

    def __init__(self, capacity: int) -> None:
        self.values: list[str] = []  # code -> value; append-only (selections share it)
        self.ids: dict[str, int] = {}
        self.codes = np.full(capacity, -1, dtype=CODE_TYPES[0])
        self.limit = int(np.iinfo(CODE_TYPES[0]).max)  # the codes' type's maximum (np.iinfo is slow)
        # postings of rows [0, built): rows by (code, row); code c: post_rows[post_start[c]:post_start[c + 1]]
        self.built = 0
        self.post_rows = EMPTY_ROWS
        self.post_start = np.zeros(1, dtype=np.int64)

    def value_id(self, value: str) -> int:
        vid = self.ids.get(value)
        if vid is None:
            vid = len(self.values)
            if vid >= self.limit:  # codes + 1 must fit too
                self._widen(vid)
            self.ids[value] = vid
            self.values.append(value)
        return vid

    def _widen(self, vid: int) -> None:
        """The codes in the narrowest type that holds ``vid + 1``: one copy of the column, at most
        twice in its life."""
        for t in CODE_TYPES:
            if vid < np.iinfo(t).max:
                self.codes = self.codes.astype(t)
                self.limit = int(np.iinfo(t).max)
                return
        raise OverflowError(f"more than {np.iinfo(CODE_TYPES[-1]).max - 1} values of one label name")

    def build(self, n_rows: int) -> None:
        codes = self.codes[:n_rows]
        has = np.flatnonzero(codes >= 0)
        order = np.argsort(codes[has], kind="stable")
        self.post_rows = has[order].astype(np.int32)
        counts = np.bincount(codes[has], minlength=len(self.values))
        self.post_start = np.zeros(len(self.values) + 1, dtype=np.int64)
        np.cumsum(counts, out=self.post_start[1 : len(counts) + 1])
        self.post_start[len(counts) + 1 :] = self.post_start[len(counts)]
        self.built = n_rows

    def refresh(self, n_rows: int) -> None:
        """Rebuild the postings once the rows added since are more than an eighth of all (their
        codes are scanned meanwhile): O(n log n) now and then instead of a list per value."""
        if n_rows - self.built > max(1024, n_rows // 8):
            self.build(n_rows)

    def postings(self, hits: np.ndarray, n_rows: int) -> np.ndarray:
        """Increasing rows whose code is one of ``hits`` (sorted codes), dead rows included."""
        self.refresh(n_rows)
        known = hits[hits < len(self.post_start) - 1]
        parts = [self.post_rows[self.post_start[h] : self.post_start[h + 1]] for h in known.tolist()]
        if self.built < n_rows:
            tail = self.codes[self.built : n_rows]
            want = np.zeros(len(self.values) + 1, dtype=bool)
            want[hits] = True
            parts.append((np.flatnonzero(want[tail]) + self.built).astype(np.int32))
        if not parts:
            return EMPTY_ROWS
        if len(parts) == 1:
            return parts[0]
        return np.sort(np.concatenate(parts))

    def postings_size(self, hits: np.ndarray, n_rows: int) -> int:
        """At least len(postings(hits)): the built postings' share, and every row added since."""
        self.refresh(n_rows)
        known = hits[hits < len(self.post_start) - 1]
        built = int((self.post_start[known + 1] - self.post_start[known]).sum())
        return built + (n_rows - self.built)
