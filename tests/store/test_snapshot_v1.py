"""A version-1 snapshot (raw head samples, version-1 chunks), as a store before the compressed head
wrote it, loads into this store: every sample, rollup and counter as the writes that made it give."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from v1_writes import fill

from metricsd.store.engine import Store
from metricsd.store.settings import StoreSettings
from metricsd.store.snapshot import SnapshotError, read_snapshot, restore
from metricsd.store.wal import WalPosition

V1 = Path(__file__).parent / "data" / "v1.snap"
SETTINGS = StoreSettings(chunk_samples=10, head_keep=3, ooo_window_ms=3_600_000)


def _bits(a: np.ndarray) -> list[int]:
    return np.ascontiguousarray(a, dtype=np.float64).view(np.int64).tolist()


@pytest.mark.parametrize("settings", [SETTINGS, StoreSettings(ooo_window_ms=3_600_000)], ids=["same", "defaults"])
def test_a_version_1_snapshot_loads_every_sample_and_rollup(settings: StoreSettings) -> None:
    img = read_snapshot(V1)
    assert img.position == WalPosition(7, 16)
    back = restore(img, settings)
    back._check()
    want = Store(settings)
    fill(want)
    got_st, want_st = back.stats(), want.stats()
    assert [got_st[k] for k in ("series", "samples", "pods", "rollup_buckets")] == \
        [want_st[k] for k in ("series", "samples", "pods", "rollup_buckets")]
    assert (back.max_ts, back.samples_written, dict(back.rejected)) == (want.max_ts, want.samples_written,
                                                                         dict(want.rejected))
    for row in want.index.live_rows():
        sid = want.index.ids[row]
        got_row = back.index.row_of(sid)
        assert got_row is not None and back.index.labels[got_row] == want.index.labels[row]
        a = back.series_samples(got_row, -(2**62), 2**62)
        b = want.series_samples(row, -(2**62), 2**62)
        assert a[0].tolist() == b[0].tolist() and _bits(a[1]) == _bits(b[1])
        ra, rb = back.rollups.points(got_row, -(2**62), 2**62), want.rollups.points(row, -(2**62), 2**62)
        for f in ("hour", "min", "max", "sum", "count", "last"):
            assert _bits(getattr(ra, f)) == _bits(getattr(rb, f)), f


def test_a_damaged_version_1_snapshot_is_refused(tmp_path: Path) -> None:
    whole = V1.read_bytes()
    bad = tmp_path / "00000007.snap"
    for pos in (10, len(whole) // 3, len(whole) // 2, len(whole) - 30):
        buf = bytearray(whole)
        buf[pos] ^= 0x10
        bad.write_bytes(bytes(buf))
        with pytest.raises(SnapshotError):
            read_snapshot(bad)
