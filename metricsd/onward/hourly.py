"""The hourly Parquet writer: each closed hour's samples and rollups, once, through fsspec.

An hour is closed ``delay_s`` after it ends (samples may arrive late: an agent's spool after an
outage). At start and then every ``check_s`` the writer looks at the hours still within the raw
retention and writes, oldest first, each that has no ``_SUCCESS`` marker yet; so a stopped
process catches up when it comes back, and an hour is written again only if it never finished.
Files are written whole (a temporary name then a rename on a local disk; one put per object on an
object store), the marker last.

The data comes from any MetricsBackend (``metricsd up``'s store, a proxy's quorum reads, which
merge replicas so each sample appears once), whole pods of a namespace per read, about
PARQUET_SERIES_PER_READ series each, asked as columns (``backend_columns``: the Read's columnar
flag, answered by one SeriesBatch of arrays, which a proxy's fan-out asks its stores for too and
merges as columns: proxy/batchmerge.py); or, given one, from the store's columnar read where the
store is in this process (``store_columns``: ``metricsd up``), the same reads answered as NumPy
arrays with no message at all. In a cluster, ``cluster up`` gives --parquet-dir to every proxy and
they elect the one that writes (``ElectedParquet``); it reads the hour through a ``source``
(metricsd/proxy/hourread.py): each slot from one replica that the others' digests vouch for, its
rollups as columns, so each sample is decoded once in the cluster instead of R times and merged.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

import fsspec
import numpy as np

from metricsd.clock import Clock
from metricsd.columns import SeriesColumns
from metricsd.http.export import re_escape, read_batches
from metricsd.model import Labels
from metricsd.onward.parquet import (
    FORMAT_VERSION,
    HourFiles,
    SampleColumns,
    hour_dir,
    to_parquet,
)
from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc import columnar
from metricsd.rpc.backend import MetricsBackend
from metricsd.rpc.rollupbatch import RollupArrays, rollups_from_response
from metricsd.rpc.wire import labels_from_pb, matchers_from_pb
from metricsd.selector import Matcher

__all__ = ["PARQUET_SERIES_PER_READ", "HourSource", "HourlyParquet", "ReadColumns", "backend_columns",
           "from_series_columns", "hour_files", "store_columns", "with_hours"]

log = logging.getLogger("metricsd.onward.parquet")

HOUR_MS = 3_600_000
_ALL = [pb.Matcher(type=pb.Matcher.RE, name="__name__", value=".+")]


# Series a read asks for: the protobuf answer of one read is what is held beside the columns
# (about 16 bytes a sample), and fewer reads mean fewer selections (a regex of pods each).
PARQUET_SERIES_PER_READ = 2_000

ReadColumns = Callable[[pb.ReadRequest], Awaitable[SampleColumns]]
"""A backend's read answered as columns (no protobuf per series): the protobuf answers are most
of an hour's cost (perf/RESULTS.md, "Sending data onward"). ``store_columns`` is one."""


class _Series(Protocol):
    @property
    def labels(self) -> Labels: ...
    @property
    def timestamps(self) -> np.ndarray: ...
    @property
    def values(self) -> np.ndarray: ...


class SampleStore(Protocol):
    """What ``store_columns`` reads: metricsd/store/engine.py's Store (onward/ lies above the store's
    layer and does not import it; ``metricsd up`` hands its store in)."""

    def read(self, matchers: Sequence[Matcher], start_ms: int, end_ms: int) -> Sequence[_Series]: ...


def store_columns(store: SampleStore) -> ReadColumns:
    """The columnar read of a store in this process: ``Store.read``'s arrays concatenated, with no
    protobuf answer and no Python list per sample (``metricsd up`` hands it to HourlyParquet)."""

    async def read(req: pb.ReadRequest) -> SampleColumns:
        got = [s for s in store.read(matchers_from_pb(req.matchers), req.start_ms, req.end_ms) if len(s.timestamps)]
        return SampleColumns([s.labels for s in got], np.fromiter((len(s.timestamps) for s in got), np.int64, len(got)),
                             np.concatenate([s.timestamps for s in got]) if got else np.zeros(0, np.int64),
                             np.concatenate([s.values for s in got]) if got else np.zeros(0, np.float64))
    return read


