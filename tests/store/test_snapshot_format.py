"""Snapshots: a store written and read back is the same store; damaged files are refused, never half-loaded."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
from store_state import assert_same_state, canonical

from metricsd.model import make_labels, series_id, stale_marker
from metricsd.store.engine import Store
from metricsd.store.settings import StoreSettings
from metricsd.store.snapshot import SnapshotError, capture, list_snapshots, read_snapshot, restore, write_snapshot
from metricsd.store.wal import WalPosition

HOUR = 3_600_000
SETTINGS = StoreSettings(chunk_samples=8, head_keep=3, retention_ms=3 * HOUR, ooo_window_ms=HOUR)


def _labels(i: int) -> tuple[tuple[str, str], ...]:
    return make_labels("cpu" if i % 2 else "mem", {"namespace": f"ns{i % 3}", "pod": f"p{i}",
                                                   "workload": f"w{i % 4}", "note": "é✓" if i == 5 else ""})


def build_store(settings: StoreSettings = SETTINGS, seed: int = 0) -> Store:
    """Sealed chunks, partly full heads, out-of-order merges, NaN and stale values, closed rollup
    hours, and series removed by retention (tombstones)."""
    rng = np.random.default_rng(seed)
    store = Store(settings)
    labels = [_labels(i) for i in range(12)]
    ids = np.array([series_id(lab) for lab in labels], dtype=np.uint64)
    t = 1_700_000_000_000
    for k in range(6):
        n = int(rng.integers(1, 30))
        live = list(range(12)) if k < 3 else list(range(6))  # series 6..11 stop; retention drops them
        ts = np.concatenate([t + np.arange(n) * 60_000 + i for i in live])
        vals = rng.normal(size=len(ts))
        vals[::11] = np.nan
        vals[5::13] = stale_marker()
        new = {int(ids[i]): labels[i] for i in live} if k == 0 else None
        store.write(ids[live], np.full(len(live), n), ts, vals, new)
        t += n * 60_000 + HOUR
    # out of order, within the window, into sealed chunks
    store.write(ids[:2], np.array([2, 1]), np.array([t - 2 * HOUR - 30_000, t - 2 * HOUR - 10_000, t - 2 * HOUR]),
                np.array([1.0, 2.0, 3.0]))
    assert store.gc() > 0
    store._check()
    return store


def test_a_store_written_and_read_back_is_the_same_store(tmp_path: Path) -> None:
    store = build_store()
    path, size = write_snapshot(tmp_path, capture(store, WalPosition(3, 16)))
    assert path.name == "00000003.snap" and size == path.stat().st_size
    img = read_snapshot(path)
    assert img.position == WalPosition(3, 16)
    back = restore(img, SETTINGS)
    assert_same_state(back, store)
    assert back.stats()["series"] == 6 and back.index.n_rows == 6  # tombstones are not carried over
    assert back.rejected == store.rejected and back.samples_written == store.samples_written


def test_the_restored_store_takes_writes_like_the_original(tmp_path: Path) -> None:
    store = build_store()
    path, _ = write_snapshot(tmp_path, capture(store, WalPosition(1, 16)))
    back = restore(read_snapshot(path), SETTINGS)
    new_label = make_labels("cpu", {"namespace": "ns9", "pod": "fresh"})
    sid = series_id(new_label)
    ids = np.array([store.index.ids[0], store.index.ids[1], sid], dtype=np.uint64)
    ts = int(store.max_ts) + 1000 * np.arange(1, 4)
    late = np.array([store.index.ids[2]], dtype=np.uint64)
    for s in (store, back):
        s.write(ids, np.ones(3, dtype=np.int64), ts, np.arange(3, dtype=np.float64), {sid: new_label})
        s.write(late, np.array([1]), np.array([int(store.max_ts) - 2 * HOUR]), np.array([7.0]))  # too old
    assert_same_state(back, store)


def test_an_empty_store_round_trips(tmp_path: Path) -> None:
    store = Store(SETTINGS)
    path, _ = write_snapshot(tmp_path, capture(store, WalPosition(1, 16)))
    assert_same_state(restore(read_snapshot(path), SETTINGS), store)


def test_capture_shares_nothing_with_the_live_store(tmp_path: Path) -> None:
    store = build_store()
    img = capture(store, WalPosition(1, 16))
    before = canonical(restore(img, SETTINGS))
    sid = store.index.ids[0]
    store.write(np.array([sid], dtype=np.uint64), np.array([3]), np.arange(3) + int(store.max_ts) + 1,
                np.ones(3))
    store.gc()
    path, _ = write_snapshot(tmp_path, img)
    assert canonical(restore(read_snapshot(path), SETTINGS)) == before


@pytest.mark.parametrize(("chunk_samples", "head_keep"), [(4, 2), (30, 10)])
def test_a_snapshot_loads_into_a_store_with_another_head_size(tmp_path: Path, chunk_samples: int,
                                                              head_keep: int) -> None:
    store = build_store()
    path, _ = write_snapshot(tmp_path, capture(store, WalPosition(1, 16)))
    other = StoreSettings(chunk_samples=chunk_samples, head_keep=head_keep, retention_ms=SETTINGS.retention_ms,
                          ooo_window_ms=SETTINGS.ooo_window_ms)
    back = restore(read_snapshot(path), other)
    back._check()
    for row in store.index.live_rows():
        sid = store.index.ids[row]
        want = store.series_samples(row, -(2**62), 2**62)
        got = back.series_samples(back.index.row_of(sid) or 0, -(2**62), 2**62)
        assert got[0].tolist() == want[0].tolist()
        assert got[1].view(np.int64).tolist() == want[1].view(np.int64).tolist()


def test_every_damaged_copy_is_refused_with_a_snapshot_error(tmp_path: Path) -> None:
    store = build_store()
    path, _ = write_snapshot(tmp_path, capture(store, WalPosition(1, 16)))
    whole = path.read_bytes()
    rng = random.Random(1)
    bad = tmp_path / "bad.snap"
    for bit in [*rng.sample(range(len(whole) * 8), 300), 0, len(whole) * 8 - 1]:
        buf = bytearray(whole)
        buf[bit // 8] ^= 1 << (bit % 8)
        bad.write_bytes(bytes(buf))
        with pytest.raises(SnapshotError):
            read_snapshot(bad)
    for cut in [0, 3, 8, 20, len(whole) // 2, len(whole) - 21, len(whole) - 1]:
        bad.write_bytes(whole[:cut])
        with pytest.raises(SnapshotError):
            read_snapshot(bad)


def test_a_half_written_snapshot_never_replaces_the_last_good_one(tmp_path: Path) -> None:
    store = build_store()
    write_snapshot(tmp_path, capture(store, WalPosition(4, 16)))
    (tmp_path / "00000005.snap.tmp").write_bytes(b"MDSN partial")
    assert [s for s, _ in list_snapshots(tmp_path)] == [4]
