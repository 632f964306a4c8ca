"""store/scan.py against Store.series_samples, row by row, on random stores whose series span the
head and many small chunks (decimal, constant, XOR and stale-marked values)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from metricsd.model import STALE_NAN_BITS, series_id
from metricsd.store.engine import Store
from metricsd.store.scan import read_rows, window_counts
from metricsd.store.settings import StoreSettings

STALE = np.array([STALE_NAN_BITS], dtype=np.uint64).view(np.float64)[0]


def build(seed: int, n_series: int = 12) -> Store:
    rng = np.random.default_rng(seed)
    store = Store(StoreSettings(chunk_samples=8, head_keep=3))
    for i in range(n_series):
        labels = (("__name__", "m"), ("namespace", "ns"), ("pod", f"p{i}"))
        n = int(rng.integers(0, 60))
        ts = np.cumsum(rng.integers(1, 4000, n)).astype(np.int64) + int(rng.integers(0, 5000))
        kind = i % 4
        if kind == 0:
            vals = rng.integers(0, 1000, n) / 10.0  # decimal
        elif kind == 1:
            vals = np.full(n, 2.5)  # constant
        else:
            vals = rng.normal(size=n)  # XOR
        if kind == 3 and n:
            vals[rng.integers(0, n, max(1, n // 10))] = STALE
        sid = series_id(labels)
        # in pieces, as writes come: some seals happen between them
        for part in np.array_split(np.arange(n), int(rng.integers(1, 5))):
            store.write(np.array([sid], np.uint64), np.array([len(part)]), ts[part], vals[part], {sid: labels})
    return store


@given(st.integers(0, 10_000), st.integers(-1000, 200_000), st.integers(0, 200_000))
@settings(max_examples=60, deadline=None)
def test_read_rows_equals_series_samples(seed: int, start: int, width: int) -> None:
    store = build(seed)
    rows = np.arange(store.index.n_rows)[::-1]
    got = read_rows(store, rows, start, start + width)
    for i, row in enumerate(rows.tolist()):
        t, v = store.series_samples(row, start, start + width)
        lo, hi = got.offsets[i], got.offsets[i + 1]
        assert got.timestamps[lo:hi].tolist() == t.tolist()
        assert got.values[lo:hi].view(np.uint64).tolist() == v.view(np.uint64).tolist()


@given(st.integers(0, 10_000), st.lists(st.integers(0, 250_000), min_size=1, max_size=4), st.integers(1, 250_000))
@settings(max_examples=60, deadline=None)
def test_window_counts_equal_counting_decoded_samples(seed: int, times: list[int], window: int) -> None:
    store = build(seed)
    rows = np.arange(store.index.n_rows)
    got = window_counts(store, rows, np.array(times), window)
    for i, row in enumerate(rows.tolist()):
        t, v = store.series_samples(row, -(2**62), 2**62)
        live = v.view(np.uint64) != np.uint64(STALE_NAN_BITS)
        want = [int(((t > x - window) & (t <= x) & live).sum()) for x in times]
        assert got[i].tolist() == want


def test_whole_chunks_are_counted_without_decoding(monkeypatch: object) -> None:
    """Counting a constant series over all its data decodes no chunk (the header says it all)."""
    import metricsd.store.scan as scan

    store = build(1)
    decoded: list[int] = []
    real = scan.decode_joined
    monkeypatch.setattr(scan, "decode_joined",  # type: ignore[attr-defined]
                        lambda *a: decoded.append(1) or real(*a))
    const_rows = np.array([r for r in range(store.index.n_rows) if r % 4 == 1 and store.chunks.n_chunks(r)])
    assert len(const_rows)
    got = window_counts(store, const_rows, np.array([10**7]), 10**7)
    assert got[:, 0].tolist() == [len(store.series_samples(int(r), 0, 10**7)[0]) for r in const_rows]
    assert decoded == []


def test_window_edges_on_chunk_edges() -> None:
    """Windows are open on the left: a chunk whose first sample sits at t - w is not whole."""
    store = Store(StoreSettings(chunk_samples=8, head_keep=3))
    labels = (("__name__", "m"), ("namespace", "ns"), ("pod", "p"))
    sid = series_id(labels)
    ts = np.arange(1, 41, dtype=np.int64) * 1000
    for part in np.array_split(np.arange(40), 5):
        store.write(np.array([sid], np.uint64), np.array([len(part)]), ts[part], np.full(len(part), 1.0),
                    {sid: labels})
    chunk_lo = store.chunks.entries(0)[:, 0]
    assert len(chunk_lo) >= 3
    for lo in chunk_lo.tolist():
        for w in (1000, 8000, 9000, 16000):
            t = lo + w
            got = int(window_counts(store, np.array([0]), np.array([t]), w)[0, 0])
            assert got == int(((ts > t - w) & (ts <= t)).sum()), (lo, w)


def test_read_rows_sample_limit_is_exact() -> None:
    """max_samples lets exactly that many through and refuses one more, over many batches."""
    import pytest

    import metricsd.store.scan as scan
    from metricsd.store.scan import SampleLimitReached

    store = build(7, n_series=24)
    rows = np.arange(store.index.n_rows)
    total = len(read_rows(store, rows, 0, 2**40).timestamps)
    assert total > 0
    mp = pytest.MonkeyPatch()
    mp.setattr(scan, "BATCH_SERIES", 5)  # several batches, so the running total is what is checked
    try:
        assert len(read_rows(store, rows, 0, 2**40, max_samples=total).timestamps) == total
        with pytest.raises(SampleLimitReached):
            read_rows(store, rows, 0, 2**40, max_samples=total - 1)
    finally:
        mp.undo()
