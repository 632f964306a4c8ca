"""The proxy's merge of columnar Read replies (ReadResponse.batch): series every replica agrees
on are kept as columns; only the others become per-series messages for the exact merge.

A slot's R replicas each send every series they hold of it. Usually they hold the same samples:
then, per series id, the copies have equal counts and equal timestamps, which is checked for
every series at once (one gather and comparison over the flat arrays), and the first copy is
kept. A series with fewer copies than the most replicas any slot had answer, or whose copies
differ, is handed back as ``(member, SeriesData)`` copies, for ReadPath's per-series merge (union
by timestamp, read repair). Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from metricsd.columns import SeriesColumns
from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc.wire import columns_from_read, labels_to_pb

__all__ = ["merge_read_batches"]


def merge_read_batches(replies: Sequence[tuple[str, pb.ReadResponse]], most: int
                       ) -> tuple[SeriesColumns, dict[int, list[tuple[str, pb.SeriesData]]]]:
    """(the series all ``most`` copies of which agree, one copy each; the other series' copies by id)."""
    parts = [columns_from_read(resp) for _, resp in replies]
    members = [m for m, _ in replies]
    if not parts:
        return SeriesColumns.empty(), {}
    owner = np.repeat(np.arange(len(parts)), [len(p) for p in parts])
    cols = SeriesColumns.concat(parts)
    if cols.ids is None:
        raise ValueError("a columnar reply without series ids")
    if len(cols) == 0:
        return cols, {}
    ids = cols.ids
    order = np.lexsort((owner, ids))  # copies of one id together
    sid = ids[order]
    first_of = np.flatnonzero(np.r_[True, sid[1:] != sid[:-1]])
    group = np.repeat(np.arange(len(first_of)), np.diff(np.r_[first_of, len(sid)]))
    copies = np.bincount(group)
    lead = order[first_of][group]  # each copy's group's first copy (in concat positions)
    counts = cols.counts
    same = counts[order] == counts[lead]
    # timestamps of each copy against its group's first, where the counts agree
    c = np.where(same, counts[order], 0)
    at = np.repeat(cols.offsets[order] - (np.cumsum(c) - c), c) + np.arange(int(c.sum()))
    ref = np.repeat(cols.offsets[lead] - (np.cumsum(c) - c), c) + np.arange(int(c.sum()))
    bad = np.repeat(np.arange(len(order)), c)[cols.timestamps[at] != cols.timestamps[ref]]
    same[bad] = False
    agree = np.logical_and.reduceat(same, first_of) & (copies >= most)
    keep = order[first_of[agree]]
    out: dict[int, list[tuple[str, pb.SeriesData]]] = {}
    for g in np.flatnonzero(~agree).tolist():
        for k in order[first_of[g] : first_of[g] + copies[g]].tolist():
            labels, ts, vals = cols.series_at(k)
            d = pb.SeriesData(id=int(ids[k]), timestamps=ts.tolist(), values=vals.tolist())
            d.labels.extend(labels_to_pb(labels))
            out.setdefault(int(ids[k]), []).append((members[int(owner[k])], d))
    return cols.take(keep), out
