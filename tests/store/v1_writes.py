"""The writes behind tests/store/data/v1.snap, a version-1 snapshot (metricsd/store/FORMAT.md,
"Version 1") taken by the store as of commit 9d2c061 with StoreSettings(chunk_samples=10,
head_keep=3, ooo_window_ms=3_600_000) at WAL position (7, 16):

    PYTHONPATH=<a checkout of 9d2c061> python -c 'from v1_writes import ...'  # see test_snapshot_v1.py

Kept apart so the test replays exactly what made the file."""

from __future__ import annotations

import numpy as np

from metricsd.model import make_labels, series_id, stale_marker
from metricsd.store.engine import Store

T0 = 1_700_000_000_000


def labels(i: int) -> tuple[tuple[str, str], ...]:
    return make_labels("cpu" if i % 2 else "mem", {"namespace": f"ns{i % 3}", "pod": f"p{i}", "note": "é✓"})


def fill(store: Store) -> None:
    """Sealed chunks, partly full heads, NaN and stale values, an out-of-order merge, rollups."""
    rng = np.random.default_rng(3)
    labs = [labels(i) for i in range(8)]
    ids = np.array([series_id(lab) for lab in labs], dtype=np.uint64)
    t = T0
    for k in range(5):
        n = int(rng.integers(3, 25))
        ts = np.concatenate([t + np.arange(n) * 60_000 + i for i in range(8)])
        vals = rng.normal(size=len(ts)).round(3)
        vals[::7] = np.nan
        vals[3::11] = stale_marker()
        store.write(ids, np.full(8, n), ts, vals, {int(i): lab for i, lab in zip(ids, labs, strict=True)}
                    if k == 0 else None)
        t += n * 60_000 + 1_800_000
    store.write(ids[:1], np.array([1]), np.array([t - 1_800_000 - 90_000]), np.array([4.5]))  # merged
