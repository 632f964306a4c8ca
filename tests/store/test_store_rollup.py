"""Hourly rollups against brute force over random, partly out-of-order writes."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from metricsd.model import make_labels, series_id
from metricsd.selector import Matcher
from metricsd.store.engine import Store
from metricsd.store.rollup import HOUR_MS
from metricsd.store.settings import StoreSettings


@pytest.mark.parametrize("seed", range(5))
def test_rollups_equal_brute_force(seed: int) -> None:
    rng = random.Random(seed)
    store = Store(StoreSettings(chunk_samples=rng.choice([5, 120]), head_keep=2, ooo_window_ms=3 * HOUR_MS))
    labels = [make_labels("m", {"namespace": "n", "pod": f"p{i}"}) for i in range(4)]
    ids = [series_id(lab) for lab in labels]
    kept: dict[int, dict[int, float]] = {sid: {} for sid in ids}
    t = {sid: 0 for sid in ids}
    for _ in range(60):
        batch_ids, counts, ts, vals = [], [], [], []
        for sid in rng.sample(ids, rng.randint(1, 4)):
            back = rng.random() < 0.15
            start = t[sid] - rng.randint(1, 2 * HOUR_MS) if back else t[sid] + rng.randint(1, 600_000)
            n = rng.randint(1, 40)
            series_ts = sorted({start + rng.randint(0, 400) * 10_000 for _ in range(n)})
            series_vals = [rng.choice([float(rng.randint(-50, 50)), math.nan]) for _ in series_ts]
            batch_ids.append(sid)
            counts.append(len(series_ts))
            ts += series_ts
            vals += series_vals
            for a, b in zip(series_ts, series_vals, strict=True):
                if a >= max(t[sid], series_ts[-1]) - 3 * HOUR_MS and a not in kept[sid]:
                    kept[sid][a] = b
            t[sid] = max(t[sid], series_ts[-1])
        store.write(np.array(batch_ids, np.uint64), np.array(counts), np.array(ts), np.array(vals),
                    dict(zip(ids, labels, strict=True)))
    for sid, lab in zip(ids, labels, strict=True):
        ((_, _, pts),) = store.rollup_points([Matcher.eq("pod", dict(lab)["pod"])], -(10**13), 10**13)
        want: dict[int, list[float]] = {}
        for a, b in sorted(kept[sid].items()):
            if not math.isnan(b):
                want.setdefault((a // HOUR_MS) * HOUR_MS, []).append(b)
        assert pts.hour.tolist() == sorted(want)
        for i, h in enumerate(pts.hour.tolist()):
            vs = want[h]
            assert (pts.min[i], pts.max[i], pts.count[i]) == (min(vs), max(vs), len(vs))
            assert pts.sum[i] == pytest.approx(sum(vs))
