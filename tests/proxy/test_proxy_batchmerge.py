"""merge_read_batches against the per-series rule: a series is kept as columns exactly when at
least ``most`` replicas sent it with the same timestamps; every other copy goes to the exact merge."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from metricsd.columns import SeriesColumns
from metricsd.model import make_labels, series_id
from metricsd.proto import metricsd_pb2 as pb
from metricsd.proxy.batchmerge import merge_read_batches
from metricsd.rpc.wire import batch_bytes, length_delimited

SERIES = [make_labels("cpu", {"namespace": "ns", "pod": f"p{i}"}) for i in range(6)]


@st.composite
def replicas(draw: st.DrawFn) -> list[dict[int, list[int]]]:
    """Per replica: series index -> its timestamps (a replica may lack series or samples)."""
    base = {i: sorted(draw(st.sets(st.integers(0, 20), max_size=5))) for i in range(len(SERIES))}
    out = []
    for _ in range(draw(st.integers(1, 3))):
        held = {}
        for i, ts in base.items():
            if draw(st.integers(0, 4)) == 0:
                continue  # lacks the series
            held[i] = [t for t in ts if draw(st.integers(0, 5)) > 0]  # may lack samples
        out.append(held)
    return out


def _reply(held: dict[int, list[int]]) -> pb.ReadResponse:
    idx = sorted(held)
    cols = SeriesColumns.from_arrays([SERIES[i] for i in idx], [np.array(held[i], np.int64) for i in idx],
                                     [np.array(held[i], np.float64) * 2 for i in idx],
                                     np.array([series_id(SERIES[i]) for i in idx], np.uint64))
    return pb.ReadResponse.FromString(length_delimited(2, batch_bytes(cols)))


@settings(max_examples=200, deadline=None)
@given(replicas(), st.integers(1, 3))
def test_agreed_series_are_kept_whole_and_the_rest_handed_over(reps: list[dict[int, list[int]]], most: int) -> None:
    replies = [(f"m{k}", _reply(held)) for k, held in enumerate(reps)]
    agreed, differ = merge_read_batches(replies, most)
    for i, labels in enumerate(SERIES):
        sid = series_id(labels)
        copies = [held[i] for held in reps if i in held]
        if not copies:
            assert sid not in differ and sid not in (agreed.ids.tolist() if agreed.ids is not None else [])
            continue
        whole = len(copies) >= most and all(c == copies[0] for c in copies)
        assert agreed.ids is not None
        kept = [k for k, x in enumerate(agreed.ids.tolist()) if x == sid]
        if whole:
            assert len(kept) == 1 and sid not in differ
            lab, ts, vals = agreed.series_at(kept[0])
            assert lab == labels and ts.tolist() == copies[0] and vals.tolist() == [2.0 * t for t in copies[0]]
        else:
            assert not kept
            got = sorted((m, list(d.timestamps)) for m, d in differ[sid])
            assert got == sorted((f"m{k}", held[i]) for k, held in enumerate(reps) if i in held)
