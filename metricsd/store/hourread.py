"""A store's read of a whole closed hour, for the hourly Parquet writer in its own process
(``metricsd up``; onward/hourly.py HourSource): every live series, a slice of rows at a time,
answered as columns; the hour's rollups as columns.

Before, the writer listed every series (a ListSeries of 40,000 label sets), grouped them into
regexes of whole pods and read each group through the matcher machinery, and took the rollups
as a message per series. Here no selector is evaluated: the store's live rows are read in order,
SERIES_PER_READ at a time (the event loop runs writes and queries in between), and labels come
from the index's columns.
"""

from __future__ import annotations

import asyncio

import numpy as np

from metricsd.columns import SeriesColumns
from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc.rollupbatch import RollupArrays, rollups_from_response
from metricsd.store.api import StoreAPI
from metricsd.store.scan import read_rows

__all__ = ["SERIES_PER_READ", "StoreHour"]

SERIES_PER_READ = 2_000
"""Rows read between two yields: about 720,000 samples of an hour at 10 s, some 50 ms of decoding."""

_ALL = [pb.Matcher(type=pb.Matcher.RE, name="__name__", value=".+")]


class StoreHour:
    """``read(start_ms, end_ms)``: (every series' samples in the range, its rollups of the hour
    starting at start_ms)."""

    def __init__(self, api: StoreAPI, series_per_read: int = SERIES_PER_READ) -> None:
        self.api = api
        self.series_per_read = series_per_read

    async def read(self, start_ms: int, end_ms: int) -> tuple[SeriesColumns, RollupArrays]:
        store = self.api.store
        rows = np.array(store.select([]), np.int64)  # a copy: the index may replace its array meanwhile
        parts = []
        for i in range(0, len(rows), self.series_per_read):
            r = rows[i : i + self.series_per_read]
            r = r[store.index.alive[r]]  # a series dropped (retention) while we yielded
            got = read_rows(store, r, start_ms, end_ms)
            index = store.index
            parts.append(SeriesColumns(index.label_columns(r), got.offsets, got.timestamps, got.values,
                                       index.id_column[r]))
            await asyncio.sleep(0)
        rollups = rollups_from_response(self.api.rollups(pb.ReadRequest(matchers=_ALL, start_ms=start_ms,
                                                                         end_ms=start_ms, columnar=True)))
        return SeriesColumns.concat(parts), rollups
