"""read_one (one series, through Store.series_samples) against read_rows of that one row: the same
samples bit for bit, on stores with sealed and open chunks, merges and retention, for ranges
inside, across and outside the data, and the same sample limit."""

from __future__ import annotations

import numpy as np
import pytest
from test_store_readmany import T0, _store

from metricsd.store.readone import read_one
from metricsd.store.scan import SampleLimitReached, read_rows


def _bits(s: object) -> tuple[list[int], list[int], list[int]]:
    return (s.offsets.tolist(), s.timestamps.tolist(), s.values.view(np.int64).tolist())  # type: ignore[attr-defined]


@pytest.mark.parametrize(("seed", "chunk_samples", "head_keep"), [(0, 720, 16), (1, 10, 3), (2, 40, 8), (3, 5, 1)])
def test_one_row_reads_as_read_rows_reads_it(seed: int, chunk_samples: int, head_keep: int) -> None:
    store = _store(seed, chunk_samples, head_keep)
    rng = np.random.default_rng(seed)
    ranges = [(0, 2**62), (T0, T0 + 600_000), (T0 + 1_234_567, T0 + 2_400_000), (T0 - 10, T0 - 1)]
    ranges += [(int(a), int(a + b)) for a, b in zip(rng.integers(T0, T0 + 3_000_000, 20),
                                                   rng.integers(0, 1_500_000, 20), strict=True)]
    seen = 0
    for row in range(len(store.index.labels)):
        if store.index.labels[row] is None:  # a row freed by retention
            continue
        for lo, hi in ranges:
            want = read_rows(store, np.array([row]), lo, hi)
            assert _bits(read_one(store, row, lo, hi)) == _bits(want)
            seen += len(want.timestamps)
    assert seen > 1_000


def test_the_sample_limit_is_read_rows_limit() -> None:
    store = _store(1, 10, 3)
    row = next(r for r in range(len(store.index.ids)) if store.index.labels[r] is not None)
    n = len(read_rows(store, np.array([row]), 0, 2**62).timestamps)
    assert len(read_one(store, row, 0, 2**62, max_samples=n).timestamps) == n
    for read in (read_one, lambda s, r, lo, hi, max_samples: read_rows(s, np.array([r]), lo, hi, max_samples)):
        with pytest.raises(SampleLimitReached):
            read(store, row, 0, 2**62, max_samples=n - 1)
