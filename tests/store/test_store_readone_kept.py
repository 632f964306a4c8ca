"""The one-row read's kept chunk decodes (store/readone.py, DecodedChunks): every answer equals a
read without them (read_rows of the row, bit for bit) while the store is written between reads
(blocks sealed into the open chunk, chunks closed, out-of-order merges that rewrite chunks,
retention dropping chunks and freeing rows that new series then take), the bound in bytes holds,
and an acknowledged sample is in the next read whose range covers it."""

from __future__ import annotations

import numpy as np
import pytest

from metricsd.model import make_labels, series_id, stale_marker
from metricsd.store.engine import Store
from metricsd.store.readone import DecodedChunks, read_one
from metricsd.store.scan import read_rows
from metricsd.store.settings import StoreSettings

T0 = 1_700_000_000_000


def _bits(s: object) -> tuple[list[int], list[int], list[int]]:
    return (s.offsets.tolist(), s.timestamps.tolist(), s.values.view(np.int64).tolist())  # type: ignore[attr-defined]


def _check_rows(store: Store, kept: DecodedChunks, ranges: list[tuple[int, int]]) -> int:
    seen = 0
    for row in range(len(store.index.labels)):
        if store.index.labels[row] is None:
            continue
        for lo, hi in ranges:
            want = read_rows(store, np.array([row]), lo, hi)
            got = read_one(store, row, lo, hi, 0, kept)
            assert _bits(got) == _bits(want), (row, lo, hi)
            assert got.timestamps.flags.writeable and got.values.flags.writeable  # fresh arrays, not the kept ones
            seen += len(want.timestamps)
    return seen


@pytest.mark.parametrize(("seed", "chunk_samples", "head_keep"), [(0, 720, 16), (1, 10, 3), (2, 40, 8), (3, 5, 1)])
def test_kept_decodes_answer_as_a_fresh_read_while_the_store_changes(seed: int, chunk_samples: int,
                                                                     head_keep: int) -> None:
    rng = np.random.default_rng(seed)
    store = Store(StoreSettings(chunk_samples=chunk_samples, head_keep=head_keep, retention_ms=20 * 60_000,
                                ooo_window_ms=10 * 60_000))
    kept = DecodedChunks(max_bytes=64 << 10)
    labels = [make_labels("cpu", {"namespace": "ns", "pod": f"p{i}"}) for i in range(12)]
    ids = np.array([series_id(lab) for lab in labels], np.uint64)
    t = T0
    seen = 0
    for step in range(45):
        live = rng.choice(12, size=int(rng.integers(1, 12)), replace=False)
        n = int(rng.integers(1, 12))
        ts = np.concatenate([t + np.arange(n) * 10_000 + int(i) for i in live])
        vals = np.round(rng.normal(size=len(ts)).cumsum(), int(rng.integers(0, 4)))
        vals[::17] = np.nan
        vals[3::29] = stale_marker()
        store.write(ids[live], np.full(len(live), n), ts, vals, {int(ids[i]): labels[i] for i in live})
        if step % 7 == 3:  # out of order, within the window and past the ring: the row's chunks from there are
            # rewritten, the open chunk with its first and last sample unchanged and one more
            for i, back in zip(live[:3].tolist(), (30_000 - 7, 420_000 - 3, 590_000 - 1), strict=False):
                store.write(ids[i : i + 1], np.array([1]), np.array([t - back]), np.array([1.5]))
        if step % 11 == 10:  # retention drops old chunks and frees rows; new series take them
            store.gc()
        t += n * 10_000
        ranges = [(0, 2**62), (t - 600_000, t), (t - 3_600_000, t - 60_000)]
        ranges += [(int(a), int(a + b)) for a, b in zip(rng.integers(T0, t, 3), rng.integers(0, 900_000, 3),
                                                       strict=True)]
        seen += _check_rows(store, kept, ranges)
    assert seen > 5_000
    assert kept.hits > 1_000 and kept.misses > 50  # it was used, and it was refreshed
    assert 0 < kept.bytes <= kept.max_bytes


def test_an_acknowledged_sample_is_in_the_next_read_across_seals_and_closed_chunks() -> None:
    store = Store(StoreSettings(chunk_samples=24, head_keep=4))
    kept = DecodedChunks()
    lab = make_labels("cpu", {"namespace": "ns", "pod": "p"})
    sid = np.array([series_id(lab)], np.uint64)
    for i in range(200):
        ts = T0 + i * 10_000
        store.write(sid, np.array([1]), np.array([ts]), np.array([float(i)]), {int(sid[0]): lab} if i == 0 else None)
        got = read_one(store, 0, T0, ts, 0, kept)
        assert got.timestamps[-1] == ts and got.values[-1] == float(i)
        assert len(got.timestamps) == i + 1
    assert store.chunks.n_closed[0] >= 5 and kept.hits > 100


def test_the_bound_in_bytes_drops_the_least_recently_read() -> None:
    store = Store(StoreSettings(chunk_samples=50, head_keep=8))
    labels = [make_labels("cpu", {"namespace": "ns", "pod": f"p{i}"}) for i in range(20)]
    ids = np.array([series_id(lab) for lab in labels], np.uint64)
    ts = np.concatenate([T0 + np.arange(400) * 10_000 for _ in ids])
    store.write(ids, np.full(len(ids), 400), ts, np.arange(len(ts), dtype=np.float64),
                {int(i): lab for i, lab in zip(ids.tolist(), labels, strict=True)})
    kept = DecodedChunks(max_bytes=50 * 16 * 12)  # twelve closed chunks of 50 samples
    for row in range(20):
        read_one(store, row, T0, T0 + 10**9, 0, kept)
        assert kept.bytes <= kept.max_bytes
    assert len(kept) == 12
    misses = kept.misses
    read_one(store, 19, T0, T0 + 10**9, 0, kept)  # the newest: all kept
    assert kept.misses == misses
    read_one(store, 0, T0, T0 + 10**9, 0, kept)  # the oldest: dropped, decoded again
    assert kept.misses > misses
    small = DecodedChunks(max_bytes=3 * 50 * 16)  # a chunk past a quarter of the bound is not kept
    got = read_one(store, 0, T0, T0 + 10**9, 0, small)
    assert small.bytes * 4 <= small.max_bytes and len(got.timestamps) == 400  # a short open chunk may be


def test_a_chunk_whose_range_reads_other_samples_is_neither_kept_nor_trusted(monkeypatch: pytest.MonkeyPatch) -> None:
    """Should a chunk's time range ever read more samples than its entry counts (chunks overlapping
    in time), the read is Chunks.read's own and nothing is kept."""
    store = Store(StoreSettings(chunk_samples=20, head_keep=4))
    lab = make_labels("cpu", {"namespace": "ns", "pod": "p"})
    sid = np.array([series_id(lab)], np.uint64)
    store.write(sid, np.array([100]), T0 + np.arange(100) * 10_000, np.arange(100.0), {int(sid[0]): lab})
    real = store.chunks.read

    def extra(row: int, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        t, v = real(row, lo, hi)
        return np.append(t, hi + 1), np.append(v, -1.0)  # one sample more than asked

    monkeypatch.setattr(store.chunks, "read", extra)
    kept = DecodedChunks()
    got = read_one(store, 0, T0, T0 + 10**9, 0, kept)
    assert len(kept) == 0
    want_t, want_v = store.series_samples(0, T0, T0 + 10**9)  # through the patched Chunks.read, nothing kept
    assert got.timestamps.tolist() == want_t.tolist() and got.values.tolist() == want_v.tolist()
