"""The agent's producing loops: a collection pass every interval, or the simulator's ticks.

Both hand their samples to the same Pusher, so a simulated agent loads data exactly the way a
real one does. Time comes in (``clock``, ``sleep``): tests run many intervals on a ManualClock.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

from metricsd.agent.batches import write_requests
from metricsd.agent.collect import Collector
from metricsd.agent.pods import PodIndex, PodListError, fetch_pod_list, load_pod_list
from metricsd.agent.pusher import Pusher
from metricsd.agent.simulate import Simulator
from metricsd.agent.telemetry import LoopStats
from metricsd.clock import Clock
from metricsd.model import Labels

__all__ = ["PodSource", "collection_loop", "simulate_loop"]

log = logging.getLogger("metricsd.agent")

Sleep = Callable[[float], Awaitable[None]]


class PodSource:
    """Pod metadata for the collector: a PodList JSON file (re-read when it changes), the
    kubelet's /pods over HTTPS, or nothing (the collector then reports the node only).

    ``get`` never raises: a failed read returns None, which tells the collector to keep using the
    last list it had; failures are counted and logged when the reason changes."""

    def __init__(
        self,
        pods_file: Path | None = None,
        kubelet_url: str | None = None,
        token_file: Path | None = None,
        ca_file: Path | None = None,
        insecure_skip_verify: bool = False,
    ) -> None:
        self.pods_file = pods_file
        self.kubelet_url = kubelet_url
        self.token_file = token_file
        self.ca_file = ca_file
        self.insecure_skip_verify = insecure_skip_verify
        self.errors = 0
        self._file_key: tuple[int, int] | None = None
        self._cached: PodIndex | None = None
        self._last_error = ""

    @property
    def configured(self) -> bool:
        return self.pods_file is not None or self.kubelet_url is not None

    def describe(self) -> str:
        if self.pods_file is not None:
            return f"pod list file {self.pods_file}"
        if self.kubelet_url is not None:
            return f"kubelet {self.kubelet_url}"
        return "no pod list (neither --pods-file nor --kubelet-url given)"

    async def get(self) -> PodIndex | None:
        try:
            if self.pods_file is not None:
                index = await asyncio.to_thread(self._read_file, self.pods_file)
            elif self.kubelet_url is not None:
                index = await fetch_pod_list(self.kubelet_url, self.token_file, self.ca_file,
                                             insecure_skip_verify=self.insecure_skip_verify)
            else:
                return None
        except PodListError as e:
            self.errors += 1
            if str(e) != self._last_error:
                log.warning("pod list unavailable, reusing the last one: %s", e)
                self._last_error = str(e)
            return None
        if self._last_error:
            log.info("pod list available again from %s (%d pods)", self.describe(), len(index))
            self._last_error = ""
        return index

    def _read_file(self, path: Path) -> PodIndex:
        try:
            st = path.stat()
        except OSError as e:
            raise PodListError(f"cannot read pod list {path}: {e.strerror or e}") from e
        key = (st.st_mtime_ns, st.st_size)
        if key != self._file_key or self._cached is None:
            self._cached = load_pod_list(path)
            self._file_key = key
        return self._cached


async def collection_loop(
    collector: Collector,
    pods: PodSource,
    pusher: Pusher,
    stats: LoopStats,
    clock: Clock,
    sleep: Sleep,
    max_passes: int | None = None,
) -> None:
    """A pass right away, then one every ``stats.interval_ms``; a pass that runs late skips the
    ticks it missed rather than bunching passes together. Every sample of a pass carries the
    time the pass started reading, which is also the start of its collection delay."""
    interval = stats.interval_ms
    next_ms = clock.now_ms()
    while max_passes is None or stats.passes < max_passes:
        wait_ms = next_ms - clock.now_ms()
        if wait_ms > 0:
            await sleep(wait_ms / 1000.0)
        read_ms = clock.now_ms()
        t0 = clock.monotonic()
        index = await pods.get()
        stats.pod_list_errors = pods.errors
        collection = await asyncio.to_thread(collector.collect, read_ms, index)
        pusher.push_samples(read_ms, collection.samples, collected_ms=read_ms)
        took = clock.monotonic() - t0
        st = collection.status
        stats.passes += 1
        stats.last_pass_ms = clock.now_ms()
        stats.last_pass_seconds = took
        stats.pass_seconds_total += took
        stats.state, stats.message = st.state, st.message
        next_ms += interval
        now = clock.now_ms()
        if next_ms <= now:
            missed = (now - next_ms) // interval + 1
            next_ms += missed * interval
            stats.missed_ticks += missed
            log.warning("collection pass took %.2f s: skipped %d tick(s) of %d ms", took, missed, interval)


async def simulate_loop(
    sim: Simulator,
    pusher: Pusher,
    stats: LoopStats,
    clock: Clock,
    sleep: Sleep,
    *,
    backfill: bool = False,
    max_batch_samples: int = 20_000,
    high_water_bytes: int = 8 << 20,
    block_ticks: int = 60,
    max_ticks: int | None = None,
) -> None:
    """Push the simulator's ticks. With ``backfill`` the ticks up to now go as fast as the
    targets take them (in blocks of ``block_ticks``, waiting whenever the buffer holds more than
    ``high_water_bytes`` rather than dropping), then the ticks follow in real time."""
    labels_of: dict[int, Labels] = dict(zip(sim.series_ids.tolist(), sim.series, strict=True))

    def push(ts: object, values: object, collected_ms: int) -> list[int]:
        reqs = write_requests(sim, ts, values, max_samples=max_batch_samples, send_labels_for=())  # type: ignore[arg-type]
        for req in reqs:
            pusher.push_request(req, {sid: labels_of[sid] for sid in req.ids}, collected_ms)
        return [len(r.values) for r in reqs]

    ticks = 0
    if backfill:
        pushed = 0
        t0 = clock.monotonic()
        while sim.next_timestamp_ms <= clock.now_ms() and (max_ticks is None or ticks < max_ticks):
            n = (clock.now_ms() - sim.next_timestamp_ms) // sim.config.interval_ms + 1
            n = min(block_ticks, n, max_ticks - ticks if max_ticks is not None else n)
            stamps, block = sim.block(int(n))
            for size in push(stamps, block, 0):
                pushed += size
                await pusher.wait_below(high_water_bytes)
            ticks += int(n)
            stats.last_pass_ms = clock.now_ms()  # progress, for /healthz during a long backfill
        stats.extra["backfill"] = f"{ticks} ticks, {pushed} samples queued in {clock.monotonic() - t0:.1f} s"
        log.info("backfill: %s", stats.extra["backfill"])
    while max_ticks is None or ticks < max_ticks:
        wait_ms = sim.next_timestamp_ms - clock.now_ms()
        if wait_ms > 0:
            await sleep(wait_ms / 1000.0)
        ts, values = sim.next_tick()
        push(ts, values, ts)
        ticks += 1
        stats.passes += 1
        stats.last_pass_ms = clock.now_ms()
        stats.state, stats.message = "ok", f"simulating {len(sim.series)} series"
