"""The hash sum kept per chunk (metricsd/store/chunks.py): exact on every path that seals,
merges, drops or restores chunks (checked by recomputing from the decoded chunks), and
split_chunks partitions a range exactly into whole chunks and decoded samples."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from metricsd.codec.blocks import Chain, encode_blocks
from metricsd.maths.samplehash import hash_sum, sample_hashes
from metricsd.model import make_labels, series_id
from metricsd.store import chunks as chunks_module
from metricsd.store.chunks import Chunks, split_chunks
from metricsd.store.engine import Store
from metricsd.store.settings import StoreSettings
from metricsd.store.snapshot import capture, read_snapshot, restore, write_snapshot
from metricsd.store.wal.log import WalPosition

T0 = 1_700_000_000_000


def add_chunk(c: Chunks, row: int, ts: np.ndarray, vals: np.ndarray, close: bool = True) -> None:
    """One chunk of ``ts``/``vals`` for ``row``: one block, then closed unless ``close`` is false."""
    rows = np.array([row])
    enc = encode_blocks(ts[None, :], vals[None, :], c.chain(rows), c.block)
    c.append(rows, enc, ts[:1], ts[-1:], len(ts), sample_hashes(ts, vals).sum(keepdims=True, dtype=np.uint64))
    if close:
        c.close_all(rows)


def chunk_rows(shapes: list[tuple[list[int], list[int]]], open_last: bool = False
               ) -> tuple[Chunks, list[np.ndarray], list[np.ndarray]]:
    """Row k holds chunks of ``sizes[i]`` samples 10 s apart, chunk i starting ``gaps[i]`` ms after
    chunk i-1 ended; with ``open_last`` its last chunk stays open."""
    c = Chunks(block=8, chunk_samples=10**6)
    c.ensure_rows(len(shapes))
    all_t, all_v = [], []
    for row, (sizes, gaps) in enumerate(shapes):
        rng = np.random.default_rng(row)
        ts_, vs_ = [], []
        t = T0
        for i, (size, gap) in enumerate(zip(sizes, gaps, strict=True)):
            t += gap
            ts = t + 10_000 * np.arange(size, dtype=np.int64)
            vals = rng.normal(size=size).round(2)
            add_chunk(c, row, ts, vals, close=not (open_last and i == len(sizes) - 1))
            ts_.append(ts)
            vs_.append(vals)
            t = int(ts[-1]) + 1
        all_t.append(np.concatenate(ts_) if ts_ else np.zeros(0, np.int64))
        all_v.append(np.concatenate(vs_) if vs_ else np.zeros(0))
    return c, all_t, all_v


def recomputed(c: Chunks, row: int) -> list[int]:
    return [hash_sum(*c._decode(row, [i])) for i in range(c.n_chunks(row))]


def sums(c: Chunks, row: int) -> list[int]:
    return c.entries(row)[:, 4].view(np.uint64).tolist()


def test_sealing_stores_each_chunks_hash_sum() -> None:
    c, (t,), (v,) = chunk_rows([([5, 1, 7], [0, 30_000, 5])], open_last=True)
    assert sums(c, 0) == recomputed(c, 0)
    assert sums(c, 0) == [hash_sum(t[:5], v[:5]), hash_sum(t[5:6], v[5:6]), hash_sum(t[6:], v[6:])]
    c._check(0)


def test_check_finds_a_stale_hash_sum() -> None:
    c, _, _ = chunk_rows([([5, 5], [0, 0])])
    data = bytearray(c.data[0])
    data[len(data) - 8 * 5 + 8 * 4] ^= 1  # chunk 1's sum (the index trails the chunks), one bit off
    c.data[0] = bytes(data)
    with pytest.raises(AssertionError, match="stale"):
        c._check(0)


def test_retention_and_truncation_keep_the_remaining_sums() -> None:
    c, (t,), _ = chunk_rows([([4, 4, 4, 4], [0, 0, 0, 0])], open_last=True)
    before = sums(c, 0)
    c.drop_before(0, int(t[4]))  # drops chunk 0
    assert sums(c, 0) == before[1:]
    c.truncate_from(0, int(t[-1]))  # removes chunk 3, the open one
    assert sums(c, 0) == before[1:3]
    c._check(0)


def test_a_wave_of_seals_stores_the_sums_sealing_one_by_one_stores() -> None:
    """Many series sealed in one encode_blocks call and their hashes summed in one 2-D pass: each
    chunk's sum must be its own samples'."""
    n = 40
    store = Store(StoreSettings(chunk_samples=10, head_keep=2))
    labels = [make_labels("cpu", {"namespace": "ns", "pod": f"p{i}"}) for i in range(n)]
    ids = np.array([series_id(lab) for lab in labels], np.uint64)
    rng = np.random.default_rng(1)
    for k in range(35):
        store.write(ids, np.ones(n), np.full(n, T0 + k * 10_000), rng.normal(size=n),
                    {int(i): lab for i, lab in zip(ids, labels, strict=True)})
    assert all(store.chunks.n_chunks(r) == 4 for r in range(n))
    for r in range(n):
        assert sums(store.chunks, r) == recomputed(store.chunks, r)
    store._check()


@st.composite
def chunk_shapes(draw: st.DrawFn) -> tuple[list[int], list[int]]:
    n = draw(st.integers(0, 6))
    sizes = draw(st.lists(st.integers(1, 8), min_size=n, max_size=n))
    gaps = draw(st.lists(st.integers(0, 50_000), min_size=n, max_size=n))
    return sizes, gaps


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(chunk_shapes(), min_size=1, max_size=4), st.booleans(), st.integers(-20_000, 600_000),
       st.integers(0, 600_000), st.sampled_from([0, 7_000, 25_000, 10**6]))
def test_split_is_exactly_the_range_whole_plus_decoded(shapes: list[tuple[list[int], list[int]]], open_last: bool,
                                                      start_off: int, length: int, bucket_ms: int) -> None:
    c, all_t, all_v = chunk_rows(shapes, open_last)
    rows = list(range(len(shapes)))
    start, end = T0 + start_off, T0 + start_off + length
    s = split_chunks(c, rows, start, end, bucket_ms)
    assert len(s.counts) == len(s.whole_samples) == len(rows)
    ends = np.cumsum(s.counts)
    for k, (t, v) in enumerate(zip(all_t, all_v, strict=True)):
        keep = (t >= start) & (t <= end)
        mine = s.whole_series == k
        got_t = s.timestamps[ends[k] - s.counts[k] : ends[k]]
        got_v = s.values[ends[k] - s.counts[k] : ends[k]]
        # counts and hashes add up to the range's
        assert int(s.whole_samples[k]) + len(got_t) == int(keep.sum())
        total = (int(s.whole_hashes[mine].sum(dtype=np.uint64)) + hash_sum(got_t, got_v)) % 2**64
        assert total == hash_sum(t[keep], v[keep])
        # the decoded samples are exactly the range's samples outside the whole chunks, in order
        e = c.entries(k)
        lo, hi = e[:, 0], e[:, 1]
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
        own = dict(zip(lo.tolist(), recomputed(c, k), strict=True))
        assert [int(h) for h in s.whole_hashes[mine]] == [own[a] for a in s.whole_min_ts[mine].tolist()]
        c._check(k)


def test_split_decodes_only_the_chunks_on_the_ranges_edges(monkeypatch: pytest.MonkeyPatch) -> None:
    c, (t,), _ = chunk_rows([([6, 6, 6, 6], [0, 0, 0, 0])], open_last=True)
    decoded: list[list[int]] = []
    real = chunks_module.decode_chunks

    def counting(buf: bytes, starts: list[int], ends: list[int], counts: list[int]) -> tuple[np.ndarray, np.ndarray]:
        out = real(buf, starts, ends, counts)
        decoded.append([int(out[0][0])])
        return out

    monkeypatch.setattr(chunks_module, "decode_chunks", counting)
    s = split_chunks(c, [0], int(t[0]), int(t[-1]))
    assert decoded == [] and s.whole_samples.tolist() == [24] and len(s.timestamps) == 0
    s = split_chunks(c, [0], int(t[2]), int(t[-2]))  # cuts chunks 0 and 3 (decoded in one call)
    assert decoded == [[int(t[0])]] and s.whole_samples.tolist() == [12] and len(s.timestamps) == 4 + 5


def test_a_snapshot_keeps_every_chunk_and_its_sum(tmp_path: Path) -> None:
    n = 20
    store = Store(StoreSettings(chunk_samples=10, head_keep=2))
    labels = [make_labels("cpu", {"namespace": "ns", "pod": f"p{i}"}) for i in range(n)]
    ids = np.array([series_id(lab) for lab in labels], np.uint64)
    for k in range(45):
        store.write(ids, np.ones(n), np.full(n, T0 + k * 10_000), np.arange(n) * 0.5 + k,
                    {int(i): lab for i, lab in zip(ids, labels, strict=True)})
    img = capture(store, WalPosition(1, 0))
    assert len(img.chunk_index) == 5 * int(img.chunk_counts.sum())  # CIDX: five int64 per closed chunk
    path, _ = write_snapshot(tmp_path, img)
    back = restore(read_snapshot(path), store.settings)
    back._check()
    for r in range(n):
        assert sums(back.chunks, r) == sums(store.chunks, r)
    again = capture(back, WalPosition(1, 0))
    assert again.chunk_index.tobytes() == img.chunk_index.tobytes() and again.chunk_data == img.chunk_data
    assert again.open_data == img.open_data


def test_sample_hashes_are_elementwise_for_two_dimensional_blocks() -> None:
    ts = T0 + np.arange(12, dtype=np.int64).reshape(3, 4) * 1000
    vals = np.linspace(0, 1, 12).reshape(3, 4)
    assert sample_hashes(ts, vals).reshape(-1).tolist() == sample_hashes(ts.reshape(-1), vals.reshape(-1)).tolist()


def test_an_empty_chain_starts_a_chunk() -> None:
    enc = encode_blocks(np.array([[T0, T0 + 1]]), np.array([[1.0, 2.0]]), Chain.empty(1), 8)
    assert enc.started.tolist() == [True]
