"""The hourly Parquet writer: each closed hour's samples and rollups, once, through fsspec.

An hour is closed ``delay_s`` after it ends (samples may arrive late: an agent's spool after an
outage). At start and then every ``check_s`` the writer looks at the hours still within the raw
retention and writes, oldest first, each that has no ``_SUCCESS`` marker yet; so a stopped
process catches up when it comes back, and an hour is written again only if it never finished.
Files are written whole (a temporary name then a rename on a local disk; one put per object on an
object store), the marker last.

The data comes from any MetricsBackend (``metricsd up``'s store, a proxy's quorum reads, which
merge replicas so each sample appears once), a few pods per read, as /api/v1/export reads it.
In a cluster, ``cluster up`` gives --parquet-dir to one proxy only.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator

import fsspec
import numpy as np

from metricsd.clock import Clock
from metricsd.http.export import EXPORT_SERIES_PER_READ, re_escape, read_batches
from metricsd.onward.parquet import (
    FORMAT_VERSION,
    HourFiles,
    Rollups,
    Series,
    hour_dir,
    rollups_table,
    samples_table,
    to_parquet,
)
from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc.backend import MetricsBackend
from metricsd.rpc.wire import labels_from_pb

__all__ = ["HourlyParquet", "hour_files"]

log = logging.getLogger("metricsd.onward.parquet")

HOUR_MS = 3_600_000
_ALL = [pb.Matcher(type=pb.Matcher.RE, name="__name__", value=".+")]


async def _groups(backend: MetricsBackend) -> list[list[pb.Matcher]]:
    listed = await backend.list_series(pb.ListSeriesRequest(matchers=_ALL))
    found = [(s.id, labels_from_pb(s.labels)) for s in listed.series]
    return [[*_ALL, pb.Matcher(type=pb.Matcher.EQ, name="namespace", value=ns),
             pb.Matcher(type=pb.Matcher.RE, name="pod", value="|".join(re_escape(p) for p in pods))]
            for ns, pods in read_batches(found, EXPORT_SERIES_PER_READ)]


async def _samples(backend: MetricsBackend, hour_ms: int) -> AsyncIterator[list[Series]]:
    for matchers in await _groups(backend):
        got = await backend.read(pb.ReadRequest(matchers=matchers, start_ms=hour_ms, end_ms=hour_ms + HOUR_MS - 1))
        yield [Series(labels_from_pb(s.labels), np.array(s.timestamps, np.int64), np.array(s.values, np.float64))
               for s in got.series if len(s.timestamps)]


async def hour_files(backend: MetricsBackend, hour_ms: int) -> HourFiles:
    """Both files of the hour starting at ``hour_ms``, built in memory."""
    series: list[Series] = []
    async for part in _samples(backend, hour_ms):
        series += part
    series.sort(key=lambda s: s.labels)
    roll = await backend.rollups(pb.ReadRequest(matchers=_ALL, start_ms=hour_ms, end_ms=hour_ms))
    rollups = sorted((Rollups(labels_from_pb(s.labels), np.array(s.hours, np.int64), np.array(s.min),
                              np.array(s.max), np.array(s.sum), np.array(s.count), np.array(s.last))
                      for s in roll.series if len(s.hours)), key=lambda r: r.labels)
    samples = sum(len(s.timestamps) for s in series)
    return HourFiles(hour_ms, to_parquet(samples_table(series), "timestamp"),
                     to_parquet(rollups_table(rollups), "hour"),
                     {"format": FORMAT_VERSION, "hour_start_ms": hour_ms, "samples": samples, "series": len(series),
                      "rollup_series": len(rollups), "written_ms": int(time.time() * 1000)})


class HourlyParquet:
    """``run()`` until cancelled. ``root``: a directory or an fsspec URL."""

    def __init__(self, backend: MetricsBackend, root: str, clock: Clock, *, delay_s: float = 600.0,
                 lookback_hours: int = 24, check_s: float = 60.0) -> None:
        self.backend = backend
        self.fs, self.root = fsspec.core.url_to_fs(root)
        self.clock = clock
        self.delay_ms = int(delay_s * 1000)
        self.lookback_hours = lookback_hours
        self.check_s = check_s
        self.written = 0

    def due(self) -> list[int]:
        """Closed hours within the lookback without a marker, oldest first."""
        last = (self.clock.now_ms() - self.delay_ms) // HOUR_MS * HOUR_MS - HOUR_MS
        hours = [last - i * HOUR_MS for i in range(self.lookback_hours)]
        return sorted(h for h in hours if h >= 0 and not self.fs.exists(self._path(hour_dir("samples", h),
                                                                                    "_SUCCESS")))

    def _path(self, *parts: str) -> str:
        return "/".join([self.root.rstrip("/"), *parts])

    async def write_hour(self, hour_ms: int) -> HourFiles:
        files = await hour_files(self.backend, hour_ms)
        for rel, data in files.files():
            path = self._path(rel)
            self.fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
            if getattr(self.fs, "protocol", None) in ("file", ("file", "local")):
                tmp = f"{path}.{uuid.uuid4().hex}.tmp"
                self.fs.pipe_file(tmp, data)
                self.fs.mv(tmp, path)
            else:
                self.fs.pipe_file(path, data)
        self.written += 1
        log.info("parquet: hour %s written (%d samples, %d series)", hour_dir("samples", hour_ms),
                 files.manifest["samples"], files.manifest["series"])
        return files

    async def run(self) -> None:
        while True:
            for hour in self.due():
                try:
                    await self.write_hour(hour)
                except Exception as e:  # keep going: the next check tries the hour again
                    log.warning("parquet: hour %s not written: %s", hour_dir("samples", hour), e)
                    break
            await asyncio.sleep(self.check_s)
