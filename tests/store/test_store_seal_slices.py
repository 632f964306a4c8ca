"""A wave of more series than SEAL_ROWS is sealed in slices (store/seal.py): every series' samples
read back as written, and the store's invariants hold, whatever the slice size."""

from __future__ import annotations

import numpy as np
import pytest

from metricsd.model import make_labels, series_id
from metricsd.store import seal
from metricsd.store.engine import Store

T0 = 1_700_000_000_000


@pytest.mark.parametrize("slice_rows", [1, 3, 2048])
def test_a_wave_sealed_in_slices_reads_back_as_written(monkeypatch: pytest.MonkeyPatch, slice_rows: int) -> None:
    monkeypatch.setattr(seal, "SEAL_ROWS", slice_rows)
    labels = [make_labels("cpu", {"namespace": "ns", "pod": f"p{i}"}) for i in range(10)]
    ids = np.array([series_id(lab) for lab in labels], np.uint64)
    store = Store()
    rng = np.random.default_rng(7)
    values = np.round(rng.random((len(ids), 100)) * 100, 1)
    store.write(ids, np.ones(len(ids), np.int64), np.full(len(ids), T0), values[:, 0],
                dict(zip(ids.tolist(), labels, strict=True)))
    for k in range(1, 70):  # one sample a series a write: waves at every block
        store.write(ids, np.ones(len(ids), np.int64), np.full(len(ids), T0 + 10_000 * k), values[:, k])
    # then 31 samples a series in one write (the backfill shape: a wave of several blocks)
    ts = T0 + 10_000 * np.arange(70, 100)
    store.write(ids, np.full(len(ids), 30), np.tile(ts, len(ids)), values[:, 70:].ravel())
    store._check()
    for i, sid in enumerate(ids.tolist()):
        row = store.index.row_of(sid)
        assert row is not None and int(store.chunks.samples[row]) >= 64  # sealed, not only in the ring
        t, v = store.series_samples(row, 0, 2**62)
        assert t.tolist() == (T0 + 10_000 * np.arange(100)).tolist()
        assert v.tolist() == values[i].tolist()
