"""How a round of buffered batches becomes requests. Pure and vectorised.

A sender's rounds go one after another (the next is read once every request of the round is
answered), so what keeps each series in time order at the receiver is only that a series is in
one request of its round: the round's entries of one series (from several batches) are merged
into one entry, whose samples stay in batch order (the watermark made them increasing), and a
request holds whole entries. The requests of a round may then go out at once, over any number
of connections (the target's ``shards``), and a backlog sends each series' labels once per request.

A live round holds each series once, in one batch: nothing to merge, and the requests are slices
of the round (no copy), series in the order clients sent them (series of one pod side by side,
which compress better).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from metricsd.onward.records import Columns

__all__ = ["concat", "merge", "requests"]


def concat(parts: Sequence[Columns]) -> Columns:
    if not parts:
        return Columns.empty()
    if len(parts) == 1:
        return parts[0]
    return Columns(np.concatenate([p.ids for p in parts]), np.concatenate([p.counts for p in parts]),
                   np.concatenate([p.timestamps for p in parts]), np.concatenate([p.values for p in parts]))


def merge(cols: Columns) -> Columns:
    """Each series in one entry: the entries of a series merged, their samples in the order
    given; merged entries in the order of their ids (a sender's slots: the order it learned the
    series in, which is the order clients send them)."""
    if not len(cols.ids) or _distinct_small(cols.ids):  # fast path (a sender's live round): nothing to merge
        return cols
    order = np.argsort(cols.ids, kind="stable")  # a series' entries together, in batch order
    ids = cols.ids[order]
    first = np.ones(len(ids), bool)
    first[1:] = ids[1:] != ids[:-1]
    if bool(first.all()):
        return cols
    group = np.cumsum(first) - 1  # per sorted entry, its series
    starts = np.cumsum(cols.counts) - cols.counts
    counts = cols.counts[order]
    # Per sample of the merged columns, where it was: each sorted entry's samples, in order.
    perm = np.repeat(starts[order] - (np.cumsum(counts) - counts), counts) + np.arange(int(counts.sum()))
    merged_counts = np.bincount(group, weights=counts, minlength=int(group[-1]) + 1).astype(np.int64)
    return Columns(ids[first], merged_counts, cols.timestamps[perm], cols.values[perm])


def requests(cols: Columns, limit: int) -> list[Columns]:
    """The round as requests of whole entries, about ``limit`` samples each (an entry larger than
    that is one request), each series in one of them (``merge``)."""
    cols = merge(cols)
    if cols.samples <= limit:
        return [cols] if cols.samples else []
    out = []
    ends = np.cumsum(cols.counts)
    e0 = s0 = 0
    while e0 < len(cols.ids):
        e1 = max(e0 + 1, int(np.searchsorted(ends, s0 + limit, side="right")))
        s1 = int(ends[e1 - 1])
        out.append(Columns(cols.ids[e0:e1], cols.counts[e0:e1], cols.timestamps[s0:s1], cols.values[s0:s1]))
        e0, s0 = e1, s1
    return out


def _distinct_small(ids: np.ndarray) -> bool:
    """Are the ids small (a sender's dense slots) and each there once? One bincount."""
    top = int(ids.max())
    return top < 4 * len(ids) + 4096 and int(np.bincount(ids.astype(np.int64), minlength=1).max()) == 1
