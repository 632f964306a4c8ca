"""Store.series_samples_many (many series read together, their chunks decoded at once) against
series_samples one row at a time, on stores with sealed and open chunks, merges, retention, a
restart, and every kind of range; and codec.blocks.decode_many against decode_chunks."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from metricsd.codec import CorruptChunk
from metricsd.codec.blockdecode import decode_chunks, decode_many
from metricsd.codec.blocks import Chain, encode_blocks
from metricsd.model import make_labels, series_id, stale_marker
from metricsd.store.engine import Store
from metricsd.store.settings import StoreSettings
from metricsd.store.snapshot import capture, restore
from metricsd.store.wal import WalPosition

T0 = 1_700_000_000_000


def _store(seed: int, chunk_samples: int, head_keep: int) -> Store:
    rng = np.random.default_rng(seed)
    store = Store(StoreSettings(chunk_samples=chunk_samples, head_keep=head_keep, retention_ms=40 * 60_000,
                                ooo_window_ms=10 * 60_000))
    labels = [make_labels("cpu", {"namespace": "ns", "pod": f"p{i}"}) for i in range(30)]
    ids = np.array([series_id(lab) for lab in labels], np.uint64)
    t = T0
    for step in range(40):
        live = rng.choice(30, size=int(rng.integers(1, 30)), replace=False)
        n = int(rng.integers(1, 12))
        ts = np.concatenate([t + np.arange(n) * 10_000 + int(i) for i in live])
        vals = np.round(rng.normal(size=len(ts)), int(rng.integers(0, 4)))
        vals[::17] = np.nan
        vals[3::29] = stale_marker()
        store.write(ids[live], np.full(len(live), n), ts, vals, {int(ids[i]): labels[i] for i in live})
        if step % 9 == 4:  # out of order, within the window
            store.write(ids[live[:1]], np.array([1]), np.array([t - 30_000 + 7]), np.array([1.5]))
        if step % 13 == 12:
            store.gc()
        t += n * 10_000
    return store


def _one_by_one(store: Store, rows: np.ndarray, lo: int, hi: int) -> tuple[list[int], list[int], list[int]]:
    counts, ts, bits = [], [], []
    for r in rows.tolist():
        t, v = store.series_samples(r, lo, hi)
        counts.append(len(t))
        ts += t.tolist()
        bits += v.view(np.int64).tolist()
    return counts, ts, bits


@pytest.mark.parametrize(("seed", "chunk_samples", "head_keep"), [(0, 720, 16), (1, 10, 3), (2, 40, 8), (3, 5, 1)])
def test_reading_many_equals_reading_each(seed: int, chunk_samples: int, head_keep: int) -> None:
    store = _store(seed, chunk_samples, head_keep)
    again = restore(capture(store, WalPosition(1, 16)), store.settings)
    for s in (store, again):
        rows = s.index.live_rows()
        rows = np.array(list(rows), dtype=np.int64)
        np.random.default_rng(seed).shuffle(rows)
        t_max = int(s.max_ts)
        for lo, hi in [(-(2**62), 2**62), (T0 + 60_000, t_max - 90_000), (t_max - 20_000, t_max), (t_max + 1, 2**62),
                       (T0 + 123_456, T0 + 123_456)]:
            counts, ts, vals = s.series_samples_many(rows, lo, hi)
            want = _one_by_one(s, rows, lo, hi)
            assert (counts.tolist(), ts.tolist(), vals.view(np.int64).tolist()) == want


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(1, 40), st.integers(1, 5)), min_size=1, max_size=8), st.integers(0, 2**32))
def test_decode_many_equals_decode_chunks(shapes: list[tuple[int, int]], seed: int) -> None:
    rng = np.random.default_rng(seed)
    bufs, counts = [], []
    for n, blocks in shapes:
        chain = Chain.empty(1)
        t = T0 + np.cumsum(rng.integers(1, 20_000, n * blocks))
        v = rng.choice([np.round(rng.normal(size=n * blocks), 2), rng.normal(size=n * blocks),
                        np.full(n * blocks, 3.0)])
        for b in range(blocks):
            enc = encode_blocks(t[None, b * n : (b + 1) * n], v[None, b * n : (b + 1) * n], chain, n)
            chain = enc.after
            if enc.started[0]:  # a new chunk (the first, or the values left the chunk's scale)
                bufs.append(b"")
                counts.append(0)
            bufs[-1] += enc.data.tobytes()
            counts[-1] += n
    ends = np.cumsum([len(b) for b in bufs])
    starts = ends - [len(b) for b in bufs]
    buf = b"".join(bufs)
    a = decode_many(buf, starts, ends, np.array(counts))
    b = decode_chunks(buf, starts.tolist(), ends.tolist(), counts)
    assert a[0].tolist() == b[0].tolist() and a[1].view(np.int64).tolist() == b[1].view(np.int64).tolist()


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 10**6), st.integers(1, 255)), min_size=1, max_size=5))
def test_decode_many_on_damaged_chunks_raises_corrupt_chunk_only(flips: list[tuple[int, int]]) -> None:
    rng = np.random.default_rng(7)
    chain = Chain.empty(3)
    parts: list[list[bytes]] = [[], [], []]
    t = T0 + np.cumsum(rng.integers(1, 20_000, (3, 48)), axis=1)
    v = np.stack([np.round(rng.normal(size=48), 3), rng.normal(size=48), np.full(48, 1.0)])
    for b in range(3):
        enc = encode_blocks(t[:, b * 16 : (b + 1) * 16], v[:, b * 16 : (b + 1) * 16], chain, 16)
        chain = enc.after
        for r in range(3):
            parts[r].append(enc.data[enc.offsets[r] : enc.offsets[r + 1]].tobytes())
    bufs = [b"".join(p) for p in parts]
    buf = bytearray(b"".join(bufs))
    for pos, x in flips:
        buf[pos % len(buf)] ^= x
    ends = np.cumsum([len(b) for b in bufs])
    try:
        got, _ = decode_many(bytes(buf), ends - [len(b) for b in bufs], ends, np.full(3, 48))
    except CorruptChunk:
        return
    assert len(got) == 3 * 48


def test_walk_many_walks_few_chunks_in_python_as_the_lock_step_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """walk_many below FEW_CHUNKS (a Python step per block) gives the lock step's rows exactly."""
    from metricsd.codec import blockdecode
    from metricsd.model import make_labels, series_id
    from metricsd.store.engine import Store
    from metricsd.store.settings import StoreSettings

    rng = np.random.default_rng(5)
    store = Store(StoreSettings(chunk_samples=120, head_keep=16))
    labs = [make_labels("m", {"namespace": "n", "pod": f"p{i}"}) for i in range(5)]
    ids = np.array([series_id(lab) for lab in labs], np.uint64)
    ts = np.cumsum(rng.integers(9_000, 11_000, 400))
    vals = [np.round(rng.normal(0, 5, 400), 2), rng.normal(0, 1, 400), np.full(400, 3.0),
            np.cumsum(rng.integers(0, 9, 400)).astype(float), rng.integers(0, 2, 400) * 1e300]
    store.write(ids, np.full(5, 400), np.tile(ts, 5), np.concatenate(vals), dict(zip(ids.tolist(), labs, strict=True)))
    bufs, starts, ends, counts = [], [], [], []
    at = 0
    for row in range(5):
        e = store.chunks.entries(row)
        payload, _ = store.chunks.closed(row)
        buf = bytes(payload) + store.chunks.open[row]
        bufs.append(buf)
        starts += [at + (int(e[j - 1, 2]) if j else 0) for j in range(len(e))]
        ends += [at + int(e[j, 2]) for j in range(len(e))]
        counts += e[:, 3].tolist()
        at += len(buf)
    joined = b"".join(bufs)
    args = (joined, np.array(starts), np.array(ends), np.array(counts), rng.integers(0, 3, len(counts)))
    assert len(counts) < blockdecode.FEW_CHUNKS
    _, heads_a, blocks_a = blockdecode.walk_many(*args)  # type: ignore[misc]
    monkeypatch.setattr(blockdecode, "FEW_CHUNKS", 0)
    _, heads_b, blocks_b = blockdecode.walk_many(*args)  # type: ignore[misc]
    assert blocks_a.tolist() == blocks_b.tolist()
    for f in ("family", "t1", "d1", "m1", "x1", "e1"):
        assert getattr(heads_a, f).tolist() == getattr(heads_b, f).tolist(), f