def from_series_columns(cols: SeriesColumns, labels_of: dict[int, Labels]) -> SampleColumns:
    """A columnar read's answer as SampleColumns: series without samples left out, labels looked
    up by id (built from the answer's label columns only for a series that was not listed)."""
    counts = cols.counts
    if len(counts) and not bool(counts.all()):
        cols = cols.take(np.flatnonzero(counts))
        counts = cols.counts
    if labels_of:
        ids = cols.ids.tolist() if cols.ids is not None else [None] * len(cols)
        labels = [(labels_of.get(i) if i is not None else None) or cols.labels.labels_at(k)
                  for k, i in enumerate(ids)]
    else:  # all from the label columns, a column at a time (labels_at costs ~10 µs a series)
        labels = cols.labels.to_list()
    return SampleColumns(labels, counts.astype(np.int64), cols.timestamps.astype(np.int64, copy=False),
                         cols.values.astype(np.float64, copy=False))


def backend_columns(backend: MetricsBackend, labels_of: dict[int, Labels]) -> ReadColumns:
    """The columnar read of any backend (rpc/columnar.py): a proxy asks its stores for SeriesBatch
    answers and merges them as arrays, so no protobuf message per series is built or decoded."""

    async def read(req: pb.ReadRequest) -> SampleColumns:
        return from_series_columns(await columnar.read_columns(backend, req), labels_of)
    return read


async def _groups(backend: MetricsBackend) -> tuple[list[list[pb.Matcher]], dict[int, Labels]]:
    """The reads that cover every series (a namespace and a regex of whole pods each, about
    PARQUET_SERIES_PER_READ series), and every series' labels, decoded once here."""
    listed = await backend.list_series(pb.ListSeriesRequest(matchers=_ALL))
    found = [(s.id, labels_from_pb(s.labels)) for s in listed.series]
    groups = [[*_ALL, pb.Matcher(type=pb.Matcher.EQ, name="namespace", value=ns),
               pb.Matcher(type=pb.Matcher.RE, name="pod", value="|".join(re_escape(p) for p in pods))]
              for ns, pods in read_batches(found, PARQUET_SERIES_PER_READ)]
    return groups, dict(found)


async def _read_hour(backend: MetricsBackend, hour_ms: int, read_columns: ReadColumns | None) -> SampleColumns:
    """The hour's samples, a group of whole pods a read either way (a columnar read too: one read
    of the whole hour would hold the event loop for seconds and the hour's arrays twice)."""
    groups, labels_of = await _groups(backend)
    read = read_columns if read_columns is not None else backend_columns(backend, labels_of)
    parts = []
    for matchers in groups:
        parts.append(await read(pb.ReadRequest(matchers=matchers, start_ms=hour_ms, end_ms=hour_ms + HOUR_MS - 1)))
        await asyncio.sleep(0)  # a store's read does not yield: let writes and queries in between groups
    return SampleColumns.concat(parts)


class HourSource(Protocol):
    """A read of a whole hour that is cheaper than a read per group of pods: a cluster's proxy
    reads each slot from one replica that its peers' digests vouch for (metricsd/proxy/hourread.py's
    HourRead, which onward/ does not import)."""

    async def read(self, start_ms: int, end_ms: int) -> tuple[SeriesColumns, RollupArrays]: ...


def with_hours(r: RollupArrays) -> RollupArrays:
    """A columnar rollups answer (rpc/rollupbatch.py) without the series that have no hours."""
    counts = r.counts
    return r.take(np.flatnonzero(counts)) if len(counts) and not bool(counts.all()) else r


