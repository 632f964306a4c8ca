"""How late the event loop runs: the measure of "no request stalls the server".

A callback, a timer or a socket that becomes ready while the loop runs a turn waits until that turn
ends: the lag of the loop is the length of its turns. On asyncio's own (selector) loop,
:func:`install` wraps the loop's selector so that every ``select()`` measures the turn that
preceded it, the time since the previous ``select()`` returned: two clock reads a turn, no timer,
nothing at all while the loop sleeps. A 50 ms timer whose lateness was the measure (``interval_s``
below, still what a loop without a selector, uvloop, gets) woke an idle process 20 times a second,
3.7 of the 4.2 ms of CPU a second an idle cluster proxy spent (perf/RESULTS.md, "Session 42,
s42-24i"), and saw a stall only when it fell due inside it; the turn's length sees every one.

``metricsd_event_loop_lag_seconds`` in /metrics is the longest turn (or timer lateness) of the last
``window_s``, read when scraped, turns under ``floor_s`` (1 ms) left out as 0;
``metricsd_event_loop_stalls`` counts turns (wake-ups) longer (later) than 100 ms.
"""

from __future__ import annotations

import asyncio
import selectors
import time
from collections import deque
from collections.abc import Callable

from prometheus_client import Counter, Gauge

__all__ = ["STALL_S", "LagWindow", "LoopLag", "TurnTimer", "attach", "install", "run_lag_monitor", "watch_loop"]

STALL_S = 0.1


class LagWindow:
    """The largest lag seen in the last ``window_s`` (pure: times are passed in)."""

    def __init__(self, window_s: float = 10.0) -> None:
        self.window_s = window_s
        self._seen: deque[tuple[float, float]] = deque()  # (time, lag), lags decreasing

    def observe(self, now: float, lag: float) -> float:
        """Record ``lag`` at ``now``; returns the window's maximum. Amortised O(1)."""
        while self._seen and self._seen[-1][1] <= lag:
            self._seen.pop()
        self._seen.append((now, lag))
        return self.peek(now)

    def peek(self, now: float) -> float:
        """The window's maximum at ``now`` without a new lag (0.0 when none is left in it)."""
        while self._seen and self._seen[0][0] < now - self.window_s:
            self._seen.popleft()
        return self._seen[0][1] if self._seen else 0.0


class LoopLag:
    """The lags one loop went through: the window's largest (``largest()``, what the gauge reads
    when scraped, so that it falls back to 0 while the loop sleeps) and the stalls, each also
    reported to ``on_stall``. Turns shorter than ``floor_s`` are not recorded."""

    def __init__(self, window_s: float = 10.0, floor_s: float = 0.001, on_stall: Callable[[], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.window = LagWindow(window_s)
        self.floor_s = floor_s
        self.stalls = 0
        self.on_stall = on_stall
        self.clock = clock

    def observe(self, lag: float, now: float | None = None) -> None:
        if lag < self.floor_s:
            return
        self.window.observe(self.clock() if now is None else now, lag)
        if lag > STALL_S:
            self.stalls += 1
            if self.on_stall is not None:
                self.on_stall()

    def largest(self) -> float:
        return self.window.peek(self.clock())


class TurnTimer:
    """A selector that times the loop's turns: ``select()`` hands ``lag`` the time since the last
    ``select()`` returned (the turn that ran in between), when it is at least the floor, then
    selects. Every other method is the wrapped selector's own (bound once: no lookup a call)."""

    __slots__ = ("_clock", "_floor", "_select", "close", "get_key", "get_map", "inner", "lag", "modify", "register",
                 "unregister", "woke")

    def __init__(self, inner: selectors.BaseSelector, lag: LoopLag) -> None:
        self.inner = inner
        self.lag = lag
        self._clock = lag.clock
        self._floor = lag.floor_s
        self._select = inner.select
        self.register = inner.register
        self.unregister = inner.unregister
        self.modify = inner.modify
        self.get_key = inner.get_key
        self.get_map = inner.get_map
        self.close = inner.close
        self.woke = self._clock()

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        now = self._clock()
        if now - self.woke >= self._floor:
            self.lag.observe(now - self.woke, now)
        ready = self._select(timeout)
        self.woke = self._clock()
        return ready


def install(loop: asyncio.AbstractEventLoop, lag: LoopLag) -> Callable[[], None] | None:
    """Time ``loop``'s turns into ``lag`` (:class:`TurnTimer` in place of its selector); returns
    the function that puts the selector back, or None when ``loop`` has no selector to wrap (uvloop)."""
    inner = getattr(loop, "_selector", None)
    if not isinstance(inner, selectors.BaseSelector):
        return None
    timer = TurnTimer(inner, lag)
    loop._selector = timer  # type: ignore[attr-defined]

    def uninstall() -> None:
        if getattr(loop, "_selector", None) is timer:
            loop._selector = inner  # type: ignore[attr-defined]

    return uninstall


async def run_lag_monitor(lag: LoopLag, interval_s: float = 0.05) -> None:
    """Until cancelled: sleep ``interval_s`` again and again and record how late each wake-up came
    (the measure for a loop :func:`install` cannot time)."""
    loop = asyncio.get_running_loop()
    while True:
        t0 = loop.time()
        await asyncio.sleep(interval_s)
        now = loop.time()
        lag.observe(max(0.0, now - t0 - interval_s))


async def watch_loop(lag: LoopLag, interval_s: float = 0.05) -> None:
    """Until cancelled: time the running loop's turns into ``lag`` (then put its selector back),
    or, on a loop without a selector, run the timer of :func:`run_lag_monitor`."""
    uninstall = install(asyncio.get_running_loop(), lag)
    if uninstall is None:
        await run_lag_monitor(lag, interval_s)
        return
    try:
        await asyncio.Event().wait()
    finally:
        uninstall()


def attach(gauge: Gauge, counter: Counter, window_s: float = 10.0) -> LoopLag:
    """A LoopLag whose largest lag ``gauge`` reads when collected and whose stalls ``counter`` counts."""
    lag = LoopLag(window_s, on_stall=counter.inc)
    gauge.set_function(lag.largest)
    return lag
