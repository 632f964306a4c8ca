"""Reads whose range starts inside a series' open chunk enter it at a block near the start
(Chunks.open_tails, codec/tail.py) and answer what decoding the whole chunk answers: on a store
with long open chunks of counters, gauges, floats and flat series, after a restart from a
snapshot too, and with the open chunk's chain checked by Store._check."""

from __future__ import annotations

import numpy as np
import pytest

from metricsd.model import make_labels, series_id
from metricsd.store import readmany
from metricsd.store.engine import Store
from metricsd.store.settings import StoreSettings
from metricsd.store.snapshot import capture, restore
from metricsd.store.wal import WalPosition

T0 = 1_700_000_000_000


def _store(seed: int) -> Store:
    rng = np.random.default_rng(seed)
    store = Store(StoreSettings(chunk_samples=720, head_keep=16, retention_ms=24 * 3600_000))
    k = 24
    labels = [make_labels("m", {"namespace": "ns", "pod": f"p{i}"}) for i in range(k)]
    ids = np.array([series_id(lab) for lab in labels], np.uint64)
    n = 500
    t = T0 + np.cumsum(rng.integers(9_000, 11_000, (k, n)), axis=1)
    kinds = [np.round(np.cumsum(rng.integers(0, 100, (k, n)), axis=1) * 0.01, 2), rng.normal(size=(k, n)),
             np.round(rng.normal(size=(k, n)), 3), np.full((k, n), 2.5)]
    v = np.stack([kinds[i % 4][i] for i in range(k)])
    for s0 in range(0, n, 60):
        s1 = min(s0 + 60, n)
        store.write(ids, np.full(k, s1 - s0), t[:, s0:s1].reshape(-1), v[:, s0:s1].reshape(-1),
                    {int(ids[i]): labels[i] for i in range(k)} if s0 == 0 else None)
    store._check()
    return store


def _one_by_one(store: Store, rows: np.ndarray, lo: int, hi: int) -> tuple[list[int], list[int], list[int]]:
    counts, ts, bits = [], [], []
    for r in rows.tolist():
        t, v = store.series_samples(r, lo, hi)  # Chunks.read: whole chunks
        counts.append(len(t))
        ts += t.tolist()
        bits += v.view(np.int64).tolist()
    return counts, ts, bits


@pytest.mark.parametrize("seed", [0, 1])
def test_reads_inside_the_open_chunk_equal_whole_chunk_reads(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(readmany, "TAIL_MIN_ROWS", 1)  # the 24 rows here take the tails too
    store = _store(seed)
    again = restore(capture(store, WalPosition(1, 16)), store.settings)
    for s in (store, again):
        rows = np.array(sorted(s.index.live_rows()), dtype=np.int64)
        t_max = int(s.max_ts)
        for back_ms in (3 * 60_000, 30 * 60_000, 60 * 60_000, 80 * 60_000, 10**9):
            for hi in (t_max, t_max - 40 * 60_000):
                lo = t_max - back_ms
                counts, ts, vals = s.series_samples_many(rows, lo, hi)
                assert (counts.tolist(), ts.tolist(), vals.view(np.int64).tolist()) == _one_by_one(s, rows, lo, hi)


def test_a_30_minute_read_decodes_the_tail_not_the_chunk() -> None:
    store = _store(2)
    rows = np.array(sorted(store.index.live_rows()), dtype=np.int64)
    start = int(store.max_ts) - 30 * 60_000
    answered, counts, t, _ = store.chunks.open_tails(rows, start)
    assert answered.all()  # every kind of series here is entered mid-chunk
    assert int(counts.max()) <= 180 + 3 * store.chunks.block  # 30 minutes at ~10 s, a block or two more
    assert int(counts.min()) > 0 and int(store.chunks.open_count[rows].min()) > 400
    first = np.cumsum(counts) - counts
    assert bool((t[first] < start + 2 * 11_000 * store.chunks.block).all())


def test_a_read_of_few_rows_decodes_whole_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Entering the open chunk costs a fixed ~1.8 ms a read: a panel's read of one pod (a few rows)
    decodes the chunks whole instead (readmany.TAIL_MIN_ROWS), and answers the same."""
    store = _store(3)
    rows = np.array(sorted(store.index.live_rows()), dtype=np.int64)[:2]
    lo, hi = int(store.max_ts) - 30 * 60_000, int(store.max_ts)
    want = _one_by_one(store, rows, lo, hi)

    def entered(*_: object) -> None:
        raise AssertionError("a read of two rows entered the open chunks mid-way")

    monkeypatch.setattr(store.chunks, "open_tails", entered)
    counts, ts, vals = store.series_samples_many(rows, lo, hi)
    assert (counts.tolist(), ts.tolist(), vals.view(np.int64).tolist()) == want
