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

__all__ = ["Filtered", "Watermark"]

_NONE = np.iinfo(np.int64).min
_NEVER = -1


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

    def known(self, ids: np.ndarray, generation: int | None = None) -> np.ndarray:
        """A bool per id: is it a series seen before? With a generation, the known ones are
        marked in use in it, so that ``forget`` keeps them until a batch of theirs arrives."""
        rows = self.table.find(ids)
        found = rows >= 0
        if generation is not None:
            used = self.table.cols["used"]
            used[rows[found]] = np.maximum(used[rows[found]], generation)
        return found

    def add(self, ids: np.ndarray) -> None:
        """Make ``ids`` known (those already known are left as they are)."""
        if len(ids):
            self.table.add(ids)

    def take(self, cols: Columns, generation: int = 0) -> Filtered:
        """The samples of ``cols`` newer than their series' watermark, which then moves to the
        newest of them. Every id must be known (``add``). Within an entry timestamps increase."""
        if not cols.samples:
            return Filtered(Columns.empty(), 0, 0, np.zeros(0, np.uint64))
        pos = self.table.find(cols.ids)
        if bool((pos < 0).any()):
            raise KeyError("a series id the watermark does not know")
        newest, seen = self.table.cols["newest"], self.table.cols["seen"]
        per_sample = np.repeat(pos, cols.counts)
        mark = newest[per_sample]
        keep = cols.timestamps > mark
        duplicate = int(np.count_nonzero(cols.timestamps == mark))
        out_of_order = len(keep) - int(np.count_nonzero(keep)) - duplicate
        ends = np.cumsum(cols.counts) - 1
        has = cols.counts > 0
        np.maximum.at(newest, pos[has], cols.timestamps[ends[has]])
        if out_of_order == 0 and duplicate == 0:
            out, rows = cols, pos
        else:
            entry = np.repeat(np.arange(len(cols.ids)), cols.counts)[keep]
            counts = np.bincount(entry, minlength=len(cols.ids)).astype(np.int64)
            nonzero = counts > 0
            out = Columns(cols.ids[nonzero], counts[nonzero], cols.timestamps[keep], cols.values[keep])
            rows = pos[nonzero]
        new = seen[rows] != generation
        fresh = out.ids[new]
        if len(fresh) > 1:
            fresh = np.unique(fresh)  # an id in two entries of one batch: once
        seen[rows] = generation
        used = self.table.cols["used"]
        used[rows] = np.maximum(used[rows], generation)
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
