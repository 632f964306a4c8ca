"""Which samples of an acknowledged batch go onward: each series' samples in increasing time, each
timestamp once.

The tee (tee.py) sees every batch acknowledged through this process. A client that retries a
batch whose acknowledgement it lost sends samples already queued; a sender's late sample is
older than one already queued. Both are left out here, so the onward stream of every series is
strictly increasing in time, which is what a Prometheus receiver requires (it refuses a whole
request with 400 for one sample out of order) and what makes a retried batch cost nothing.

Pure and vectorised: per batch a few NumPy calls over sorted arrays, never a Python object per
sample. Series are kept as sorted ids with the newest timestamp queued for each; a batch's new
series are merged in once. Not thread-safe.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from metricsd.onward.records import Columns

__all__ = ["Filtered", "Watermark"]

_NONE = np.iinfo(np.int64).min


@dataclass(frozen=True, slots=True)
class Filtered:
    columns: Columns  # what goes onward (entries left without samples are removed)
    duplicate: int  # samples at a timestamp already queued for their series
    out_of_order: int  # samples older than their series' newest queued sample


class Watermark:
    def __init__(self) -> None:
        self.ids = np.zeros(0, np.uint64)  # sorted
        self.newest = np.zeros(0, np.int64)  # newest timestamp queued, per id; _NONE before the first

    def __len__(self) -> int:
        return len(self.ids)

    def known(self, ids: np.ndarray) -> np.ndarray:
        """A bool per id: is it a series seen before?"""
        if not len(self.ids):
            return np.zeros(len(ids), bool)
        pos = np.minimum(np.searchsorted(self.ids, ids), len(self.ids) - 1)
        return np.asarray(self.ids[pos] == ids)

    def add(self, ids: np.ndarray) -> None:
        """Make ``ids`` known (those already known are left as they are)."""
        new = np.unique(ids[~self.known(ids)]) if len(ids) else ids
        if not len(new):
            return
        ids_all = np.concatenate([self.ids, new])
        newest = np.concatenate([self.newest, np.full(len(new), _NONE, np.int64)])
        order = np.argsort(ids_all, kind="stable")
        self.ids, self.newest = ids_all[order], newest[order]

    def take(self, cols: Columns) -> Filtered:
        """The samples of ``cols`` newer than their series' watermark, which then moves to the
        newest of them. Every id must be known (``add``). Within an entry timestamps increase."""
        if not cols.samples:
            return Filtered(Columns.empty(), 0, 0)
        pos = np.searchsorted(self.ids, cols.ids)
        if not bool((self.ids[np.minimum(pos, len(self.ids) - 1)] == cols.ids).all()):
            raise KeyError("a series id the watermark does not know")
        per_sample = np.repeat(pos, cols.counts)
        mark = self.newest[per_sample]
        keep = cols.timestamps > mark
        duplicate = int(np.count_nonzero(cols.timestamps == mark))
        out_of_order = len(keep) - int(np.count_nonzero(keep)) - duplicate
        ends = np.cumsum(cols.counts) - 1
        has = cols.counts > 0
        np.maximum.at(self.newest, pos[has], cols.timestamps[ends[has]])
        if out_of_order == 0 and duplicate == 0:
            return Filtered(cols, 0, 0)
        entry = np.repeat(np.arange(len(cols.ids)), cols.counts)[keep]
        counts = np.bincount(entry, minlength=len(cols.ids)).astype(np.int64)
        nonzero = counts > 0
        return Filtered(Columns(cols.ids[nonzero], counts[nonzero], cols.timestamps[keep], cols.values[keep]),
                        duplicate, out_of_order)

    def restore(self, cols: Columns) -> None:
        """Re-learn what was queued before a restart from a samples record read back."""
        self.add(cols.ids)
        pos = np.searchsorted(self.ids, cols.ids)
        has = cols.counts > 0
        ends = np.cumsum(cols.counts) - 1
        np.maximum.at(self.newest, pos[has], cols.timestamps[ends[has]])
