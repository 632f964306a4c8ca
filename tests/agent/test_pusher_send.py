"""The pusher's sending loop on a ManualClock against in-process stores: failover, order, labels."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable

import pytest

from metricsd.agent.buffer import BufferSettings, PushBuffer
from metricsd.agent.pusher import DelayHistogram, Pusher, PusherSettings
from metricsd.agent.retry import BackoffPolicy
from metricsd.clock import ManualClock
from metricsd.model import Labels, make_labels, series_id
from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc.backend import BadRequest, Unavailable
from metricsd.selector import parse_selector
from metricsd.store.api import LocalBackend, StoreAPI
from metricsd.store.engine import Store

T0 = 1_714_550_400_000
SERIES: list[Labels] = [make_labels("container_cpu_usage_seconds_total",
                                    {"namespace": "shop", "pod": f"web-{i}", "container": "app"}) for i in range(3)]


class FlakyStore(LocalBackend):
    """A store that can be down (Unavailable) or lose its memory (a restart), and records calls."""

    def __init__(self) -> None:
        self.store = Store()
        super().__init__(StoreAPI(self.store))
        self.down = False
        self.calls: list[pb.WriteRequest] = []
        self.fail_with: Exception | None = None

    def restart(self) -> None:
        self.store = Store()
        self.api = StoreAPI(self.store)

    async def write(self, request: pb.WriteRequest) -> pb.WriteResponse:
        self.calls.append(request)
        if self.down:
            raise Unavailable("Write: UNAVAILABLE: connection refused")
        if self.fail_with is not None:
            raise self.fail_with
        return await super().write(request)

    def samples(self) -> dict[str, list[tuple[int, float]]]:
        out = {}
        for s in self.store.read(parse_selector("", metric="container_cpu_usage_seconds_total"), 0, 2**62):
            out[dict(s.labels)["pod"]] = list(zip(s.timestamps.tolist(), s.values.tolist(), strict=True))
        return out


def fake_sleep(clock: ManualClock) -> Callable[[float], Awaitable[None]]:
    async def sleep(seconds: float) -> None:
        clock.advance(max(1, math.ceil(seconds * 1000)))
        await asyncio.sleep(0)

    return sleep


def make(clock: ManualClock, *stores: FlakyStore, max_bytes: int = 1 << 20) -> Pusher:
    buf = PushBuffer(BufferSettings(max_bytes=max_bytes), logger=logging.getLogger("quiet"))
    return Pusher(buf, [(f"store-{i}:7401", s) for i, s in enumerate(stores)], clock,
                  PusherSettings(backoff=BackoffPolicy(base_s=0.25, max_s=4.0, jitter=0.5)),
                  rand=lambda: 0.0, sleep=fake_sleep(clock))


def tick(p: Pusher, clock: ManualClock, k: int) -> None:
    ts = T0 + k * 10_000
    p.push_samples(ts, [(lab, float(k * 10 + i)) for i, lab in enumerate(SERIES)])


async def run_until(p: Pusher, done: Callable[[], bool], steps: int = 10_000) -> None:
    task = asyncio.create_task(p.run())
    try:
        for _ in range(steps):
            if done():
                return
            await asyncio.sleep(0)
        raise AssertionError("the pusher did not get there")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def expected(ticks: range) -> dict[str, list[tuple[int, float]]]:
    return {f"web-{i}": [(T0 + k * 10_000, float(k * 10 + i)) for k in ticks] for i in range(3)}


async def test_every_sample_arrives_in_order_and_labels_go_once() -> None:
    clock, store = ManualClock(T0), FlakyStore()
    p = make(clock, store)
    for k in range(5):
        tick(p, clock, k)
    clock.advance(150)
    await run_until(p, lambda: len(p.buffer) == 0)
    assert store.samples() == expected(range(5))
    assert [len(c.series) for c in store.calls] == [3, 0, 0, 0, 0]
    assert p.stats.sent_samples == 15 and p.stats.sent_batches == 5
    assert p.stats.delay.count == 5


async def test_failover_to_the_second_target_when_the_first_is_down() -> None:
    clock, first, second = ManualClock(T0), FlakyStore(), FlakyStore()
    first.down = True
    p = make(clock, first, second)
    for k in range(3):
        tick(p, clock, k)
    await run_until(p, lambda: len(p.buffer) == 0)
    assert second.samples() == expected(range(3))
    assert len(first.calls) == 1, "one failed attempt, then the second target at once"
    assert clock.monotonic() == 0.0, "no wait before failing over"
    assert [len(c.series) for c in second.calls] == [3, 0, 0], "a new target gets the labels"
    assert p.targets_up() == [("store-0:7401", False), ("store-1:7401", True)]
    assert p.stats.failures == {"store-0:7401": 1}


async def test_an_outage_is_waited_out_with_backoff_and_nothing_is_lost() -> None:
    clock, store = ManualClock(T0), FlakyStore()
    p = make(clock, store)
    store.down = True
    task = asyncio.create_task(p.run())
    for k in range(6):  # a minute of collection while the store is down
        tick(p, clock, k)
        for _ in range(20):
            await asyncio.sleep(0)
    assert store.samples() == {} and len(p.buffer) == 6
    store.down = False
    for _ in range(200):
        if not len(p.buffer):
            break
        await asyncio.sleep(0)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert store.samples() == expected(range(6))
    # Backoff with rand 0: 0.25, 0.5, 1, 2, 4, 4, ... seconds between attempts.
    failures = p.stats.failures["store-0:7401"]
    assert failures >= 5
    assert clock.monotonic() == pytest.approx(sum(min(4.0, 0.25 * 2**n) for n in range(failures)), abs=0.01)


async def test_a_restarted_receiver_gets_the_labels_again() -> None:
    clock, store = ManualClock(T0), FlakyStore()
    p = make(clock, store)
    tick(p, clock, 0)
    await run_until(p, lambda: len(p.buffer) == 0)
    store.restart()
    tick(p, clock, 1)
    await run_until(p, lambda: len(p.buffer) == 0)
    assert [len(c.series) for c in store.calls] == [3, 0, 3]
    assert store.samples() == expected(range(1, 2))
    assert p.stats.label_resends == 1


async def test_a_batch_the_receiver_refuses_is_dropped_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    clock, store = ManualClock(T0), FlakyStore()
    p = make(clock, store)
    store.fail_with = BadRequest("series x: timestamps within one write must strictly increase")
    tick(p, clock, 0)
    with caplog.at_level(logging.ERROR, "metricsd.agent.pusher"):
        await run_until(p, lambda: len(p.buffer) == 0)
    assert p.stats.rejected_batches == 1 and p.stats.rejected_samples == 3
    assert "strictly increase" in caplog.text
    store.fail_with = None
    tick(p, clock, 1)
    await run_until(p, lambda: len(p.buffer) == 0)
    assert store.samples() == expected(range(1, 2))


async def test_invalid_series_are_counted_and_never_sent() -> None:
    clock, store = ManualClock(T0), FlakyStore()
    p = make(clock, store)
    bad = make_labels("container_cpu_usage_seconds_total", {"namespace": "shop"})  # no pod
    n = p.push_samples(T0, [(bad, 1.0), (SERIES[0], 2.0), (bad, 3.0)])
    assert n == 1 and p.stats.invalid_samples == 2
    p.push_samples(T0 + 10_000, [(bad, 1.0)])
    assert p.stats.invalid_samples == 3
    await run_until(p, lambda: len(p.buffer) == 0)
    assert store.samples() == {"web-0": [(T0, 2.0)]}


async def test_large_passes_are_split_into_batches() -> None:
    clock, store = ManualClock(T0), FlakyStore()
    buf = PushBuffer(BufferSettings())
    p = Pusher(buf, [("s:1", store)], clock, PusherSettings(max_batch_samples=2), sleep=fake_sleep(clock))
    p.push_samples(T0, [(lab, 1.0) for lab in SERIES])
    assert len(buf) == 2
    await run_until(p, lambda: len(p.buffer) == 0)
    assert [list(c.ids) for c in store.calls] == [[series_id(SERIES[0]), series_id(SERIES[1])],
                                                  [series_id(SERIES[2])]]


async def test_collection_delay_is_measured_from_read_to_acknowledged() -> None:
    clock, store = ManualClock(T0), FlakyStore()
    p = make(clock, store)
    p.push_samples(T0, [(SERIES[0], 1.0)])
    clock.advance(40)
    await run_until(p, lambda: len(p.buffer) == 0)
    p.push_samples(T0 + 1000, [(SERIES[0], 2.0)], collected_ms=T0)
    await run_until(p, lambda: len(p.buffer) == 0)
    assert list(p.stats.delay.recent) == [0.04, 0.04]
    p.push_request(pb.WriteRequest(ids=[series_id(SERIES[1])], counts=[1], timestamps=[T0], values=[1.0]),
                   {series_id(SERIES[1]): SERIES[1]}, collected_ms=0)
    await run_until(p, lambda: len(p.buffer) == 0)
    assert p.stats.delay.count == 2, "a backfilled batch has no collection delay"


def test_delay_histogram_buckets_and_median() -> None:
    h = DelayHistogram(buckets=(0.01, 0.1, 1.0))
    for s in (0.005, 0.05, 0.05, 0.5, 5.0):
        h.observe(s)
    assert h.cumulative() == [("0.01", 1), ("0.1", 3), ("1.0", 4), ("+Inf", 5)]
    assert h.median() == 0.05 and h.count == 5 and h.sum == pytest.approx(5.605)
    assert (h.quantile(0.99), h.quantile(0.8), h.quantile(0.0)) == (5.0, 0.5, 0.005)
    assert DelayHistogram().median() is None and DelayHistogram().quantile(0.5) is None
