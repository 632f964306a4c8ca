"""A write of samples a series holds already (a retried message, a hinted hand-off, read repair's
copy) is counted as duplicates without taking the series apart: its sealed chunks stay as they
are. A replica restarted empty under live writes rewrote and sealed whole series again for each
such write, seconds of its event loop (perf/RESULTS.md issue 24 session 39)."""

from __future__ import annotations

import numpy as np

from metricsd.model import make_labels, series_id
from metricsd.store.engine import Store


def _write(store: Store, sid: int, ts: list[int], new: bool = False) -> tuple[int, int, int]:
    labels = {sid: make_labels("cpu", {"namespace": "ns", "pod": "p"})} if new else None
    r = store.write(np.array([sid], np.uint64), np.array([len(ts)]), np.array(ts, np.int64),
                    np.array([float(t) for t in ts]), labels)
    return r.written, r.duplicate, r.too_old


def test_samples_held_already_are_duplicates_and_the_series_is_not_rewritten() -> None:
    store = Store()
    sid = series_id(make_labels("cpu", {"namespace": "ns", "pod": "p"}))
    _write(store, sid, list(range(1000, 3_001_000, 1000)), new=True)  # 3,000 samples: closed chunks and a ring
    row = store.index.row_of(sid)
    assert row is not None and int(store.chunks.n_closed[row]) >= 2
    store.gc()  # retention's floor for the series: what a rewrite of its chunks resets
    floor = int(store.head.expiry_floor[row])
    chunks_before = store.chunks.entries(row).copy()
    payload_before = bytes(store.chunks.closed(row)[0])
    older = list(range(101_000, 301_000, 1000))  # held already, sealed long ago
    assert _write(store, sid, older) == (0, len(older), 0)
    assert np.array_equal(store.chunks.entries(row), chunks_before)
    assert bytes(store.chunks.closed(row)[0]) == payload_before
    assert int(store.head.expiry_floor[row]) == floor  # the chunks were not taken apart and rewritten
    # a gap filled among held samples: the new ones written, the held ones counted, all read back
    assert _write(store, sid, [200_000, 200_500, 201_000]) == (1, 2, 0)
    t, v = store.series_samples(row, 0, 10**9)
    assert len(t) == 3001 and 200_500 in set(t.tolist()) and np.all(np.diff(t) > 0)
    assert np.array_equal(v, t.astype(np.float64))
