"""The hash sum cached per sealed chunk (metricsd/store/chunks.py): exact on every path that seals,
merges, drops or restores chunks (checked by recomputing from the decoded chunks), and
split_chunks partitions a range exactly into cached chunks and decoded samples."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from metricsd.codec import decode_chunk
from metricsd.maths.samplehash import hash_sum, sample_hashes
from metricsd.model import make_labels, series_id
from metricsd.store import chunks as chunks_module
from metricsd.store.chunks import UNKNOWN_HASH, ChunkList, split_chunks
from metricsd.store.engine import Store
from metricsd.store.settings import StoreSettings
from metricsd.store.snapshot import capture, read_snapshot, restore, write_snapshot
from metricsd.store.wal.log import WalPosition

T0 = 1_700_000_000_000


def chunk_list(sizes: list[int], gaps: list[int], seed: int = 0) -> tuple[ChunkList, np.ndarray, np.ndarray]:
    """Chunks of ``sizes[i]`` samples 10 s apart, chunk i starting ``gaps[i]`` ms after chunk i-1 ended."""
    rng = np.random.default_rng(seed)
    c = ChunkList()
    all_t, all_v = [], []
    t = T0
    for size, gap in zip(sizes, gaps, strict=True):
        t += gap
        ts = t + 10_000 * np.arange(size, dtype=np.int64)
        vals = rng.normal(size=size).round(2)
        c.append(ts, vals)
        all_t.append(ts)
        all_v.append(vals)
        t = int(ts[-1]) + 1
    return c, np.concatenate(all_t), np.concatenate(all_v)


def recomputed(c: ChunkList) -> list[int]:
    return [hash_sum(*decode_chunk(c._chunk(i))) for i in range(len(c))]


def test_sealing_stores_each_chunks_hash_sum() -> None:
    c, t, v = chunk_list([5, 1, 7], [0, 30_000, 5])
    assert c.hash_sums().tolist() == recomputed(c)
    assert c.hash_sums().tolist() == [hash_sum(t[:5], v[:5]), hash_sum(t[5:6], v[5:6]), hash_sum(t[6:], v[6:])]
    c._check()


def test_check_finds_a_stale_hash_sum() -> None:
    c, _, _ = chunk_list([5, 5], [0, 0])
    c.index[4 + 3] ^= 1  # chunk 1's sum, one bit off
    with pytest.raises(AssertionError, match="stale"):
        c._check()


def test_retention_and_truncation_keep_the_remaining_sums() -> None:
    c, t, _ = chunk_list([4, 4, 4, 4], [0, 0, 0, 0])
    sums = c.hash_sums().tolist()
    c.drop_before(int(t[4]))  # drops chunk 0
    assert c.hash_sums().tolist() == sums[1:]
    c.truncate_from(int(t[-1]))  # removes chunk 3
    assert c.hash_sums().tolist() == sums[1:3]
    c._check()


def test_a_burst_of_seals_stores_the_sums_sealing_one_by_one_stores() -> None:
    """Store._seal_many encodes many rows at once (codec.encode_chunks) and sums their hashes in
    one 2-D pass; the sums must be the ones of each row's chunk."""
    n = 40
    store = Store(StoreSettings(chunk_samples=10, head_keep=2))
    labels = [make_labels("cpu", {"namespace": "ns", "pod": f"p{i}"}) for i in range(n)]
    ids = np.array([series_id(lab) for lab in labels], np.uint64)
    rng = np.random.default_rng(1)
    for k in range(35):
        store.write(ids, np.ones(n), np.full(n, T0 + k * 10_000), rng.normal(size=n),
                    {int(i): lab for i, lab in zip(ids, labels, strict=True)})
    assert all(len(store.chunks[r]) == 3 for r in range(n))
    for r in range(n):
        assert store.chunks[r].hash_sums().tolist() == recomputed(store.chunks[r])
        assert UNKNOWN_HASH not in store.chunks[r].hash_sums().tolist()
    store._check()


@st.composite
def chunk_lists(draw: st.DrawFn) -> tuple[list[int], list[int]]:
    n = draw(st.integers(0, 6))
    sizes = draw(st.lists(st.integers(1, 8), min_size=n, max_size=n))
    gaps = draw(st.lists(st.integers(0, 50_000), min_size=n, max_size=n))
    return sizes, gaps


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(chunk_lists(), st.booleans()), min_size=1, max_size=4), st.integers(-20_000, 600_000),
       st.integers(0, 600_000), st.sampled_from([0, 7_000, 25_000, 10**6]))
