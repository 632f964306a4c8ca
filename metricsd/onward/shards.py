"""How a round of buffered batches becomes one request per shard. Pure and vectorised.

A series goes to one shard (``id mod shards``: the sender passes its dense series slots as ids,
so this is uniform), and a shard sends its requests one after another, so every series reaches
the receiver in time order however many shards send at once; rounds go one after another, so a
series may change shards between rounds without any reordering. Within a shard's part, entries of one
series from several batches are merged into one (their samples stay in batch order, which the
watermark made increasing), so a backlog sends each series' labels once per request.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from metricsd.onward.records import Columns

__all__ = ["concat", "split"]


def concat(parts: Sequence[Columns]) -> Columns:
    if not parts:
        return Columns.empty()
    if len(parts) == 1:
        return parts[0]
    return Columns(np.concatenate([p.ids for p in parts]), np.concatenate([p.counts for p in parts]),
                   np.concatenate([p.timestamps for p in parts]), np.concatenate([p.values for p in parts]))


def split(cols: Columns, shards: int) -> list[Columns]:
    """One Columns per shard (some may be empty), each series in one entry."""
    if not len(cols.ids):
        return [Columns.empty() for _ in range(shards)]
    shard = (cols.ids % np.uint64(shards)).astype(np.int64)
    # Sort entries by (shard, id), stably: a series' entries stay in batch order.
    order = np.lexsort((cols.ids, shard))
    starts = np.cumsum(cols.counts) - cols.counts
    counts = cols.counts[order]
    # Sample permutation: for each entry in the new order, its samples' old positions.
    total = int(counts.sum())
    offsets = np.repeat(starts[order] - (np.cumsum(counts) - counts), counts)
    perm = np.arange(total) + offsets
    ids, sh = cols.ids[order], shard[order]
    ts, values = cols.timestamps[perm], cols.values[perm]
    first = np.ones(len(ids), bool)
    first[1:] = ids[1:] != ids[:-1]
    group = np.cumsum(first) - 1
    merged_counts = np.bincount(group, weights=counts, minlength=int(group[-1]) + 1).astype(np.int64)
    merged_ids, merged_shard = ids[first], sh[first]
    sample_shard = np.repeat(merged_shard, merged_counts)
    out = []
    for s in range(shards):
        e = merged_shard == s
        if not e.any():
            out.append(Columns.empty())
            continue
        m = sample_shard == s
        out.append(Columns(merged_ids[e], merged_counts[e], ts[m], values[m]))
    return out
