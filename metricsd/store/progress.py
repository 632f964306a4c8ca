"""Progress lines for long loads (snapshot restore, WAL replay): percent done and rate."""

from __future__ import annotations

import logging
from collections.abc import Callable

__all__ = ["Progress"]


class Progress:
    """Logs ``what: 42% (done of total unit), rate unit/s`` at most every ``every_s`` seconds.

    The time source is passed in (a Clock's monotonic), so tests drive it by hand.
    """

    def __init__(self, what: str, unit: str, monotonic: Callable[[], float], logger: logging.Logger,
                 every_s: float = 5.0) -> None:
        self.what = what
        self.unit = unit
        self.monotonic = monotonic
        self.log = logger
        self.every_s = every_s
        self.start = monotonic()
        self._last = self.start
        self.lines = 0

    def update(self, done: int, total: int) -> None:
        now = self.monotonic()
        if now - self._last < self.every_s:
            return
        self._last = now
        pct = 100.0 * done / total if total else 100.0
        self.log.info("%s: %.0f%% (%s of %s %s), %s %s/s", self.what, pct, f"{done:,}", f"{total:,}", self.unit,
                      _rate(done, now - self.start), self.unit)
        self.lines += 1

    def finish(self, done: int, detail: str = "") -> float:
        """Log the total and return the seconds taken."""
        took = self.monotonic() - self.start
        self.log.info("%s: done, %s %s in %.2f s (%s %s/s)%s", self.what, f"{done:,}", self.unit, took,
                      _rate(done, took), self.unit, f"; {detail}" if detail else "")
        return took


def _rate(n: int, seconds: float) -> str:
    if seconds <= 0:
        return "-"
    r = n / seconds
    return f"{r / 1e6:.1f} M" if r >= 1e6 else f"{r:,.0f}"