def test_split_is_exactly_the_range_cached_plus_decoded(shapes: list[tuple[tuple[list[int], list[int]], bool]],
                                                        start_off: int, length: int, bucket_ms: int) -> None:
    """Several series at once; ``forget``: as restored from a snapshot, sums learnt on the way."""
    series = []
    for seed, ((sizes, gaps), forget) in enumerate(shapes):
        c, t, v = chunk_list(sizes, gaps, seed) if sizes else (ChunkList(), np.zeros(0, np.int64), np.zeros(0))
        if forget and len(c):
            c.restore(c.time_index(), c.data, c.samples)
        series.append((c, t, v))
    start, end = T0 + start_off, T0 + start_off + length
    s = split_chunks([c for c, _, _ in series], start, end, bucket_ms)
    assert len(s.counts) == len(s.whole_samples) == len(series)
    ends = np.cumsum(s.counts)
    for k, (c, t, v) in enumerate(series):
        keep = (t >= start) & (t <= end)
        mine = s.whole_series == k
        got_t = s.timestamps[ends[k] - s.counts[k] : ends[k]]
        got_v = s.values[ends[k] - s.counts[k] : ends[k]]
        # counts and hashes add up to the range's
        assert int(s.whole_samples[k]) + len(got_t) == int(keep.sum())
        total = (int(s.whole_hashes[mine].sum(dtype=np.uint64)) + hash_sum(got_t, got_v)) % 2**64
        assert total == hash_sum(t[keep], v[keep])
        # the decoded samples are exactly the range's samples outside the whole chunks, in order
        lo, hi = c.time_index().reshape(-1, 3)[:, 0], c.time_index().reshape(-1, 3)[:, 1]
        whole = np.isin(lo, s.whole_min_ts[mine])
        in_whole = np.zeros(len(t), bool)
        for a, b in zip(lo[whole].tolist(), hi[whole].tolist(), strict=True):
            assert start <= a and b <= end
            if bucket_ms:
                assert (a - start) // bucket_ms == (b - start) // bucket_ms
            in_whole |= (t >= a) & (t <= b)
        assert got_t.tolist() == t[keep & ~in_whole].tolist()
        assert got_v.tolist() == v[keep & ~in_whole].tolist()
        # the whole chunks' sums are theirs
        sums = dict(zip(lo.tolist(), recomputed(c), strict=True))
        assert [int(h) for h in s.whole_hashes[mine]] == [sums[a] for a in s.whole_min_ts[mine].tolist()]
        c._check()


def test_split_decodes_only_the_chunks_on_the_ranges_edges(monkeypatch: pytest.MonkeyPatch) -> None:
    c, t, _ = chunk_list([6, 6, 6, 6], [0, 0, 0, 0])
    decoded: list[int] = []
    real = chunks_module.decode_chunk

    def counting(data: memoryview) -> tuple[np.ndarray, np.ndarray]:
        out = real(data)
        decoded.append(int(out[0][0]))
        return out

    monkeypatch.setattr(chunks_module, "decode_chunk", counting)
    s = split_chunks([c], int(t[0]), int(t[-1]))
    assert decoded == [] and s.whole_samples.tolist() == [24] and len(s.timestamps) == 0
    s = split_chunks([c], int(t[2]), int(t[-2]))  # cuts chunks 0 and 3
    assert decoded == [int(t[0]), int(t[18])] and s.whole_samples.tolist() == [12] and len(s.timestamps) == 4 + 5
    decoded.clear()
    c.restore(c.time_index(), c.data, c.samples)
    split_chunks([c], int(t[0]), int(t[-1]))  # sums unknown: decoded once, then known
    assert len(decoded) == 4
    decoded.clear()
    split_chunks([c], int(t[0]), int(t[-1]))
    assert decoded == []


def test_a_snapshot_keeps_its_format_and_restored_chunks_learn_their_sums(tmp_path: Path) -> None:
    n = 20
    store = Store(StoreSettings(chunk_samples=10, head_keep=2))
    labels = [make_labels("cpu", {"namespace": "ns", "pod": f"p{i}"}) for i in range(n)]
    ids = np.array([series_id(lab) for lab in labels], np.uint64)
    for k in range(45):
        store.write(ids, np.ones(n), np.full(n, T0 + k * 10_000), np.arange(n) * 0.5 + k,
                    {int(i): lab for i, lab in zip(ids, labels, strict=True)})
    img = capture(store, WalPosition(1, 0))
    assert len(img.chunk_index) == 3 * int(img.chunk_counts.sum())  # CIDX: three int64 per chunk, as before
    path, _ = write_snapshot(tmp_path, img)
    back = restore(read_snapshot(path), store.settings)
    back._check()
    assert all(set(back.chunks[r].hash_sums().tolist()) == {UNKNOWN_HASH} for r in range(n))
    for r in range(n):
        split_chunks([back.chunks[r]], T0, T0 + 10**9)
        assert back.chunks[r].hash_sums().tolist() == store.chunks[r].hash_sums().tolist()
    back._check()
    again = capture(back, WalPosition(1, 0))
    assert again.chunk_index.tobytes() == img.chunk_index.tobytes() and again.chunk_data == img.chunk_data


def test_sample_hashes_are_elementwise_for_two_dimensional_blocks() -> None:
    ts = T0 + np.arange(12, dtype=np.int64).reshape(3, 4) * 1000
    vals = np.linspace(0, 1, 12).reshape(3, 4)
    assert sample_hashes(ts, vals).reshape(-1).tolist() == sample_hashes(ts.reshape(-1), vals.reshape(-1)).tolist()
