"""The event loop's lag (metricsd/http/looplag.py): every turn of asyncio's loop timed through its
selector, nothing woken while the loop sleeps; a timer on a loop without a selector (uvloop)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge

from metricsd.http.looplag import LoopLag, TurnTimer, attach, install, watch_loop


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class _Counting:
    """A selector that counts its selects and is otherwise the one it wraps."""

    def __init__(self, inner: object) -> None:
        self.inner = inner
        self.calls = 0

    def select(self, timeout: float | None = None) -> object:
        self.calls += 1
        return self.inner.select(timeout)  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


async def _selects_during(seconds: float) -> int:
    """How many times the running loop selected while it slept ``seconds`` with nothing to do."""
    loop = asyncio.get_running_loop()
    counting = _Counting(loop._selector)  # type: ignore[attr-defined]
    loop._selector = counting  # type: ignore[attr-defined]
    try:
        await asyncio.sleep(seconds)
    finally:
        loop._selector = counting.inner  # type: ignore[attr-defined]
    return counting.calls


@pytest.fixture
async def watched() -> AsyncIterator[LoopLag]:
    """The running loop's turns timed into a LoopLag for the test's length."""
    lag = LoopLag()
    task = asyncio.create_task(watch_loop(lag))
    await asyncio.sleep(0.01)  # installed
    yield lag
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_a_long_turn_is_a_stall_and_the_largest_lag(watched: LoopLag) -> None:
    asyncio.get_running_loop().call_soon(time.sleep, 0.15)  # holds the loop for one turn
    await asyncio.sleep(0.05)
    assert watched.stalls == 1
    assert 0.15 <= watched.largest() < 1.0


async def test_short_turns_are_not_stalls(watched: LoopLag) -> None:
    for _ in range(5):
        asyncio.get_running_loop().call_soon(time.sleep, 0.005)
        await asyncio.sleep(0.01)
    assert watched.stalls == 0
    assert 0.005 <= watched.largest() < 0.1


async def test_an_idle_loop_is_not_woken_to_measure_it(watched: LoopLag) -> None:
    """The measure costs nothing while the loop sleeps: a 50 ms timer would select ten times in
    half a second, the turn timer adds no select at all."""
    assert isinstance(asyncio.get_running_loop()._selector, TurnTimer)  # type: ignore[attr-defined]
    assert await _selects_during(0.5) <= 3


async def test_the_selector_is_put_back_when_the_watch_stops() -> None:
    loop = asyncio.get_running_loop()
    before = loop._selector  # type: ignore[attr-defined]
    task = asyncio.create_task(watch_loop(LoopLag()))
    await asyncio.sleep(0.01)
    assert loop._selector is not before  # type: ignore[attr-defined]
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert loop._selector is before  # type: ignore[attr-defined]


def test_a_loop_without_a_selector_gets_the_timer_and_its_lateness() -> None:
    uvloop = pytest.importorskip("uvloop")

    async def main() -> LoopLag:
        lag = LoopLag()
        assert install(asyncio.get_running_loop(), lag) is None
        task = asyncio.create_task(watch_loop(lag, interval_s=0.02))
        await asyncio.sleep(0.05)
        asyncio.get_running_loop().call_soon(time.sleep, 0.15)
        await asyncio.sleep(0.1)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return lag

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        lag = runner.run(main())
    assert lag.stalls == 1
    assert lag.largest() >= 0.1


def test_the_largest_lag_leaves_the_window_while_nothing_happens() -> None:
    clock = Clock()
    lag = LoopLag(window_s=10.0, clock=clock)
    lag.observe(0.2)
    assert lag.largest() == 0.2
    clock.now += 9.0
    assert lag.largest() == 0.2
    clock.now += 2.0  # no turn since: the gauge still falls back
    assert lag.largest() == 0.0


def test_turns_under_the_floor_are_not_recorded() -> None:
    lag = LoopLag(floor_s=0.001, clock=Clock())
    lag.observe(0.0009)
    assert lag.largest() == 0.0 and lag.stalls == 0
    lag.observe(0.002)
    assert lag.largest() == 0.002


def test_the_gauge_reads_the_window_and_the_counter_counts_stalls() -> None:
    registry = CollectorRegistry()
    gauge = Gauge("lag_seconds", "lag", registry=registry)
    stalls = Counter("stalls", "stalls", registry=registry)
    lag = attach(gauge, stalls)
    lag.observe(0.25)
    lag.observe(0.05)
    assert registry.get_sample_value("lag_seconds") == 0.25
    assert registry.get_sample_value("stalls_total") == 1.0
