"""Reading ONE series for a query: a dashboard panel of one pod (``rate(cpu{pod="x"}[1m])``).

scan.read_rows reads any number of rows in batches (readmany.py: the rings in one NumPy pass, the
chunks of every row joined and decoded together), whose fixed cost per call is most of the work
when the selector names one series. ``Store.series_samples`` is the one-row read that
series_samples_many is specified against (tests/store/test_store_readmany.py); here it answers in
read_rows' shape, with the same sample limit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from metricsd.store.scan import SampleLimitReached, Samples

if TYPE_CHECKING:
    from metricsd.store.engine import Store

__all__ = ["read_one"]


def read_one(store: Store, row: int, start_ms: int, end_ms: int, max_samples: int = 0) -> Samples:
    """read_rows of the one row ``row``: its samples in [start_ms, end_ms], stale markers included.
    Raises SampleLimitReached past ``max_samples`` (0: none)."""
    t, v = store.series_samples(row, start_ms, end_ms)
    if max_samples and len(t) > max_samples:
        raise SampleLimitReached(max_samples)
    return Samples(np.array([0, len(t)], dtype=np.int64), t, v)
