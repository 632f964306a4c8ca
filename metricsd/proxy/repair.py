"""Read repair: when replicas answer a read differently, copy to the lagging one what it misses.

Reads find the differences (reads.py); this module rate-limits and runs the copies in the
background, so a query never waits for a repair. Two kinds of job:

- a raw Read already holds the union of the replicas' samples, so the samples a replica lacked
  are written to it directly (:func:`missing_samples`);
- an Aggregate only says which series a replica had fewer samples of, so their raw samples are
  read from a replica that had more, over the query's window, and written to the lagging one
  (:meth:`ReadRepair.copy`).

The writes carry labels (the lagging replica may not know the series) and are idempotent: samples
the replica already holds are counted by the store as duplicates.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Collection, Sequence

import numpy as np

from metricsd.clock import Clock
from metricsd.proto import metricsd_pb2 as pb
from metricsd.proxy.settings import RepairSettings

__all__ = ["ReadRepair", "missing_samples"]

log = logging.getLogger("metricsd.proxy.repair")

ReadFn = Callable[[str, pb.ReadRequest], Awaitable[pb.ReadResponse]]
WriteFn = Callable[[str, pb.WriteRequest], Awaitable[pb.WriteResponse]]


def missing_samples(out: pb.WriteRequest, data: pb.SeriesData, have: np.ndarray | None,
                    ts: np.ndarray, vals: np.ndarray) -> int:
    """Append to ``out`` the samples of series ``data`` (merged ``ts``/``vals``) whose timestamps
    are not in ``have`` (None: the replica lacks the whole series). Returns samples added."""
    keep = np.ones(len(ts), dtype=bool) if have is None else ~np.isin(ts, have)
    n = int(keep.sum())
    if n == 0:
        return 0
    out.ids.append(data.id)
    out.counts.append(n)
    out.timestamps.extend(ts[keep].tolist())
    out.values.extend(vals[keep].tolist())
    out.series.add(id=data.id).labels.extend(data.labels)
    return n


class ReadRepair:
    """Runs repair jobs in the background under a token bucket and a concurrency cap.

    Counters: repair_jobs, repair_skipped (rate or cap), repair_failed, repair_samples (written).
    Not thread-safe (one event loop).
    """

    def __init__(self, settings: RepairSettings, clock: Clock, read: ReadFn, write: WriteFn,
                 counters: Counter[str]) -> None:
        self.settings = settings
        self._clock = clock
        self._read = read
        self._write = write
        self._counters = counters
        self._tokens = float(settings.burst)
        self._last = clock.monotonic()
        self._tasks: set[asyncio.Task[None]] = set()

    def _allow(self) -> bool:
        if not self.settings.enabled:
            return False
        now = self._clock.monotonic()
        self._tokens = min(float(self.settings.burst), self._tokens + (now - self._last) * self.settings.rate_per_s)
        self._last = now
        if self._tokens < 1.0 or len(self._tasks) >= self.settings.max_concurrent:
            self._counters["repair_skipped"] += 1
            return False
        self._tokens -= 1.0
        return True

    def _spawn(self, job: Callable[[], Awaitable[None]], what: str) -> bool:
        if not self._allow():
            return False
        self._counters["repair_jobs"] += 1

        async def run() -> None:
            try:
                await job()
            except asyncio.CancelledError:
                raise
            except Exception as e:
                self._counters["repair_failed"] += 1
                log.info("read repair of %s failed: %s", what, e)

        task = asyncio.get_running_loop().create_task(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return True

    def write(self, member: str, request: pb.WriteRequest) -> bool:
        """Write samples a replica lacked (built with :func:`missing_samples`)."""
        if not request.ids:
            return False

        async def job() -> None:
            resp = await self._write(member, request)
            self._counters["repair_samples"] += resp.samples_written

        return self._spawn(job, f"{len(request.ids)} series on {member}")

    def copy(self, lagging: str, source: str, reads: Sequence[pb.ReadRequest], ids: Collection[int]) -> bool:
        """Copy series ``ids`` from ``source`` to ``lagging``: each of ``reads`` (the query's
        selectors over its window, restricted to the slots concerned) is read from the source and
        the series in ``ids`` written to the lagging replica."""
        wanted = set(list(ids)[: self.settings.max_series])
        if not wanted:
            return False

        async def job() -> None:
            out = pb.WriteRequest()
            seen: set[int] = set()
            for req in reads:
                resp = await self._read(source, req)
                for s in resp.series:
                    if s.id in wanted and s.id not in seen and len(s.timestamps):
                        seen.add(s.id)
                        missing_samples(out, s, None, np.array(s.timestamps, dtype=np.int64),
                                        np.array(s.values, dtype=np.float64))
            if out.ids:
                resp_w = await self._write(lagging, out)
                self._counters["repair_samples"] += resp_w.samples_written

        return self._spawn(job, f"{len(wanted)} series from {source} to {lagging}")

    def running(self) -> int:
        return len(self._tasks)

    async def wait_idle(self) -> None:
        """Wait for the running jobs (tests, orderly shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def close(self) -> None:
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
