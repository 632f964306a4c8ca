"""Which samples of an acknowledged batch go onward: each series' samples in increasing time, each
timestamp once.

The tee (tee.py) sees every batch acknowledged through this process. A client that retries a
batch whose acknowledgement it lost sends samples already queued; a sender's late sample is
older than one already queued. Both are left out here, so the onward stream of every series is
strictly increasing in time, which is what a Prometheus receiver requires (it refuses a whole
request with 400 for one sample out of order) and what makes a retried batch cost nothing.

It also says which series of a batch are new to the buffer's current segment (``Filtered.fresh``):
the tee passes each series' labels once per segment (buffer.py), and this table already has the
series' row, so the buffer need not look the ids up again.

Pure and vectorised: per batch a few NumPy calls, never a Python object per sample. Series live in
an IdTable (idtable.py) with the newest timestamp queued and the generation (the buffer's segment)
of their last batch let through. Bounded by ``forget``: the tee forgets series that queued nothing
for a whole segment of the buffer (tee.py). Not thread-safe.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from metricsd.onward.idtable import IdTable
from metricsd.onward.records import Columns

__all__ = ["Filtered", "Rows", "Watermark"]

_NONE = np.iinfo(np.int64).min
_NEVER = -1


@dataclass(frozen=True, slots=True)
class Rows:
    rows: np.ndarray  # per id, its row in the table (-1: not known)
    version: int  # the table's version they were found in
    generation: int = -1  # the generation the known ones were marked in use in


@dataclass(frozen=True, slots=True)
class Filtered:
    columns: Columns  # what goes onward (entries left without samples are removed)
    duplicate: int  # samples at a timestamp already queued for their series
    out_of_order: int  # samples older than their series' newest queued sample
    fresh: np.ndarray  # ids (each once) of the series of ``columns`` with no batch let through in this generation


class Watermark:
    """Per series id: the newest timestamp queued, and the generation of its last batch let through."""

    def __init__(self) -> None:
        # seen: the generation of the series' last batch let through (its labels are in that
        # segment); used: the last generation it was looked up or let through in (the bound).
        self.table = IdTable(newest=int(_NONE), seen=_NEVER, used=_NEVER)

    def __len__(self) -> int:
        return len(self.table)

    @property
    def ids(self) -> np.ndarray:
        return self.table.ids

    def known(self, ids: np.ndarray) -> np.ndarray:
        """A bool per id: is it a series seen before?"""
        return self.table.find(ids) >= 0

    def rows(self, ids: np.ndarray, generation: int) -> Rows:
        """The ids' rows (-1: not known), the known ones marked in use in ``generation``, so that
        ``forget`` keeps them until a batch of theirs arrives; ``take`` may be given them."""
        rows = self.table.find(ids)
        self.table.cols["used"][rows[rows >= 0]] = generation  # generations only grow
        return Rows(rows, self.table.version, generation)

    def add(self, ids: np.ndarray) -> None:
        """Make ``ids`` known (those already known are left as they are)."""
        if len(ids):
            self.table.add(ids)

    def take(self, cols: Columns, generation: int = 0, looked_up: Rows | None = None) -> Filtered:
        """The samples of ``cols`` newer than their series' watermark, which then moves to the
        newest of them. Every id must be known (``add``). Within an entry timestamps increase.
        ``generation`` never decreases from one call to the next.
        ``looked_up``: what ``rows(cols.ids)`` said (used if the table has not changed since)."""
        if not cols.samples:
            return Filtered(Columns.empty(), 0, 0, np.zeros(0, np.uint64))
        marked = False  # every row of ``pos`` already marked in use in this generation
        if looked_up is not None and looked_up.version == self.table.version and bool((looked_up.rows >= 0).all()):
            pos = looked_up.rows  # fast path: the handshake's lookup (OnwardBackend.write)
            marked = looked_up.generation == generation
        else:
            pos = self.table.find(cols.ids)
            if bool((pos < 0).any()):
                raise KeyError("a series id the watermark does not know")
        newest, seen = self.table.cols["newest"], self.table.cols["seen"]
        ts = cols.timestamps
        one_each = cols.samples == len(pos) and bool((cols.counts == 1).all())  # the live shape: fewer steps
        per_sample = pos if one_each else np.repeat(pos, cols.counts)
        mark = newest[per_sample]
        keep = ts > mark
        kept = int(np.count_nonzero(keep))
        duplicate = 0 if kept == len(keep) else int(np.count_nonzero(ts == mark))
        out_of_order = len(keep) - kept - duplicate
        if one_each:
            np.maximum.at(newest, pos, ts)
        else:
            ends = np.cumsum(cols.counts) - 1
            has = cols.counts > 0
            np.maximum.at(newest, pos[has], ts[ends[has]])
        if out_of_order == 0 and duplicate == 0:
            out, rows = cols, pos
        else:
            entry = np.repeat(np.arange(len(cols.ids)), cols.counts)[keep]
            counts = np.bincount(entry, minlength=len(cols.ids)).astype(np.int64)
            nonzero = counts > 0
            out = Columns(cols.ids[nonzero], counts[nonzero], cols.timestamps[keep], cols.values[keep])
            rows = pos[nonzero]
        fresh = out.ids[seen[rows] != generation]
        if len(fresh) > 1:  # an id in two entries of one batch: once, in the order they came
            # (a sender learns series in this order: requests of series it learned together slice its tables)
            fresh = fresh[np.sort(np.unique(fresh, return_index=True)[1])]
        seen[rows] = generation  # generations only grow
        if not marked:
            self.table.cols["used"][rows] = generation
        return Filtered(out, duplicate, out_of_order, fresh)

    def restore(self, cols: Columns, generation: int) -> None:
        """Re-learn what was queued before a restart from a samples record of segment
        ``generation`` read back."""
        self.add(cols.ids)
        pos = self.table.find(cols.ids)
        has = cols.counts > 0
        ends = np.cumsum(cols.counts) - 1
        np.maximum.at(self.table.cols["newest"], pos[has], cols.timestamps[ends[has]])
        for name in ("seen", "used"):
            self.table.cols[name][pos] = np.maximum(self.table.cols[name][pos], generation)

    def forget(self, before: int) -> np.ndarray:
        """Forget the series not in use since generation ``before``; returns their ids."""
        return self.table.keep(self.table.cols["used"] >= before)
