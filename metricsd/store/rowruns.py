"""A write batch's rows guessed as runs of consecutive rows, each run checked with one slice compare.

A store gives a series its row when the series first arrives (store/index.py), so rows follow the
order the series were first written in. A real Prometheus writes its scrapes in the same order
every interval, cut into requests of ~500 samples by count, so a request's ids are one or two runs
of consecutive rows, and its first row is the one after the previous request's last (a proxy's
part for a store keeps that order: the store's rows were made from its own parts). Such a batch
is answered by comparing ``id_column[r:r + n]`` with the ids, not by a binary search of each id over
every live id (the searchsorted, its argsort and the gathers were ~15% of a store's write of a
real Prometheus' request, perf/RESULTS.md issue 24 session 42).

A guessed row is taken only where it is live and holds the id; rows are never reused, so that row
is the series' row, and what the guess misses goes to the search. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

__all__ = ["RUNS_TRIED", "RUN_MIN", "rows_by_runs"]

RUNS_TRIED = 4
"""Runs guessed in one batch at most (a request spanning two targets' scrapes is two runs, a
series gone or new in between splits one); what is left after them is searched."""

RUN_MIN = 8
"""A run shorter than this ends the guessing: the batch is in no order of rows (ids picked at
random, a sender of its own order), and each further guess would cost more than it finds."""


def rows_by_runs(ids: np.ndarray, id_column: np.ndarray, alive: np.ndarray, n_rows: int, start: int,
                 row_of: Callable[[int], int | None]) -> tuple[np.ndarray, int]:
    """(rows, k): the rows of ``ids[:k]`` (int64, -1 for an id of no live series), guessed as
    runs of consecutive rows; ``ids[k:]`` are left for the caller to search (k == len(ids): all
    found). The first run starts at row ``start`` if that row holds ``ids[0]``, each other run at
    ``row_of`` of its first id (None: not a live series). ``id_column`` / ``alive``: the index's,
    ``n_rows`` rows in use."""
    n = len(ids)
    rows = np.empty(n, dtype=np.int64)
    at = 0
    for _ in range(RUNS_TRIED):
        if at == n:
            break
        sid = int(ids[at])
        if not (at == 0 and 0 <= start < n_rows and int(id_column[start]) == sid and bool(alive[start])):
            found = row_of(sid)
            if found is None:
                rows[at] = -1
                at += 1
                continue
            start = found
        m = min(n - at, n_rows - start)
        same = id_column[start : start + m] == ids[at : at + m]
        same &= alive[start : start + m]
        miss = np.flatnonzero(~same)
        k = int(miss[0]) if len(miss) else m
        rows[at : at + k] = np.arange(start, start + k)
        at += k
        if k < RUN_MIN:
            break
        start = -1
    return rows[:at], at