async def hour_files(backend: MetricsBackend, hour_ms: int, read_columns: ReadColumns | None = None,
                     source: HourSource | None = None) -> HourFiles:
    """Both files of the hour starting at ``hour_ms``, built in memory. ``source``: a read of the
    whole hour (a cluster's proxy); else ``read_columns``, a columnar read of the backend's store
    in this process, or ``backend_columns``: the Read's columnar flag, PARQUET_SERIES_PER_READ
    series a read either way."""
    if source is not None:
        cols, arrays = await source.read(hour_ms, hour_ms + HOUR_MS - 1)
        samples, roll = from_series_columns(cols, {}), with_hours(arrays)
    else:
        samples = await _read_hour(backend, hour_ms, read_columns)
        # a store and a proxy both answer columnar rollups as a batch (rpc/rollupbatch.py);
        # rollups_from_response takes a per-series answer too (a backend without the flag)
        got = await backend.rollups(pb.ReadRequest(matchers=_ALL, start_ms=hour_ms, end_ms=hour_ms, columnar=True))
        roll = with_hours(rollups_from_response(got))
    # The encoding (seconds for 40,000 series) runs in a thread: on the event loop it held back the
    # process's requests and its election lease's keep-alive, which lapsed under load, so another
    # proxy took the lead and wrote the same hour at the same time (2026-11-27 session 34,
    # perf/bench_onward_cluster.py). NumPy and Arrow let go of the GIL for most of it.
    samples_file = await asyncio.to_thread(to_parquet, samples)
    rollups_file = await asyncio.to_thread(to_parquet, roll)
    return HourFiles(hour_ms, samples_file, rollups_file,
                     {"format": FORMAT_VERSION, "hour_start_ms": hour_ms, "samples": samples.samples,
                      "series": len(samples.labels), "rollup_series": len(roll),
                      "written_ms": int(time.time() * 1000)})


class HourlyParquet:
    """``run()`` until cancelled. ``root``: a directory or an fsspec URL. ``writer_id`` goes in each
    hour's marker (``writer``): which process wrote it."""

    def __init__(self, backend: MetricsBackend, root: str, clock: Clock, *, delay_s: float = 600.0,
                 lookback_hours: int = 24, check_s: float = 60.0, read_columns: ReadColumns | None = None,
                 writer_id: str = "", source: HourSource | None = None) -> None:
        self.backend = backend
        self.source = source
        self.writer_id = writer_id
        self.read_columns = read_columns
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
        files = await hour_files(self.backend, hour_ms, self.read_columns, self.source)
        if self.writer_id:
            files.manifest["writer"] = self.writer_id
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


class Election(Protocol):
    """What ElectedParquet needs of a leader election (metricsd/cluster/election.py's LeaderElection,
    which onward/ does not import: the cluster layer lies beside it)."""

    candidate_id: str

    @property
    def deposed(self) -> asyncio.Event: ...
    async def campaign(self) -> None: ...
    async def close(self) -> None: ...


class ElectedParquet:
    """The hourly writer of a cluster: every proxy runs one, and the one that leads the election
    (a key under an etcd lease) writes. When the leader dies its lease expires and another proxy
    takes over within the lease's TTL; its first check writes every closed hour within the
    lookback that has no marker yet, so the hours the dead leader did not write are written once,
    by the new one. A leader deposed (its lease lost: etcd unreachable for a TTL) stops writing at
    once and campaigns again. Two writers at once (a deposed leader in the middle of an hour as
    its successor starts) write the same files: each file is put whole, the marker last, so a
    reader sees one of them complete. ``run()`` until cancelled."""

    def __init__(self, writer: HourlyParquet, election: Election) -> None:
        self.writer = writer
        self.election = election
        self.terms = 0  # times this process began to lead

    async def run(self) -> None:
        try:
            while True:
                await self.election.campaign()
                self.terms += 1
                log.info("parquet: %s leads; writing the closed hours", self.election.candidate_id)
                work = asyncio.ensure_future(self.writer.run())
                lost = asyncio.ensure_future(self.election.deposed.wait())
                try:
                    await asyncio.wait([work, lost], return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for t in (work, lost):
                        t.cancel()
                    failed = await asyncio.gather(work, lost, return_exceptions=True)
                if not lost.cancelled():
                    log.warning("parquet: %s no longer leads; stopped writing", self.election.candidate_id)
                elif isinstance(failed[0], Exception):  # the writer stopped on its own (its root unreadable)
                    log.warning("parquet: %s", failed[0])
                    await asyncio.sleep(self.writer.check_s)
        finally:
            await self.election.close()
