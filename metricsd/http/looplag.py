"""How late the event loop runs: the measure of "no request stalls the server".

A task sleeps ``interval_s`` again and again and records how much later than asked it woke up;
anything that holds the loop (a handler computing on it, a C call holding the GIL) shows up as lag.
``metricsd_event_loop_lag_seconds`` in /metrics is the largest lag of the last ``window_s``;
``metricsd_event_loop_stalls`` counts wake-ups more than 100 ms late.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

__all__ = ["LagWindow", "run_lag_monitor"]

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
        while self._seen[0][0] < now - self.window_s:
            self._seen.popleft()
        return self._seen[0][1]


async def run_lag_monitor(report: Callable[[float, bool], None], interval_s: float = 0.05,
                          window_s: float = 10.0) -> None:
    """Until cancelled: ``report(window maximum, stalled)`` after every wake-up."""
    loop = asyncio.get_running_loop()
    window = LagWindow(window_s)
    while True:
        t0 = loop.time()
        await asyncio.sleep(interval_s)
        now = loop.time()
        lag = max(0.0, now - t0 - interval_s)
        report(window.observe(now, lag), lag > STALL_S)
