"""Time is passed in, never read from a global: tests move a ManualClock instead of sleeping."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now_ms(self) -> int:
        """Milliseconds since the Unix epoch."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back, for durations and deadlines."""
        ...


class SystemClock:
    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic(self) -> float:
        return time.monotonic()


class ManualClock:
    """A clock that moves only when told to. Not safe to share across threads."""

    def __init__(self, now_ms: int = 0) -> None:
        self._now_ms = now_ms
        self._mono = 0.0

    def now_ms(self) -> int:
        return self._now_ms

    def monotonic(self) -> float:
        return self._mono

    def advance(self, ms: int) -> None:
        if ms < 0:
            raise ValueError("a clock does not go back")
        self._now_ms += ms
        self._mono += ms / 1000.0

    def set(self, now_ms: int) -> None:
        self.advance(now_ms - self._now_ms)
