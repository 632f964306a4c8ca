"""Capacity limits of a store: how many series it holds, and how fast a namespace may add new ones.

Pure: time is passed in (seconds on a monotonic clock, from the caller's metricsd.clock), nothing
is read from the system. Both limits refuse only writes that would create series; samples of
series the store already holds are always accepted, so a cardinality explosion in one workload
cannot stop the store from ingesting the metrics it already tracks. A batch stays all-or-nothing:
if it would create series past a limit, none of it is stored.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["BYTES_PER_SERIES", "DEFAULT_NEW_SERIES_PER_MINUTE", "MEMORY_SHARE", "MIN_DEFAULT_SERIES",
           "NewSeriesRate", "SeriesLimitExceeded", "SeriesLimits", "default_max_series", "series_limit_refusal",
           "tokens_at"]

BYTES_PER_SERIES = 24 * 1024
"""Resident bytes a series costs after a day of 10 s samples: perf/RESULTS.md measured 21,357 -
24,110 bytes of RSS per series (raw chunks, head, 8 days of hourly rollups, index, labels)."""

MEMORY_SHARE = 0.5
"""Share of the machine's memory the default series limit plans for: the rest is for queries'
temporaries, WAL and snapshot buffers, the allocator's slack."""

MIN_DEFAULT_SERIES = 10_000
"""A floor for the default, so a small container still takes a simulated cluster."""

DEFAULT_NEW_SERIES_PER_MINUTE = 100_000
"""Per namespace: a rollout of 1,000 pods with 50 series each is 50,000; an explosion (a pod or
request id in a label) is millions."""


def default_max_series(total_memory_bytes: int) -> int:
    """The default --max-series: MEMORY_SHARE of memory / BYTES_PER_SERIES, at least MIN_DEFAULT_SERIES.
    8 GiB gives 174,762 series."""
    return max(MIN_DEFAULT_SERIES, int(total_memory_bytes * MEMORY_SHARE) // BYTES_PER_SERIES)


@dataclass(frozen=True)
class SeriesLimits:
    """max_series: series the store holds at most (0: unlimited; the commands size it to the machine).
    max_new_series_per_minute: new series a namespace may create per minute (0: unlimited), a token
        bucket: up to this many at once, refilled at this many per minute."""

    max_series: int = 0
    max_new_series_per_minute: int = DEFAULT_NEW_SERIES_PER_MINUTE

    def __post_init__(self) -> None:
        if self.max_series < 0 or self.max_new_series_per_minute < 0:
            raise ValueError("series limits must be >= 0 (0: unlimited)")


class SeriesLimitExceeded(Exception):
    """A write would create series past a limit; ``reason`` names the limit (its Stats.rejected key).
    Nothing was stored."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def series_limit_refusal(held: int, new: int, max_series: int, example: str) -> str | None:
    """The message refusing ``new`` series on top of ``held`` past ``max_series``, or None."""
    if not max_series or new == 0 or held + new <= max_series:
        return None
    return (f"series limit reached: the store holds {held} series and the limit is {max_series} (--max-series); "
            f"this write would create {new} new series, e.g. {example}. Samples of existing series are still "
            "accepted")


def tokens_at(tokens: float, since_s: float, now_s: float, per_minute: int) -> float:
    """A token bucket's level at ``now_s``, last at ``tokens`` at ``since_s``: refilled at
    ``per_minute`` per minute, capped at ``per_minute``. A clock that went back refills nothing."""
    return min(float(per_minute), tokens + max(0.0, now_s - since_s) * per_minute / 60.0)


class NewSeriesRate:
    """One token bucket per namespace; a new series takes a token. Namespaces with a full bucket hold
    no state (prune() drops them), so the state is bounded by the namespaces adding series lately.
    Not safe for concurrent use."""

    def __init__(self, per_minute: int) -> None:
        self.per_minute = per_minute
        self._buckets: dict[str, tuple[float, float]] = {}  # namespace -> (tokens, at_s)

    def __len__(self) -> int:
        return len(self._buckets)

    def available(self, namespace: str, now_s: float) -> float:
        tokens, at = self._buckets.get(namespace, (float(self.per_minute), now_s))
        return tokens_at(tokens, at, now_s, self.per_minute)

    def refusal(self, wanted: Mapping[str, int], now_s: float, example: Mapping[str, str]) -> str | None:
        """The message refusing the write that creates ``wanted[ns]`` series per namespace, or None.
        ``example`` names one new series per namespace."""
        if not self.per_minute:
            return None
        for ns, n in sorted(wanted.items()):
            have = self.available(ns, now_s)
            if n > have:
                return (f"new-series rate limit: namespace {ns!r} may create {self.per_minute} new series per "
                        f"minute (--max-new-series-per-minute); this write would create {n}, e.g. {example[ns]}, "
                        f"and {int(have)} may be created now. Retry later; samples of existing series are still "
                        "accepted")
        return None

    def charge(self, wanted: Mapping[str, int], now_s: float) -> None:
        """Take the tokens of a write that refusal() let through and that was applied."""
        if not self.per_minute:
            return
        for ns, n in wanted.items():
            self._buckets[ns] = (self.available(ns, now_s) - n, now_s)

    def prune(self, now_s: float) -> None:
        """Forget namespaces whose bucket has refilled (their state equals no state)."""
        full = [ns for ns in self._buckets if self.available(ns, now_s) >= self.per_minute]
        for ns in full:
            del self._buckets[ns]
