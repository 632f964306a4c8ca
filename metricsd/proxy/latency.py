"""Each store's recent read latency, and the hedging delay taken from it.

A read of consistency one asks a single replica and, when that one has not answered within the
delay, the next (metricsd/proxy/hedge.py), as Cassandra's speculative retry does. The delay is a
quantile (p99 by default) of the member's last ``window`` answers, clamped to [min_s, max_s]: a
member that stalls (a GC pause, a retention pass, a process stopped) costs a read about its p99
plus the next replica's answer instead of a timeout. A p90 hedged 30% of the reads of
perf/compare.py's cluster on a loaded 2-core machine (367 of 1,226: latencies come in bursts
there, and every read of a burst passed the p90), each a second store's read. Before
``min_samples`` answers the delay is ``initial_s``.

Pure: durations are passed in (measured by the caller's clock), nothing here reads a clock.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

__all__ = ["HedgeSettings", "LatencyTracker"]


@dataclass(frozen=True)
class HedgeSettings:
    """quantile: of the member's recent answer times, the hedging delay (0.99: its p99).
    window: answers remembered per member. min_samples: answers before the quantile is trusted;
    initial_s until then. min_s / max_s: bounds of the delay (a floor keeps a fast, steady member
    from being hedged on noise; a ceiling bounds what a stalled one costs)."""

    quantile: float = 0.99
    window: int = 128
    min_samples: int = 8
    initial_s: float = 0.05
    min_s: float = 0.005
    max_s: float = 0.5

    def __post_init__(self) -> None:
        if not 0.0 < self.quantile <= 1.0:
            raise ValueError(f"hedge quantile must be in (0, 1], got {self.quantile}")
        if self.window < 1 or not 1 <= self.min_samples <= self.window:
            raise ValueError("hedge window must be at least 1 and min_samples within it")
        if not 0.0 <= self.min_s <= self.max_s or self.initial_s < 0:
            raise ValueError("hedge delays must satisfy 0 <= min_s <= max_s and initial_s >= 0")


class LatencyTracker:
    """Per member, its last ``window`` answer times. Not thread-safe (one event loop); O(1) to
    record, O(window log window) to ask, once per ``window // 8`` new answers (cached between)."""

    def __init__(self, settings: HedgeSettings | None = None) -> None:
        self.settings = settings or HedgeSettings()
        self._times: dict[str, deque[float]] = {}
        self._delay: dict[str, float] = {}
        self._fresh: dict[str, int] = {}  # answers since the delay was computed

    def record(self, member: str, seconds: float) -> None:
        times = self._times.get(member)
        if times is None:
            times = self._times[member] = deque(maxlen=self.settings.window)
        times.append(seconds)
        self._fresh[member] = self._fresh.get(member, 0) + 1

    def delay(self, member: str) -> float:
        """Seconds to wait for ``member`` before hedging a read to the next replica."""
        s = self.settings
        times = self._times.get(member)
        if times is None or len(times) < s.min_samples:
            return min(max(s.initial_s, s.min_s), s.max_s)
        cached = self._delay.get(member)
        if cached is not None and self._fresh.get(member, 0) < max(1, s.window // 8):
            return cached
        ordered = sorted(times)
        q = ordered[min(len(ordered) - 1, int(s.quantile * len(ordered)))]
        out = self._delay[member] = min(max(q, s.min_s), s.max_s)
        self._fresh[member] = 0
        return out

    def forget(self, members: list[str]) -> None:
        """Members that left the map."""
        for m in members:
            self._times.pop(m, None)
            self._delay.pop(m, None)
            self._fresh.pop(m, None)
