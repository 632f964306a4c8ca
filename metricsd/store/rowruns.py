"""A write batch's rows guessed from the order of earlier batches, each run checked with one compare.

A real Prometheus writes its scrapes in the same order every interval, cut into requests of ~500
samples by count (each remote-write shard its own series, in the same order every time), and a
proxy's part for a store keeps that order. So a request's ids are one or a few runs of a sequence
the store has seen before: the rows of the batches it wrote, in the order they came.
:class:`RowOrder` keeps that sequence (every new series' row as it is added, and each batch the
guess could not find), and a batch is answered by comparing ``id_column[order[q:q + n]]`` with its
ids, not by a binary search of each id over every live id (the searchsorted, its argsort and the
gathers were ~15% of a store's write of a real Prometheus' request, perf/RESULTS.md issue 24
session 42).

A guessed row is taken only where it is live and holds the id; rows are never reused, so that row
is the series' row, whatever put it in the sequence. What the guess misses goes to the search.
Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

__all__ = ["RUNS_TRIED", "RUN_MIN", "RowOrder"]

RUNS_TRIED = 4
"""Runs guessed in one batch at most (a request spanning two targets' scrapes is two runs, a
series gone or new in between splits one); what is left after them is searched."""

RUN_MIN = 8
"""A run shorter than this ends the guessing: the batch is in no order seen before (ids picked at
random, a sender of its own order), and each further guess would cost more than it finds."""


class RowOrder:
    """Rows in the order they were written: a ring of ``order`` (a quarter more slots than rows,
    4 bytes each) and each row's place in it (``where``, 4 bytes a row). Old places are
    overwritten as the ring turns; a place is checked before it is used."""

    def __init__(self) -> None:
        self.order = np.zeros(1024, dtype=np.int32)
        self.where = np.zeros(1024, dtype=np.int32)  # per row: its place in ``order`` + 1 (0: none)
        self.end = 0  # where the next row recorded goes
        self.next = 0  # the place after the last batch's last row: where the next batch likely starts

    def _fit(self, n_rows: int) -> None:
        if n_rows > len(self.where):
            self.where = np.concatenate([self.where, np.zeros(max(n_rows, 2 * len(self.where)) - len(self.where),
                                                              dtype=np.int32)])
        want = n_rows + n_rows // 4
        if want > len(self.order):
            self.order = np.concatenate([self.order, np.zeros(max(want, 2 * len(self.order)) - len(self.order),
                                                              dtype=np.int32)])

    def add(self, row: int) -> None:
        """A new series' row, after the rows recorded before it."""
        self._fit(row + 1)
        if self.end >= len(self.order):
            self.end = 0
        self.order[self.end] = row
        self.end += 1
        self.where[row] = self.end

    def record(self, rows: np.ndarray) -> None:
        """A batch's rows (each a live row), in its order: the next batches of its sender are guessed
        from them."""
        n = len(rows)
        if n == 0:
            return
        self._fit(int(rows.max()) + 1)
        if n > len(self.order):
            return
        if self.end + n > len(self.order):
            self.end = 0
        self.order[self.end : self.end + n] = rows
        self.where[rows] = np.arange(self.end + 1, self.end + n + 1, dtype=np.int32)
        self.end += n

    def _place(self, row: int) -> int:
        """The row's place in ``order`` (-1: none, or overwritten since)."""
        if row >= len(self.where):
            return -1
        p = int(self.where[row]) - 1
        return p if 0 <= p < len(self.order) and int(self.order[p]) == row else -1

    def guess(self, ids: np.ndarray, id_column: np.ndarray, alive: np.ndarray, row_of: Callable[[int], int | None]
              ) -> tuple[np.ndarray, int]:
        """(rows, k): the rows of ``ids[:k]`` (int64, -1 for an id of no live series), guessed as
        runs of the recorded order; ``ids[k:]`` are left for the caller to search (k == len(ids):
        all found). The first run starts where the last batch ended if that place holds ``ids[0]``,
        each other run at the place of ``row_of`` its first id (None: not a live series).
        ``id_column`` / ``alive``: the index's, every recorded row within them."""
        n = len(ids)
        rows = np.empty(n, dtype=np.int64)
        at = 0
        q = self.next
        cap = len(self.order)
        for _ in range(RUNS_TRIED):
            if at == n:
                break
            sid = int(ids[at])
            if not (0 <= q < cap and int(id_column[self.order[q]]) == sid and bool(alive[self.order[q]])):
                found = row_of(sid)
                q = -1 if found is None else self._place(found)
                if q < 0:  # not a live series, or one the order does not place: a run of one
                    rows[at] = -1 if found is None else found
                    at += 1
                    continue
            m = min(n - at, cap - q)
            cand = self.order[q : q + m]
            same = id_column[cand] == ids[at : at + m]
            same &= alive[cand]
            miss = np.flatnonzero(~same)
            k = int(miss[0]) if len(miss) else m
            rows[at : at + k] = cand[:k]
            at += k
            q += k
            if k < RUN_MIN:
                break
        self.next = q
        return rows[:at], at
